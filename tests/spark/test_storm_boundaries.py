"""Storm episodes start and end where the storm does, however long it lasts: generated logs of 10 s
buckets with storms of 1, 3, 10 and 30 minutes, two storms close together, a storm from the first
bucket, a slow rise in traffic that is no storm, and a restart (no events at all) inside a storm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark import analyses
from spark.analyses import Settings
from spark.events import read
from spark.report import recommend
from spark.synthetic import write
from tests.spark.logs import ack, deliver, s

pytestmark = pytest.mark.slow


def generated(
    total: int, storms: list[tuple[int, int]], *, rise: bool = False, down: tuple[int, int] | None = None
) -> list[dict[str, Any]]:
    """`total` buckets of 10 s. Quiet buckets: 10 new messages (up to 40 with `rise`), a fifth of them
    redelivered once. Storm buckets (`storms`: first and last bucket): each message redelivered five
    times within the bucket. `down`: buckets with no event at all (the server restarting)."""
    out: list[dict[str, Any]] = []
    seq = 0
    for b in range(total):
        if down is not None and down[0] <= b <= down[1]:
            continue
        n = 10 + (30 * b) // total if rise else 10
        storm = any(first <= b <= last for first, last in storms)
        for j in range(n):
            seq += 1
            t = b * 10 + j * (5 / n)
            out.append(deliver(t, seq))
            if storm:
                for k in range(5):
                    out.append(deliver(t + 0.5 + k * 0.8, seq, attempt=k + 2, reason="ack_timeout"))
                out.append(ack(t + 4.9, seq, attempt=6))
            elif j % 5 == 0:
                out.append(deliver(t + 2, seq, attempt=2, reason="ack_timeout"))
                out.append(ack(t + 2.1, seq, attempt=2))
            else:
                out.append(ack(t + 0.05, seq))
    return out


CASES: dict[str, tuple[int, list[tuple[int, int]], dict[str, Any]]] = {
    "a 1-minute storm": (80, [(30, 35)], {}),
    "a 3-minute storm": (100, [(30, 47)], {}),
    "a 10-minute storm": (140, [(30, 89)], {}),
    "a 30-minute storm": (260, [(30, 209)], {}),
    "two storms close together": (100, [(30, 35), (40, 45)], {}),
    "a storm from the first bucket": (60, [(0, 11)], {}),
    "a slow rise that is no storm": (200, [], {"rise": True}),
    "a restart inside a storm": (100, [(30, 50)], {"down": (38, 40)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_episode_spans_its_storm_exactly(spark: SparkSession, tmp_path: Path, case: str) -> None:
    total, storms, options = CASES[case]
    events = read(spark, [write(tmp_path / "events.jsonl", generated(total, storms, **options))]).events
    settings = Settings()
    found = [r.asDict() for r in analyses.episodes(events, analyses.buckets(events, settings), settings).collect()]
    assert [(e["start_us"], e["end_us"]) for e in found] == [(s(a * 10), s((b + 1) * 10)) for a, b in storms]
    for e, (first, last) in zip(found, storms, strict=True):
        down = options.get("down")
        gap = 0 if down is None else down[1] - down[0] + 1
        assert e["buckets"] == last - first + 1 - gap
        assert e["dominant_reason"] == "ack_timeout"
        assert e["amplification"] == pytest.approx(6.0), "measured over the whole episode"
        assert "AckWait" in recommend(e, [])


def test_a_storm_is_not_learnt_as_the_new_normal(spark: SparkSession, tmp_path: Path) -> None:
    """The baseline of a bucket inside a long storm is still the calm traffic from before it."""
    events = read(spark, [write(tmp_path / "events.jsonl", generated(140, [(30, 89)]))]).events
    rows = {r["bucket"]: r for r in analyses.buckets(events, Settings()).collect()}
    first = min(rows)
    assert rows[first + 85]["baseline"] == 2.0 and rows[first + 85]["hot"], "a minute before its end"
    assert not rows[first + 95]["hot"] and rows[first + 95]["baseline"] == 2.0
