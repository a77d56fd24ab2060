"""What the delivery event log costs: our server with and without `--event_log`, same run, same machine.

    python bench/event_log.py [--quick] [--json]

Each round starts `python -m streaming` (LMDB in a temp dir) twice, log off then on, and drives it with
our client as `bench/wire.py` does: pipelined publishes (each confirmed by its PubAck) and a push
subscription acking every message (MaxInflight 1024). With the log on, every publish, delivery and ack
becomes a line on disk. Figures are medians over the rounds; `*_ratio_with_log` = on / off (target:
>= 0.85, i.e. at most 15% off).

With `--clients node` (or `both`) the consume also runs with the Node client (node-nats-streaming,
`bench/node`), whose server is the bottleneck, in four setups per round: plain, `-m` (the monitoring
port: Prometheus metrics), `--event_log`, and both. `node_consume_ratio_observed` = both / plain
(target >= 0.9: metrics and the event log nearly free), with the server's CPU µs per message of each.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.node_clients import run_node  # noqa: E402
from bench.report import arguments, print_report  # noqa: E402
from bench.wire import ours  # noqa: E402


def run(n_async: int, n_consume: int, event_log: bool) -> tuple[dict[str, float], int]:
    data = Path(tempfile.mkdtemp(prefix="bench-evlog-"))
    try:
        with peers.ours(*(["--event_log", str(data / "events")] if event_log else []), data=data, keep=True) as server:
            figures = trio.run(ours, server.port, n_async, 1, n_consume)
        return figures, sum(1 for _ in peers.read_events(data / "events"))
    finally:
        shutil.rmtree(data, ignore_errors=True)


NODE_SETUPS = {
    "plain": [],
    "metrics": ["-m", "-1"],
    "log": ["--event_log", "{events}"],
    "observed": ["-m", "-1", "--event_log", "{events}"],
}


def node_consume(flags: list[str], messages: int) -> tuple[float, float]:
    """Node-client consume (one subscriber, an ack per message) against ours with `flags`."""
    data = Path(tempfile.mkdtemp(prefix="bench-evlog-"))
    try:
        flags = [f.replace("{events}", str(data / "events")) for f in flags]
        run = run_node("ours", "consume", messages, 1, False, messages, ours_flags=flags)
        return run.msgs_per_s, run.server_us_per_msg
    finally:
        shutil.rmtree(data, ignore_errors=True)


def node_rounds(messages: int, rounds: int, console: Console) -> tuple[dict[str, object], list[tuple[str, str, str]]]:
    rates: dict[str, list[float]] = {k: [] for k in NODE_SETUPS}
    cpu: dict[str, list[float]] = {k: [] for k in NODE_SETUPS}
    for i in range(rounds):
        console.print(f"node round {i + 1}/{rounds}: {', '.join(NODE_SETUPS)} ...")
        for name, flags in NODE_SETUPS.items():
            rate, us = node_consume(flags, messages)
            rates[name].append(rate)
            cpu[name].append(us)
    result: dict[str, object] = {}
    rows = []
    plain = statistics.median(rates["plain"])
    for name in NODE_SETUPS:
        rate, us = statistics.median(rates[name]), statistics.median(cpu[name])
        result[f"node_consume_{name}_msgs_per_s"] = round(rate)
        result[f"node_consume_{name}_server_us_per_msg"] = round(us, 2)
        if name != "plain":
            result[f"node_consume_ratio_{name}"] = round(rate / plain, 3)
        target = ">= 0.9" if name == "observed" else ""
        rows.append((f"node consume, {name}", f"{rate:,.0f} ({us:.2f} µs server CPU, {rate / plain:.2f})", target))
    return result, rows


def main() -> None:
    parser = arguments(__doc__, quick="smaller runs (under a minute)")
    parser.add_argument(
        "--clients",
        choices=["python", "node", "both"],
        default="python",
        help="who consumes: our Python client (default), the Node client, or both",
    )
    args = parser.parse_args()
    console = Console(stderr=args.json)
    n_async, n_consume, rounds = (50_000, 30_000, 2) if args.quick else (200_000, 100_000, 3)
    result: dict[str, object] = {"scale": "quick" if args.quick else "full", "rounds": rounds}
    rows = []
    if args.clients in ("python", "both"):
        off: dict[str, list[float]] = {"publish_async_msgs_per_s": [], "consume_ack_msgs_per_s": []}
        on: dict[str, list[float]] = {k: [] for k in off}
        lines = 0
        for i in range(rounds):
            console.print(f"round {i + 1}/{rounds}: event log off, then on ...")
            for target, enabled in ((off, False), (on, True)):
                figures, written = run(n_async, n_consume, enabled)
                lines = max(lines, written)
                for key in target:
                    target[key].append(figures[key])
        result["log_lines"] = lines
        for key in off:
            short = key.removesuffix("_msgs_per_s")
            a, b = statistics.median(off[key]), statistics.median(on[key])
            result[f"{short}_without_log"] = round(a)
            result[f"{short}_with_log"] = round(b)
            result[f"{short}_ratio_with_log"] = round(b / a, 3)
            rows += [
                (f"{key} (log off)", f"{a:,.0f}", ""),
                (f"{key} (log on)", f"{b:,.0f}", ""),
                (f"{short}_ratio_with_log", f"{b / a:.2f}", ">= 0.85"),
            ]
        rows.append(("event log lines written (one run)", f"{lines:,}", ""))
    if args.clients in ("node", "both"):
        node_result, node_rows = node_rounds(100_000 if args.quick else 200_000, rounds, console)
        result.update(node_result)
        rows += node_rows
    print_report(console, f"event log cost ({result['scale']})", rows, result, args.json)


if __name__ == "__main__":
    main()
