"""Find and explain redelivery storms in the server's delivery event log (`--event_log DIR`).

    python spark/storms.py --input DIR [--input DIR ...] --output OUT [options]
    spark-submit --master spark://host:7077 spark/storms.py --input DIR --output OUT

Runs locally (`local[*]`) unless a master is given, by `--master` or by spark-submit. Writes one
Parquet directory per analysis, `summary.json` and `report.md` with PNG plots into OUT. Malformed
lines and unknown event kinds are counted and reported, not fatal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script (python spark/storms.py, spark-submit)
    sys.path.insert(0, str(ROOT))

from pyspark import SparkConf  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from spark import analyses, report  # noqa: E402
from spark.analyses import Settings  # noqa: E402
from spark.events import paths_of, read  # noqa: E402

POISON_EXAMPLES = 20


def session(master: str | None = None, app: str = "redelivery-storms") -> SparkSession:
    """A session on `master`, else on what spark-submit set, else `local[*]`."""
    builder = SparkSession.builder.appName(app).config("spark.sql.session.timeZone", "UTC")
    conf = SparkConf()
    master = master or conf.get("spark.master") or "local[*]"
    builder = builder.master(master)
    if master.startswith("local") and not conf.contains("spark.sql.shuffle.partitions"):
        # One machine: a few shuffle partitions per core, not the cluster default of 200, whose
        # per-task overhead dominates the small shuffles most analyses do.
        builder = builder.config("spark.sql.shuffle.partitions", str(2 * (os.cpu_count() or 2)))
    if master.startswith("local") and not conf.contains("spark.driver.memory"):
        builder = builder.config("spark.driver.memory", "2g")  # the whole job runs in the driver
    return builder.getOrCreate()


def analyse(spark: SparkSession, inputs: Sequence[str | Path], out: Path, s: Settings) -> dict[str, Any]:
    """Run every analysis over the logs in `inputs`, write them under `out`; the summary."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    # Parsed once: the JSON text is read a single time and every analysis scans columnar Parquet.
    loaded = read(spark, inputs, stage=out / "events")
    events = loaded.events.cache()
    span = events.agg(F.count("*"), F.min("ts"), F.max("ts")).first()
    assert span is not None
    count, first_us, end_us = int(span[0]), span[1], int(span[2] or 0)

    bucketed = analyses.buckets(events, s).cache()
    acked = analyses.handled(events).cache()  # the fit and the handler-time plot both join acks once
    samples = analyses.status_samples(events, s, end_us).cache()
    frames: dict[str, DataFrame] = {
        "amplification": analyses.amplification(events, s),
        "amplification_overall": analyses.amplification_overall(events),
        "redelivery_mix": analyses.redelivery_mix(events, s),
        "attempts": analyses.attempts(events),
        "poison": analyses.poison(events, s, end_us),
        "buckets": bucketed,
        "storm_episodes": analyses.episodes(events, bucketed, s),
        "ack_wait_fit": analyses.ack_wait_fit(events, s, acked),
        "member_skew": analyses.member_skew(events, s),
        "leave_bursts": analyses.leave_bursts(events),
        "status_samples": samples,
        "status": analyses.status_now(samples),
        "restarts": analyses.restarts(events),
    }
    timings: dict[str, float] = {"read_and_stage": round(time.perf_counter() - started, 2)}
    for name, frame in frames.items():
        t = time.perf_counter()
        frame.write.mode("overwrite").parquet(str(out / name))
        timings[name] = round(time.perf_counter() - t, 2)
    # The summary reads the small results back from Parquet rather than recomputing them.
    small = {name: spark.read.parquet(str(out / name)) for name in frames}
    episodes = report.rows(small["storm_episodes"].orderBy("start_us"))
    summary: dict[str, Any] = {
        "input": [str(p) for p in inputs],
        "settings": _settings(s),
        "events": count,
        "first_event": _iso(spark, first_us),
        "last_event": _iso(spark, end_us),
        "events_by_kind": {r["event"]: r["count"] for r in events.groupBy("event").count().collect()},
        "bad_lines": loaded.bad,
        "bad_examples": loaded.examples,
        "amplification": report.rows(small["amplification_overall"].orderBy("channel", "consumer")),
        "storm_episodes": episodes,
        "ack_wait_fit": report.rows(small["ack_wait_fit"].orderBy("channel", "consumer")),
        "poison_candidates": small["poison"].count(),
        "poison_examples": report.rows(small["poison"].orderBy("channel", "consumer", "seq"), POISON_EXAMPLES),
        "member_skew_worst": report.rows(
            small["member_skew"]
            .orderBy(F.desc("max_over_mean"))
            .select("channel", "consumer", "window_start", "members", "max_over_mean", "cv", "top_redelivery_share"),
            10,
        ),
        "leave_bursts": report.rows(small["leave_bursts"].orderBy("left_us")),
        "status": report.rows(small["status"].orderBy("channel", "consumer")),
        "restarts": report.rows(small["restarts"].orderBy("start_us")),
    }
    for episode in episodes:
        episode["recommendation"] = report.recommend(episode, summary["ack_wait_fit"])
    plots = {"redeliveries": "redeliveries.png", "attempts": "attempts.png", "handler_times": "handler_times.png"}
    report.plot_redeliveries(report.rows(small["buckets"]), episodes, out / plots["redeliveries"], s.bucket_s)
    report.plot_attempts(report.rows(small["attempts"]), out / plots["attempts"])
    handled = analyses.handler_times(acked)
    fraction = min(1.0, report.SCATTER_POINTS / max(1, summary["events_by_kind"].get("ack", 0)))
    report.plot_handler_times(
        report.rows(handled.sample(fraction=fraction, seed=7) if fraction < 1 else handled),
        summary["ack_wait_fit"],
        out / plots["handler_times"],
    )
    events.unpersist()
    bucketed.unpersist()
    acked.unpersist()
    samples.unpersist()
    summary["seconds"] = round(time.perf_counter() - started, 2)
    summary["timings_s"] = timings
    report.write(out, summary, plots)
    return summary


