"""Ours against nats-streaming-server with the same Node client, in alternated pairs: the figures
issue 46 sets targets for, steadier than the one pair each of publish.py and consume.py. The floor
(`bench/stan_floor.py`: the least a STAN server on Trio does per message) runs in the same rounds.

    python bench/stan_pairs.py [--quick] [--json] [--pairs N]

Workloads (`bench/node/clients.js`, node-nats-streaming 0.3.2 against both; `npm ci --prefix
bench/node` first): a pipelined publish of 50,000 x 128 B, then consumes with an ack per message
(MaxInflight 1024): 50,000 by one subscriber, 10,000 by each of ten, 50,000 by a queue group of four
(quick: a fifth of each). A round runs ours, nats-streaming-server (`STAN_SERVER`, else
../shared/peers; its FILE store at its defaults) and the floor one after the other, each on a fresh
server; who goes first rotates. Per workload: medians of msgs/s, server CPU per message and the client's
main-thread busy share, the client's CPU per message (busy share / rate: what this client spends on
each message against that server), and the pair ratios ours / it of rate and of server CPU.

JSON keys: `<workload>_<system>_msgs_per_s`, `_server_us_per_msg`, `_client_busy`,
`_client_us_per_msg`, `_client_reads` and `_client_read_p50_bytes` (the reads of the client's
sockets and their median size: how each server's writes reach it); `<workload>_ratio` and
`<workload>_cpu_ratio` (medians of the pairs'; targets >= 1.5 and <= 1.0), with every pair's in
`<workload>_ratios` and `<workload>_cpu_ratios`; `pairs`. The floor's keys are `<workload>_floor_*`
as above, `<workload>_floor_cpu_ratio` (floor / nats-streaming-server: the least any server written
like ours could reach against the CPU target) and `<workload>_cpu_vs_floor` (ours / floor: what the
durable store, the engine and the doors cost on top), medians of the rounds', each round's in
`<workload>_floor_cpu_ratios` and `<workload>_cpu_vs_floor_ratios`.
node-nats-streaming runs on one thread: when `client_busy` is near 1.0 against both, the client is
the limit and the rate ratio says nothing of the servers.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.consume import CASES, expected  # noqa: E402
from bench.node_clients import NodeRun, run_node  # noqa: E402
from bench.report import arguments, machine, print_report, progress  # noqa: E402

# Messages in the channel per consume case (consume.py's cases; ten subscribers read each ten times).
CONSUMED = {"1sub": 50_000, "10subs": 10_000, "queue4": 50_000}
_SYSTEMS = ("ours", "stan", "floor")
# name: (clients.js workload, messages, subscribers, queue group, messages the CPU is divided by)
WORKLOADS: dict[str, tuple[str, int, int, bool, int]] = {
    "publish": ("publish", 50_000, 1, False, 50_000),
    **{case: ("consume", n, *CASES[case], expected(case, n)) for case, n in CONSUMED.items()},
}


def main() -> None:
    parser = arguments(__doc__, quick="a fifth of the messages, 3 pairs")
    parser.add_argument("--pairs", type=int, help="pairs per workload (default 5; quick 3)")
    args = parser.parse_args()
    if peers.stan_binary() is None:
        raise SystemExit("nats-streaming-server not found: set STAN_SERVER")
    console = Console(stderr=args.json)
    pairs = args.pairs or (3 if args.quick else 5)
    scale = 5 if args.quick else 1
    result: dict[str, Any] = {"machine": machine(), "pairs": pairs, "scale": "quick" if args.quick else "full"}
    rows: list[tuple[str, str, str]] = []
    with progress(console) as bar:
        task = bar.add_task("pairs", total=len(WORKLOADS) * pairs * len(_SYSTEMS))
        for name, (workload, messages, subscribers, queue, count) in WORKLOADS.items():
            runs: dict[str, list[NodeRun]] = {system: [] for system in _SYSTEMS}
            for pair in range(pairs):
                for system in _SYSTEMS[pair % 3 :] + _SYSTEMS[: pair % 3]:
                    bar.update(task, description=f"{name}: {system}")
                    run = run_node(system, workload, messages // scale, subscribers, queue, count // scale)
                    runs[system].append(run)
                    bar.advance(task)
            for system, done in runs.items():
                key = f"{name}_{system}"
                result[f"{key}_msgs_per_s"] = round(statistics.median(r.msgs_per_s for r in done))
                result[f"{key}_server_us_per_msg"] = round(statistics.median(r.server_us_per_msg for r in done), 2)
                result[f"{key}_client_busy"] = round(statistics.median(r.client_busy for r in done), 3)
                client_us = statistics.median(r.client_busy / r.msgs_per_s * 1e6 for r in done)
                result[f"{key}_client_us_per_msg"] = round(client_us, 2)
                result[f"{key}_client_reads"] = round(statistics.median(r.reads for r in done))
                result[f"{key}_client_read_p50_bytes"] = round(statistics.median(r.read_p50_bytes for r in done))
            pairs_of = list(zip(runs["ours"], runs["stan"], strict=True))
            ratios = [round(o.msgs_per_s / t.msgs_per_s, 3) for o, t in pairs_of]
            cpu = [round(o.server_us_per_msg / t.server_us_per_msg, 3) for o, t in pairs_of if t.server_us_per_msg]
            result[f"{name}_ratios"], result[f"{name}_cpu_ratios"] = ratios, cpu
            result[f"{name}_ratio"] = statistics.median(ratios)
            result[f"{name}_cpu_ratio"] = statistics.median(cpu) if cpu else None
            floor = list(zip(runs["ours"], runs["stan"], runs["floor"], strict=True))
            under = [round(f.server_us_per_msg / t.server_us_per_msg, 3) for _, t, f in floor if t.server_us_per_msg]
            over = [round(o.server_us_per_msg / f.server_us_per_msg, 3) for o, _, f in floor if f.server_us_per_msg]
            result[f"{name}_floor_cpu_ratios"], result[f"{name}_cpu_vs_floor_ratios"] = under, over
            result[f"{name}_floor_cpu_ratio"] = statistics.median(under) if under else None
            result[f"{name}_cpu_vs_floor"] = statistics.median(over) if over else None
            ours, stan = f"{name}_ours", f"{name}_stan"
            rates = f"{result[f'{ours}_msgs_per_s']:,} / {result[f'{stan}_msgs_per_s']:,}"
            rates += f" = {result[f'{name}_ratio']:.2f}"
            rows.append((f"{name}: ours / nats-streaming-server, msgs/s", rates, ">= 1.5"))
            rows.append(
                (
                    f"  server CPU per message, µs (ours / it = {result[f'{name}_cpu_ratio']})",
                    f"{result[f'{ours}_server_us_per_msg']} / {result[f'{stan}_server_us_per_msg']}",
                    "<= 1.0",
                )
            )
            rows.append(
                (
                    f"  the floor: msgs/s; server CPU per message, µs (floor / it = "
                    f"{result[f'{name}_floor_cpu_ratio']}; ours / floor = {result[f'{name}_cpu_vs_floor']})",
                    f"{result[f'{name}_floor_msgs_per_s']:,}; {result[f'{name}_floor_server_us_per_msg']}",
                    "",
                )
            )
            reads = f"{result[f'{ours}_client_reads']:,} of {result[f'{ours}_client_read_p50_bytes']:,} B / "
            reads += f"{result[f'{stan}_client_reads']:,} of {result[f'{stan}_client_read_p50_bytes']:,} B"
            rows.append(("  client's reads, median size", reads, ""))
            rows.append(
                (
                    "  client busy; its CPU per message, µs",
                    f"{result[f'{ours}_client_busy']:.2f}, {result[f'{ours}_client_us_per_msg']} / "
                    f"{result[f'{stan}_client_busy']:.2f}, {result[f'{stan}_client_us_per_msg']}",
                    "",
                )
            )
    print_report(console, f"ours against nats-streaming-server, {pairs} pairs", rows, result, args.json)


if __name__ == "__main__":
    main()
