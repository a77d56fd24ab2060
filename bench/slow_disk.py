"""A slow disk under a steady publisher: ours over WebSocket at 200 publishes a second, one per frame,
with every `fdatasync` of the server made N ms slower.

    python bench/slow_disk.py [--quick] [--json] [--delays 0,3,8]

Each run is `bench.bayeux.run_client`'s latency run (the CometD client, one publisher and one
subscriber, the ack extension on), against a fresh server whose `os.fdatasync` sleeps N ms after the
real sync. That is done by a `sitecustomize` module on the server's `PYTHONPATH`, written by this
script into a temporary directory; nothing in the server knows of it. A sync of 3 ms is a slow SATA
disk's, 8 ms a spinning one's.

The server commits a lone publisher's frame on the event loop while its appends are quick, and on the
store thread while their running average says the disk is slow (`streaming/core/group_commit.py`).
On the loop, each frame waits for an fsync of its own, and every client waits with it. So at 200
frames a second an 8 ms sync could never keep up. Figures: p50, p99 and the largest latency for each
delay, the medians over rounds, delays alternating in order between rounds. Full: 4,000 messages
after 1,000 to warm up, 3 rounds; quick: 1,000 after 500, 2 rounds.

JSON keys: `delay_<N>ms_p50_ms`, `_p99_ms`, `_max_ms`, `_cpu_us_per_msg`.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench import bayeux  # noqa: E402
from bench.node_clients import NODE_DIR  # noqa: E402
from bench.report import arguments, machine, print_report, progress  # noqa: E402

RATE = 200
SLOW_SYNC = """\
import os, sys, time

_DELAY_S = float(os.environ.get("BENCH_SLOW_SYNC_MS", "0")) / 1000
if _DELAY_S and "streaming" in getattr(sys, "orig_argv", []):  # the server only, not the bench or Node
    _sync = os.fdatasync

    def fdatasync(fd):
        _sync(fd)
        time.sleep(_DELAY_S)

    os.fdatasync = fdatasync
"""


def run(delay_ms: float, count: int, warmup: int) -> dict[str, Any]:
    """One latency run against a fresh server whose syncs take `delay_ms` more."""
    os.environ["BENCH_SLOW_SYNC_MS"] = str(delay_ms)
    try:
        return bayeux.run_client("ours", "websocket", "latency", count, RATE, warmup)
    finally:
        del os.environ["BENCH_SLOW_SYNC_MS"]


def main() -> None:
    parser = arguments(__doc__, quick="1,000 messages after 500, 2 rounds (about a minute)")
    parser.add_argument("--delays", default="0,3,8", help="ms added to each fdatasync, comma-separated (0,3,8)")
    args = parser.parse_args()
    if not (NODE_DIR / "node_modules" / "cometd").exists():
        raise SystemExit("the Node clients are not installed: npm ci --prefix bench/node")
    delays = [float(d) for d in args.delays.split(",")]
    count, warmup, rounds = (1_000, 500, 2) if args.quick else (4_000, 1_000, 3)
    console = Console(stderr=args.json)
    result: dict[str, Any] = {"scale": "quick" if args.quick else "full", "machine": machine(), "rounds": rounds}
    result.update({"messages": count, "warmup": warmup, "rate": RATE})
    samples: dict[float, list[dict[str, Any]]] = {d: [] for d in delays}
    with tempfile.TemporaryDirectory(prefix="bench-slow-sync-") as hook:
        (Path(hook) / "sitecustomize.py").write_text(SLOW_SYNC)
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = hook + (os.pathsep + path if path else "")
        try:
            with progress(console) as bar:
                task = bar.add_task("runs", total=rounds * len(delays))
                for round_ in range(rounds):
                    for delay in delays if round_ % 2 == 0 else list(reversed(delays)):
                        bar.update(task, description=f"fdatasync + {delay:g} ms")
                        samples[delay].append(run(delay, count, warmup))
                        bar.advance(task)
        finally:
            if path is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = path
    rows: list[tuple[str, str, str]] = []
    for delay, runs in samples.items():
        key = f"delay_{delay:g}ms"
        for figure in ("p50_ms", "p99_ms", "max_ms", "cpu_us_per_msg"):
            result[f"{key}_{figure}"] = round(statistics.median(r[figure] for r in runs), 2)
            rows.append((f"{key}_{figure}", f"{result[f'{key}_{figure}']}", ""))
        rows.append((f"  {key} p99 per round", ", ".join(f"{r['p99_ms']:.1f}" for r in runs), ""))
    title = f"A slow disk: WebSocket publish to delivery at {RATE}/s, {count:,} messages ({result['scale']})"
    print_report(console, title, rows, result, args.json)


if __name__ == "__main__":
    main()
