"""What the delivery event log costs: our server with and without `--event_log`, same run, same machine.

    python bench/event_log.py [--quick] [--json]

Each round starts `python -m streaming` (LMDB in a temp dir) twice, log off then on, and drives it with
our client as `bench/wire.py` does: pipelined publishes (each confirmed by its PubAck) and a push
subscription acking every message (MaxInflight 1024). With the log on, every publish, delivery and ack
becomes a line on disk. Figures are medians over the rounds; `*_ratio_with_log` = on / off (target:
>= 0.85, i.e. at most 15% off).
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


def main() -> None:
    parser = arguments(__doc__, quick="smaller runs (under a minute)")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    n_async, n_consume, rounds = (50_000, 30_000, 2) if args.quick else (200_000, 100_000, 3)
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
    result: dict[str, object] = {"scale": "quick" if args.quick else "full", "rounds": rounds, "log_lines": lines}
    rows = []
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
    print_report(console, f"event log cost ({result['scale']})", rows, result, args.json)


if __name__ == "__main__":
    main()