def _settings(s: Settings) -> dict[str, Any]:
    return {a.name: getattr(s, a.name) for a in Settings.__attrs_attrs__}


def _iso(spark: SparkSession, us: int | None) -> str | None:
    if us is None:
        return None
    return str(spark.sql(f"select timestamp_micros({int(us)}) as t").first()[0])  # type: ignore[index]


def parse(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", action="append", required=True, help="event-log directory or file (repeatable)")
    p.add_argument("--output", required=True, type=Path, help="directory for Parquet, summary.json, report.md")
    p.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    p.add_argument("--clean", action="store_true", help="remove OUT first")
    d = Settings()
    p.add_argument("--window", type=float, default=d.window_s, help="window for analyses 1, 2, 6, s (%(default)s)")
    p.add_argument("--bucket", type=float, default=d.bucket_s, help="storm bucket and status sample, s (%(default)s)")
    p.add_argument("--storm-k", type=float, default=d.storm_k, help="hot above k x rolling median (%(default)s)")
    p.add_argument(
        "--storm-min-redeliveries", type=int, default=d.storm_min_redeliveries, help="and above this (%(default)s)"
    )
    p.add_argument(
        "--storm-buckets", type=int, default=d.storm_min_buckets, help="w: hot buckets in a row (%(default)s)"
    )
    p.add_argument(
        "--baseline-buckets", type=int, default=d.storm_baseline_buckets, help="rolling median length (%(default)s)"
    )
    p.add_argument("--poison-attempts", type=int, default=d.poison_attempts, help="N for poison (%(default)s)")
    p.add_argument("--fit-ratio", type=float, default=d.fit_ratio, help="flag p99 > ratio x AckWait (%(default)s)")
    p.add_argument("--status-samples", type=int, default=d.status_samples, help="K samples (%(default)s)")
    args = p.parse_args(argv)
    try:
        settings = Settings(
            window_s=args.window,
            bucket_s=args.bucket,
            storm_k=args.storm_k,
            storm_min_redeliveries=args.storm_min_redeliveries,
            storm_min_buckets=args.storm_buckets,
            storm_baseline_buckets=args.baseline_buckets,
            poison_attempts=args.poison_attempts,
            fit_ratio=args.fit_ratio,
            status_samples=args.status_samples,
        )
    except ValueError as e:
        p.error(str(e))
    return args, settings


def main(argv: Sequence[str] | None = None) -> int:
    args, settings = parse(argv)
    try:
        paths_of(args.input)  # before Spark starts (seconds): a wrong directory is said at once
    except FileNotFoundError as e:
        print(f"storms: {e}", file=sys.stderr)
        return 2
    if args.clean and args.output.exists():
        shutil.rmtree(args.output)
    spark = session(args.master)
    try:
        summary = analyse(spark, args.input, args.output, settings)
    except FileNotFoundError as e:
        print(f"storms: {e}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    headline = {
        "events": summary["events"],
        "bad_lines": summary["bad_lines"],
        "storm_episodes": len(summary["storm_episodes"]),
        "amplification": {
            f"{a['channel']}/{a['consumer']}": round(a["amplification"], 3) for a in summary["amplification"]
        },
        "seconds": summary["seconds"],
        "report": str(args.output / "report.md"),
    }
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
