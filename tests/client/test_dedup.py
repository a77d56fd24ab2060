"""The client's suppression of redelivered copies, against a plain model (Hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streaming.client.dedup import AckFloor, RecentAcks


@given(st.lists(st.tuples(st.sampled_from(["deliver", "ack"]), st.integers(1, 40)), max_size=200))
def test_ack_floor_knows_exactly_what_was_acked(steps: list[tuple[str, int]]) -> None:
    # Plain subscriptions see first deliveries in sequence order: model that, acks in any order.
    floor = AckFloor()
    delivered: list[int] = []
    acked: set[int] = set()
    next_seq = 1
    for action, n in steps:
        if action == "deliver":
            for _ in range(n % 4 + 1):
                floor.delivered(next_seq)
                delivered.append(next_seq)
                next_seq += 1
        elif delivered:
            seq = delivered[n % len(delivered)]
            floor.acked(seq)
            acked.add(seq)
        for seq in delivered:
            assert floor.is_acked(seq) == (seq in acked), seq
        assert len(floor) <= len(delivered)
    # Memory: once everything is acked, nothing is kept per message.
    for seq in delivered:
        floor.acked(seq)
    assert len(floor) == 0 and floor.floor == len(delivered)


def test_recent_acks_are_bounded_by_size_and_age() -> None:
    recent = RecentAcks(max_entries=3, max_age_s=10)
    for seq in (5, 1, 9, 7):
        recent.acked(seq, now=0)
    assert not recent.is_acked(5, now=0) and recent.is_acked(7, now=0) and len(recent) == 3
    assert not recent.is_acked(7, now=11)
    assert len(recent) == 0
