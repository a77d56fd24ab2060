"""A run's line in the event log (`last_seq`, as the server writes a burst of publishes, a backlog's
first deliveries or their acks) loads as the events it stands for, and a nonsensical run is counted as
a bad line, not spelt out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from spark.events import read
from spark.synthetic import record, write
from streaming.observability.event_schema import MAX_RUN, each_event
from tests.spark.logs import ack, deliver, s


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(name) for name in ("ts", "event", "channel", "seq", "sub", "attempt", "reason"))


def test_a_run_loads_as_the_events_it_stands_for(spark: SparkSession, tmp_path: Path) -> None:
    runs = [
        record(s(0), "publish", channel="orders", seq=1, last_seq=500),
        deliver(0.1, 1, last_seq=400),
        deliver(0.2, 401),
        ack(0.3, 1, last_seq=400),
        deliver(0.4, 401, attempt=2, reason="ack_timeout"),
        ack(0.5, 401, attempt=2),
    ]
    spelt_out = [event for line in runs for event in each_event(line)]
    assert len(spelt_out) == 500 + 400 + 1 + 400 + 1 + 1

    from_runs = read(spark, [write(tmp_path / "runs" / "events.jsonl", runs)])
    from_lines = read(spark, [write(tmp_path / "lines" / "events.jsonl", spelt_out)])
    assert from_runs.bad == from_lines.bad == {"malformed": 0, "unknown_event": 0, "invalid": 0}
    got = sorted(map(_key, (r.asDict() for r in from_runs.events.collect())))
    assert got == sorted(map(_key, (r.asDict() for r in from_lines.events.collect())))
    assert len(got) == len(spelt_out)
    assert "last_seq" not in from_runs.events.columns


def test_a_run_that_makes_no_sense_is_a_bad_line(spark: SparkSession, tmp_path: Path) -> None:
    lines = [
        deliver(0.1, 5, last_seq=5),  # a run is two or more
        deliver(0.1, 5, last_seq=4),  # backwards
        deliver(0.1, 1, last_seq=1 + MAX_RUN),  # longer than any server writes
        record(s(0.2), "ack_timeout", channel="c", seq=1, last_seq=3, sub=1, member="m", attempt=1, ack_wait_s=1.0),
        deliver(0.3, 10, last_seq=12),
    ]
    loaded = read(spark, [write(tmp_path / "events.jsonl", lines)])
    assert loaded.bad["invalid"] == 4
    assert sorted(r["seq"] for r in loaded.events.collect()) == [10, 11, 12]
