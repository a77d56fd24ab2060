"""Bayeux (CometD) delivery: ours (ack extension on, durable log, fsync per commit) vs Faye, same run.

    python bench/bayeux.py [--quick] [--json] [--runs N] [--rate R]

Both servers are driven by the same real client, `cometd@9` + `cometd-nodejs-client@2` under Node
with AckExtension registered (`bench/node/bayeux_clients.mjs`): one subscriber, one publisher, both
long-polling on loopback.
- throughput: the publisher sends N messages (~130 bytes of JSON) in batches of 100 per request
  (`cometd.batch`), each batch once the last is answered; msgs/s = N / (last delivery - start).
- latency: the publisher sends one message per request at a fixed rate (`--rate`, default 200/s),
  stamped with its send time; latency = arrival at the subscriber - send, same process clock.
Ours: `streaming-server --http_api_port` (a publish is answered after its commit, every message in
the durable log, the subscriber acknowledging batches). Faye 1.4 (npm `faye`, `bench/node/faye_server.js`):
a Node Bayeux server that keeps nothing on disk and has no acks. Each figure is the median of
`--runs` runs, the two servers alternating. Full: 50,000 messages and 4,000 at the rate, 3 runs;
quick: 10,000 and 1,000, one run (under a minute).

The floor (`bench/bayeux_floor.py`, throughput only): a Bayeux server on our HTTP stack (hypercorn's
Trio worker and Starlette) that does what Faye does and nothing more: in memory, no acks, no checks.
It bounds what any server on that stack reaches with this client: `floor_ratio_vs_faye` says whether
the stack can match Faye at all, `throughput_ratio_vs_floor` how much of it our own work leaves.

JSON keys: `<system>_msgs_per_s`, `<system>_cpu_us_per_msg` (the server process's CPU over the
throughput run, per message), `<system>_p50_ms`, `<system>_p99_ms` (ours and Faye),
`throughput_ratio_vs_faye` (target >= 1.0), `p99_ratio_vs_faye` (target <= 1.5), `floor_ratio_vs_faye`,
`throughput_ratio_vs_floor`.
"""

from __future__ import annotations

import statistics
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.node_clients import NODE_DIR, ServerCpu, drive  # noqa: E402
from bench.report import arguments, machine, print_report, progress  # noqa: E402

BATCH = 100
SYSTEMS = ("ours", "faye", "floor")
LATENCY_SYSTEMS = ("ours", "faye")  # the floor's throughput bounds ours; its latency says nothing


def server(system: str) -> AbstractContextManager[peers.Server]:
    """A fresh server: ours with its HTTP client port, Faye, or the floor of our HTTP stack."""
    if system == "ours":
        return peers.http_server("bayeux")
    if system == "floor":
        return peers.http_server("floor", [sys.executable, str(ROOT / "bench" / "bayeux_floor.py"), "{port}"])
    return peers.http_server("faye", ["node", str(NODE_DIR / "faye_server.js"), "{port}"])


def run_client(system: str, mode: str, count: int, knob: int) -> dict[str, Any]:
    with server(system) as srv:
        cpu = ServerCpu(srv.pid)
        url = f"http://127.0.0.1:{srv.port}/cometd"
        argv = ["node", str(NODE_DIR / "bayeux_clients.mjs"), url, mode, str(count), str(knob)]
        result = drive(argv, cpu, "ready")
        if not result.get("ok"):
            raise SystemExit(f"{system} {mode}: {result.get('error')}")
        result["cpu_us_per_msg"] = cpu.seconds / count * 1e6
        return result


def main() -> None:
    parser = arguments(__doc__, quick="10,000 messages and 1,000 at the rate, one run (under a minute)")
    parser.add_argument("--runs", type=int, help="runs per system and mode (default 3, quick 1)")
    parser.add_argument("--rate", type=int, default=200, help="messages/s in the latency run (default 200)")
    args = parser.parse_args()
    if not (NODE_DIR / "node_modules" / "faye").exists():
        raise SystemExit("the Node clients are not installed: npm ci --prefix bench/node")
    console = Console(stderr=args.json)
    count, timed = (10_000, 1_000) if args.quick else (50_000, 4_000)
    runs = args.runs or (1 if args.quick else 3)
    result: dict[str, Any] = {"scale": "quick" if args.quick else "full", "machine": machine(), "runs": runs}
    result.update({"messages": count, "latency_messages": timed, "rate": args.rate, "batch": BATCH})
    samples: dict[str, list[dict[str, Any]]] = {f"{s}_{m}": [] for s in SYSTEMS for m in ("throughput", "latency")}
    with progress(console) as bar:
        task = bar.add_task("runs", total=runs * 5)
        for _ in range(runs):
            for mode, size, knob in (("throughput", count, BATCH), ("latency", timed, args.rate)):
                for system in SYSTEMS if mode == "throughput" else LATENCY_SYSTEMS:
                    bar.update(task, description=f"{system}: {mode}")
                    samples[f"{system}_{mode}"].append(run_client(system, mode, size, knob))
                    bar.advance(task)
    for system in SYSTEMS:
        through, latency = samples[f"{system}_throughput"], samples[f"{system}_latency"]
        result[f"{system}_msgs_per_s"] = round(statistics.median(r["msgs_per_s"] for r in through))
        result[f"{system}_cpu_us_per_msg"] = round(statistics.median(r["cpu_us_per_msg"] for r in through), 2)
        if not latency:
            continue
        result[f"{system}_p50_ms"] = round(statistics.median(r["p50_ms"] for r in latency), 2)
        result[f"{system}_p99_ms"] = round(statistics.median(r["p99_ms"] for r in latency), 2)
        result[f"{system}_latency_msgs_per_s"] = round(statistics.median(r["msgs_per_s"] for r in latency))
    result["throughput_ratio_vs_faye"] = round(result["ours_msgs_per_s"] / result["faye_msgs_per_s"], 3)
    result["p99_ratio_vs_faye"] = round(result["ours_p99_ms"] / result["faye_p99_ms"], 3)
    result["floor_ratio_vs_faye"] = round(result["floor_msgs_per_s"] / result["faye_msgs_per_s"], 3)
    result["throughput_ratio_vs_floor"] = round(result["ours_msgs_per_s"] / result["floor_msgs_per_s"], 3)
    rows = [(k, f"{v:,}" if isinstance(v, int) else f"{v}", "") for k, v in result.items() if k.startswith(SYSTEMS)]
    rows.append(("throughput_ratio_vs_faye", f"{result['throughput_ratio_vs_faye']}", ">= 1.0"))
    rows.append(("p99_ratio_vs_faye", f"{result['p99_ratio_vs_faye']}", "<= 1.5"))
    rows.append(("throughput_ratio_vs_floor", f"{result['throughput_ratio_vs_floor']}", ""))
    title = f"Bayeux with the CometD client: {count:,} messages, latency at {args.rate}/s ({result['scale']})"
    print_report(console, title, rows, result, args.json)


if __name__ == "__main__":
    main()
