"""The whole job: the command as users run it on a log with bad lines in it, and the storm of
`bench/storm.py` against the real server, found in the stock run and absent with ack-progress."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bench import storm
from spark.analyses import Settings
from spark.storms import ROOT, analyse
from spark.synthetic import steady_with_storm, write
from tests.spark.logs import storm_log

BAD_LINES = [
    "this is not JSON",
    '{"ts": "yesterday", "event": "deliver"}',  # a field of the wrong type
    '{"ts": 1800000000000000, "event": "teleport", "channel": "orders", "seq": 1}',
    '{"ts": 1800000000000000, "event": "deliver", "channel": "orders", "sub": 1}',  # no seq, member, ...
    "",
]


def test_the_command_counts_bad_lines_and_still_reports(tmp_path: Path) -> None:
    log = write(tmp_path / "log" / "events-1.jsonl", storm_log(), BAD_LINES)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(ROOT / "spark" / "storms.py"), "--input", str(log.parent), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    headline = json.loads(done.stdout.strip().splitlines()[-1])
    assert headline["bad_lines"] == {"malformed": 2, "unknown_event": 1, "invalid": 1}
    assert headline["storm_episodes"] == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == len(storm_log())
    assert "this is not JSON" in summary["bad_examples"]["malformed"]
    report = (out / "report.md").read_text()
    assert "2 malformed, 1 of unknown kinds, 1 missing required fields" in report
    for png in ("redeliveries.png", "attempts.png", "handler_times.png"):
        assert png in report
        assert (out / png).read_bytes().startswith(b"\x89PNG")
    for name in ("amplification", "redelivery_mix", "attempts", "poison", "storm_episodes", "ack_wait_fit"):
        assert list((out / name).glob("*.parquet")), name
    for name in ("member_skew", "leave_bursts", "status", "restarts"):
        assert (out / name / "_SUCCESS").exists(), name


def test_the_command_says_what_is_missing(tmp_path: Path) -> None:
    """An input without event logs, one that is not there (not Spark's traceback), a bad setting."""
    for given, said in ((tmp_path, "no event-log files"), (tmp_path / "gone", "gone: no such file or directory")):
        done = subprocess.run(
            [sys.executable, str(ROOT / "spark" / "storms.py"), "--input", str(given), "--output", str(tmp_path / "o")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2
        assert said in done.stderr
    bad = subprocess.run(
        [sys.executable, str(ROOT / "spark" / "storms.py"), "--input", "x", "--output", "y", "--bucket", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "bucket_s must be > 0" in bad.stderr


def test_a_synthetic_storm_at_scale_is_found(spark: SparkSession, tmp_path: Path) -> None:
    """The generator `bench/spark_scale.py` uses, small: one episode where it put the storm."""
    counts = steady_with_storm(tmp_path / "log" / "events.jsonl", 60_000, rate=200.0, storm=(0.4, 0.8))
    summary = analyse(spark, [tmp_path / "log"], tmp_path / "out", Settings())
    assert summary["events"] == counts["events"]
    assert summary["bad_lines"] == {"malformed": 0, "unknown_event": 0, "invalid": 0}
    [episode] = summary["storm_episodes"]
    assert episode["dominant_reason"] == "ack_timeout"
    # Messages i in [0.4, 0.8) of the run were redelivered AckWait (5 s) after their first delivery.
    messages = counts["publish"]
    start = 1_800_000_000 + 0.4 * messages / 200.0 + 5
    end = 1_800_000_000 + 0.8 * messages / 200.0 + 5
    assert episode["start_us"] / 1e6 == pytest.approx(start, abs=10)
    assert episode["end_us"] / 1e6 == pytest.approx(end, abs=10)


@pytest.mark.slow
def test_the_storm_against_the_real_server_is_found_and_ack_progress_prevents_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    found = {}
    for run in ("stock", "ack_progress"):
        figures = storm.run(run, 5.0, tmp_path / "logs")
        summary = analyse(spark, [tmp_path / "logs" / run], tmp_path / f"out-{run}", Settings(bucket_s=1.0))
        [amp] = [a for a in summary["amplification"] if a["channel"] == "storm"]
        # The Spark job and the benchmark's own count agree on the same log.
        assert amp["amplification"] == pytest.approx(figures["amplification"], abs=1e-3)
        found[run] = (amp["amplification"], [e for e in summary["storm_episodes"] if e["channel"] == "storm"])
    stock_amplification, stock_episodes = found["stock"]
    assert stock_amplification > 2
    assert len(stock_episodes) == 1
    assert stock_episodes[0]["dominant_reason"] == "ack_timeout"
    best_amplification, best_episodes = found["ack_progress"]
    assert best_amplification <= 1.05
    assert best_episodes == []
