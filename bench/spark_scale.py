"""How long the storm analysis takes on a large event log, on this machine (target: 10M events in at
most 3 minutes).

    python bench/spark_scale.py [--quick] [--json] [--events N] [--keep DIR]

Generates a log in the server's format (`spark.synthetic.steady_with_storm`: one channel, a queue
group of 4, 20,000 messages a second, two of every three messages in the middle tenth of the run
redelivered once), then times the command users run, `python spark/storms.py --input ... --output
...` (local[*], JVM start included). Full: 10,000,000 events; quick: 1,000,000. JSON keys: `events`,
`log_bytes`, `generate_s`, `analyse_s`, `events_per_s`, `storm_episodes`, `target_s`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench.report import arguments, machine, print_report  # noqa: E402
from spark.synthetic import steady_with_storm  # noqa: E402

TARGET_S = 180.0


def main() -> None:
    parser = arguments(__doc__, quick="1,000,000 events instead of 10,000,000")
    parser.add_argument("--events", type=int, help="how many events to generate")
    parser.add_argument("--keep", type=Path, help="generate into (and leave the log and results in) this directory")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    events = args.events or (1_000_000 if args.quick else 10_000_000)
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        log = work / "log" / "events-synthetic-000001.jsonl"
        console.print(f"generating {events:,} events into {log} ...")
        started = time.perf_counter()
        # About 26 minutes of traffic at any size, so the storm (7% of it) spans ~11 buckets of 10 s.
        counts = steady_with_storm(log, events, rate=max(1.0, events / 3.1 / 1560), storm=(0.45, 0.52))
        generate_s = time.perf_counter() - started
        console.print(f"  {counts['events']:,} events, {log.stat().st_size / 1e9:.2f} GB in {generate_s:.1f} s")
        console.print("analysing with python spark/storms.py (local[*]) ...")
        out = work / "out"
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, str(ROOT / "spark" / "storms.py"), "--input", str(log.parent), "--output", str(out)],
            capture_output=True,
            text=True,
        )
        analyse_s = time.perf_counter() - started
        if done.returncode != 0:
            console.print(done.stderr[-4000:])
            raise SystemExit(f"spark/storms.py failed ({done.returncode})")
        headline = json.loads(done.stdout.strip().splitlines()[-1])
        result: dict[str, object] = {
            "scale": "quick" if args.quick else "full",
            "machine": machine(),
            "events": counts["events"],
            "log_bytes": log.stat().st_size,
            "generate_s": round(generate_s, 1),
            "analyse_s": round(analyse_s, 1),
            "analyse_in_job_s": headline["seconds"],
            "events_per_s": round(counts["events"] / analyse_s),
            "storm_episodes": headline["storm_episodes"],
            "target_s": TARGET_S,
        }
        rows = [
            ("events", f"{counts['events']:,}", ""),
            ("log size", f"{log.stat().st_size / 1e9:.2f} GB", ""),
            ("generate", f"{generate_s:.1f} s", ""),
            ("analyse (command, JVM start included)", f"{analyse_s:.1f} s", f"<= {TARGET_S:.0f} s (10M events)"),
            ("analyse (inside the job)", f"{headline['seconds']:.1f} s", ""),
            ("events per second", f"{counts['events'] / analyse_s:,.0f}", ""),
            ("storm episodes found", str(headline["storm_episodes"]), "1"),
        ]
        print_report(console, f"storm analysis at scale ({result['scale']})", rows, result, args.json)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
