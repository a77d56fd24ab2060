"""Each storm analysis on a small log whose answer is worked out by hand in the test."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from spark import analyses
from spark.analyses import Settings
from spark.events import read
from spark.synthetic import record, write
from tests.spark.logs import ack, deliver, s, storm_log


def load(spark: SparkSession, tmp_path: Path, records: list[dict[str, Any]]) -> DataFrame:
    return read(spark, [write(tmp_path / "events.jsonl", records)]).events


def rows(frame: DataFrame) -> list[dict[str, Any]]:
    return [r.asDict() for r in frame.collect()]


def test_an_injected_storm_is_found_with_its_exact_boundaries(spark: SparkSession, tmp_path: Path) -> None:
    events = load(spark, tmp_path, storm_log())
    settings = Settings()
    found = rows(analyses.episodes(events, analyses.buckets(events, settings), settings))
    assert len(found) == 1
    e = found[0]
    assert (e["start_us"], e["end_us"]) == (s(400), s(460))
    assert (e["buckets"], e["peak_redeliveries"], e["redeliveries"]) == (6, 50, 300)
    assert e["amplification"] == pytest.approx((60 + 300) / 60)
    assert e["dominant_reason"] == "ack_timeout"
    assert e["cause"] == "slow consumer"


@pytest.mark.parametrize(
    ("marks", "cause"),
    [
        ([record(s(399), "server_start"), record(s(399.5), "ft_takeover", group="main", member="m1-ab")], "takeover"),
        ([record(s(399), "server_start")], "restart"),
        ([record(s(300), "server_start")], "slow consumer"),  # a start long before says nothing of it
    ],
)
def test_a_storm_is_put_down_to_the_takeover_or_restart_just_before_it(
    spark: SparkSession, tmp_path: Path, marks: list[dict[str, Any]], cause: str
) -> None:
    events = load(spark, tmp_path, sorted([*storm_log(), *marks], key=lambda r: r["ts"]))
    settings = Settings()
    (found,) = rows(analyses.episodes(events, analyses.buckets(events, settings), settings))
    assert found["cause"] == cause


def test_amplification_per_window_and_overall(spark: SparkSession, tmp_path: Path) -> None:
    events = load(spark, tmp_path, storm_log())
    windows = {r["window_start_us"]: r for r in rows(analyses.amplification(events, Settings()))}
    assert windows[s(0)]["amplification"] == pytest.approx(72 / 60)  # 60 new + 6 buckets x 2
    # The window of buckets 36-41: 60 new, 4 quiet buckets x 2, 2 storm buckets x 50.
    assert (windows[s(360)]["deliveries"], windows[s(360)]["messages"]) == (168, 60)
    assert windows[s(360)]["amplification"] == pytest.approx(2.8)
    [overall] = rows(analyses.amplification_overall(events))
    assert (overall["deliveries"], overall["messages"], overall["redeliveries"]) == (1008, 600, 408)


def test_attempt_histogram_and_poison_candidates(spark: SparkSession, tmp_path: Path) -> None:
    events = load(spark, tmp_path, storm_log())
    hist = {r["attempt"]: r["deliveries"] for r in rows(analyses.attempts(events))}
    assert hist == {1: 600, 2: 108 + 60, 3: 60, 4: 60, 5: 60, 6: 60}
    poison = rows(analyses.poison(events, Settings(), analyses.end_of_log(events)))
    assert len(poison) == 60
    assert {r["why"] for r in poison} == {"attempts"}
    assert {r["seq"] for r in poison} == set(range(401, 461))


def test_never_acked_messages_are_poison_candidates_once_their_ack_wait_ran_out(
    spark: SparkSession, tmp_path: Path
) -> None:
    log = [
        deliver(0, 1, ack_wait_s=5.0),  # never acked, AckWait over by the end: a candidate
        deliver(0, 2, ack_wait_s=5.0),
        ack(1, 2),
        deliver(8, 3, ack_wait_s=5.0),  # unacked but still within its AckWait at the end
        record(s(10), "publish", channel="orders", seq=4),
    ]
    events = load(spark, tmp_path, log)
    poison = rows(analyses.poison(events, Settings(), analyses.end_of_log(events)))
    assert [(r["seq"], r["why"], r["acked"]) for r in poison] == [(1, "never_acked", False)]


def test_redelivery_rate_and_reason_mix(spark: SparkSession, tmp_path: Path) -> None:
    log = [deliver(i, i + 1) for i in range(4)]
    log += [
        deliver(10, 1, attempt=2, reason="ack_timeout"),
        deliver(11, 2, attempt=2, reason="ack_timeout"),
        deliver(12, 3, attempt=2, reason="member_left"),
        deliver(13, 4, attempt=2, reason="restart"),
    ]
    [mix] = rows(analyses.redelivery_mix(load(spark, tmp_path, log), Settings()))
    assert (mix["new"], mix["ack_timeout"], mix["member_left"], mix["restart"], mix["resume"]) == (4, 2, 1, 1, 0)
    assert mix["redeliveries"] == 4
    assert mix["redeliveries_per_s"] == pytest.approx(4 / 60)
    assert mix["redelivery_share"] == pytest.approx(0.5)


def test_ack_wait_fit_flags_a_slow_consumer_and_recommends_settings(spark: SparkSession, tmp_path: Path) -> None:
    # Ten messages sent at once to one subscriber (AckWait 2 s) that handles one every 0.5 s: message
    # i is acked at 0.5 (i + 1). Those not acked by 2 s are sent again at 2 s, before their ack.
    log = []
    for i in range(10):
        log.append(deliver(0, i + 1, ack_wait_s=2.0))
        if 0.5 * (i + 1) > 2:
            log.append(deliver(2, i + 1, attempt=2, reason="ack_timeout", ack_wait_s=2.0))
        log.append(ack(0.5 * (i + 1), i + 1, attempt=2 if 0.5 * (i + 1) > 2 else 1))
    [fit] = rows(analyses.ack_wait_fit(load(spark, tmp_path, log), Settings()))
    times = [0.5 * (i + 1) for i in range(10)]
    assert fit["acks"] == 10
    assert fit["handler_p50_s"] == pytest.approx((times[4] + times[5]) / 2)
    assert fit["handler_p99_s"] == pytest.approx(times[0] + 0.99 * (times[-1] - times[0]))
    assert fit["late_ack_fraction"] == pytest.approx(0.6)
    assert fit["flagged"] is True
    assert fit["service_s"] == pytest.approx(0.5)
    assert fit["recommended_ack_wait_s"] == math.ceil(fit["handler_p99_s"] / 0.8)
    assert fit["recommended_max_inflight"] == 3  # 3 x 0.5 s fits in 0.8 x 2 s


def test_a_consumer_well_inside_its_ack_wait_is_not_flagged(spark: SparkSession, tmp_path: Path) -> None:
    log = [x for i in range(5) for x in (deliver(i, i + 1, ack_wait_s=2.0), ack(i + 0.1, i + 1))]
    [fit] = rows(analyses.ack_wait_fit(load(spark, tmp_path, log), Settings()))
    assert (fit["flagged"], fit["late_ack_fraction"], fit["recommended_max_inflight"]) == (False, 0.0, None)
    assert fit["recommended_ack_wait_s"] == 2.0


def test_queue_member_skew(spark: SparkSession, tmp_path: Path) -> None:
    g = {"group": "workers", "channel": "jobs"}
    log = [record(s(0), "member_join", sub=n, member=f"worker-{n}", **g) for n in (1, 2, 3)]
    seq = 0
    for sub, count, redelivered in ((1, 6, 2), (2, 3, 0), (3, 3, 0)):
        for k in range(count):
            seq += 1
            attempt, reason = (2, "ack_timeout") if k < redelivered else (1, "new")
            log.append(deliver(1 + seq, seq, sub=sub, attempt=attempt, reason=reason, member=f"worker-{sub}", **g))
    [skew] = rows(analyses.member_skew(load(spark, tmp_path, log), Settings()))
    assert (skew["members"], skew["deliveries"], skew["max_deliveries"]) == (3, 12, 6)
    assert skew["max_over_mean"] == pytest.approx(1.5)
    assert skew["cv"] == pytest.approx(math.sqrt(2) / 4)
    assert (skew["top_redelivery_share"], skew["top_redelivery_member"]) == (1.0, "worker-1")


def test_a_member_leave_burst_and_its_drain_time(spark: SparkSession, tmp_path: Path) -> None:
    g: dict[str, Any] = {"group": "workers", "channel": "jobs", "ack_wait_s": 1.0}
    log = [deliver(1, n, sub=2, member="worker-2", **g) for n in (5, 6, 7, 8)]
    log.append(record(s(10), "member_leave", channel="jobs", group="workers", sub=2, member="worker-2"))
    log += [
        deliver(10.0, 5, sub=1, attempt=2, reason="member_left", member="worker-1", **g),
        deliver(10.1, 6, sub=1, attempt=2, reason="member_left", member="worker-1", **g),
        deliver(10.2, 7, sub=3, attempt=2, reason="member_left", member="worker-3", **g),
        deliver(13.0, 8, sub=3, attempt=2, reason="member_left", member="worker-3", **g),  # after 2 x AckWait
    ]
    g.pop("ack_wait_s")
    log += [
        ack(10.5, 5, sub=1, attempt=2, **g),
        ack(11.0, 6, sub=1, attempt=2, **g),
        ack(12.5, 7, sub=3, attempt=2, **g),
    ]
    [burst] = rows(analyses.leave_bursts(load(spark, tmp_path, log)))
    assert (burst["left_member"], burst["redelivered"], burst["to_members"], burst["unacked"]) == ("worker-2", 3, 2, 0)
    assert burst["first_redelivery_s"] == pytest.approx(0.0)
    assert burst["last_redelivery_s"] == pytest.approx(0.2)
    assert burst["drain_s"] == pytest.approx(2.5)


def test_a_leave_with_nothing_to_hand_over_still_has_its_row(spark: SparkSession, tmp_path: Path) -> None:
    g: dict[str, Any] = {"group": "workers", "channel": "jobs", "ack_wait_s": 1.0}
    log = [deliver(1, 5, sub=2, member="worker-2", **g), ack(1.5, 5, sub=2, member="worker-2", channel="jobs")]
    log.append(record(s(10), "member_leave", channel="jobs", group="workers", sub=2, member="worker-2"))
    log.append(deliver(30, 5, sub=1, attempt=2, reason="member_left", member="worker-1", **g))  # long after
    [burst] = rows(analyses.leave_bursts(load(spark, tmp_path, log)))
    assert (burst["left_member"], burst["redelivered"], burst["to_members"], burst["drain_s"]) == (
        "worker-2",
        0,
        0,
        0.0,
    )


def test_burrow_style_status_ok_warn_stall_stop(spark: SparkSession, tmp_path: Path) -> None:
    log = [record(s(0.5), "publish", channel="s", seq=n) for n in range(1, 101)]
    for sub in (1, 2, 3):  # plain subscriptions #1 (OK), #2 (STOP), #3 (STALL) on channel s
        log += [deliver(1, n, sub=sub, channel="s") for n in range(1, 101)]
        log += [ack(2, n, sub=sub, channel="s") for n in range(1, 11)]
    log += [ack(15, n, sub=1, channel="s") for n in range(11, 101)]  # #1 catches up
    log += [deliver(10 * b + 5, 11, sub=3, channel="s", attempt=b + 1, reason="ack_timeout") for b in range(1, 6)]
    for b in range(6):  # #4 on channel w: 20 published and 10 acked every sample, so lag grows
        for n in range(20 * b + 1, 20 * b + 21):
            log += [record(s(10 * b + 1), "publish", channel="w", seq=n), deliver(10 * b + 1, n, sub=4, channel="w")]
        log += [ack(10 * b + 2, n, sub=4, channel="w") for n in range(20 * b + 1, 20 * b + 11)]
    events = load(spark, tmp_path, log)
    settings = Settings(status_samples=3)
    samples = analyses.status_samples(events, settings, analyses.end_of_log(events))
    now = {r["consumer"]: (r["status"], r["lag"]) for r in rows(analyses.status_now(samples))}
    assert now == {"#1": ("OK", 0), "#2": ("STOP", 90), "#3": ("STALL", 90), "#4": ("WARN", 60)}
    w = [r["lag"] for r in rows(samples) if r["consumer"] == "#4"]
    assert w == [10, 20, 30, 40, 50, 60]


def test_restart_cost_and_duplicates_of_acknowledged_messages(spark: SparkSession, tmp_path: Path) -> None:
    log = [
        record(s(0), "server_start"),
        deliver(1, 1),
        ack(1.5, 1),
        deliver(2, 2),
        record(s(10), "server_start"),  # down from 2 s to 10 s
        deliver(10.5, 2, attempt=2, reason="restart"),
        deliver(10.6, 1, attempt=2, reason="restart"),  # acked before the restart: a duplicate
        deliver(11.0, 3),
    ]
    first, second = rows(analyses.restarts(load(spark, tmp_path, log)))
    assert (first["restart"], first["to_first_delivery_s"], first["duplicates_of_acked"]) == (False, 1.0, 0)
    assert second["restart"] is True
    assert second["downtime_s"] == pytest.approx(8.0)
    assert second["to_first_delivery_s"] == pytest.approx(0.5)
    assert second["to_first_new_delivery_s"] == pytest.approx(1.0)
    assert (second["recovered_redeliveries"], second["duplicates_of_acked"]) == (2, 1)


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="bucket_s"):
        Settings(bucket_s=0)
    with pytest.raises(ValueError, match="status_samples"):
        Settings(status_samples=0)
