"""The ack-latency histogram counts a run of acks in one step (`observe_since`): it must put every value
in the bucket, and add to the sum, exactly what observing each value on its own does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streaming.observability.metrics import ACK_LATENCY_BUCKETS, _Buckets

# Multiples of 1/1024 s: exact in binary floating point, so `now - start` carries no rounding and a
# value that sits exactly on a bucket bound must land in the same bucket both ways.
_TICK = 1 / 1024
_clock = st.integers(min_value=0, max_value=200_000).map(lambda ticks: ticks * _TICK)


def _buckets() -> _Buckets:
    return _Buckets("latency", "test", ["channel", "group"], sorted({*ACK_LATENCY_BUCKETS, 0.5, 0.25, _TICK}))


@given(
    now_ticks=st.integers(min_value=200_000, max_value=400_000),
    started=st.lists(st.one_of(_clock, st.just(-1.0)), max_size=60),
    on_bounds=st.lists(st.sampled_from([0.5, 0.25, _TICK]), max_size=5),
)
def test_a_run_counts_as_each_value_observed_alone(
    now_ticks: int, started: list[float], on_bounds: list[float]
) -> None:
    now = now_ticks * _TICK
    started = started + [now - bound for bound in on_bounds]  # values exactly on a (binary) bound
    one_by_one, at_once = _buckets(), _buckets()
    for start in started:
        one_by_one.observe(("c", "g"), now - start if start >= 0 else 0.0)
    at_once.observe_since(("c", "g"), now, started)
    empty = [0.0] * (len(at_once.bounds) + 2)
    expected = one_by_one.rows.get(("c", "g"), empty)
    got = at_once.rows.get(("c", "g"), empty)
    assert got[:-1] == expected[:-1]  # every bucket exactly
    assert got[-1] == pytest.approx(expected[-1], rel=1e-9, abs=1e-9)  # the sum, added in another order


def test_acks_of_messages_that_were_not_pending_count_as_zero() -> None:
    buckets = _buckets()
    buckets.observe_since(("c", "g"), 5.0, [-1.0, -1.0, 4.5])
    row = buckets.rows[("c", "g")]
    assert row[0] == 2  # the two that were not pending: 0 s, in the smallest bucket
    assert sum(row[:-1]) == 3
    assert row[-1] == 0.5
