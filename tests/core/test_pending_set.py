"""A subscription's pending set: removing a burst of acks at once is removing each in turn (nak'd
entries included), nak'd entries come back in the order of their ends, none before it, and a set
emptied after a large backlog gives its memory back."""

from __future__ import annotations

import tracemalloc

from hypothesis import given
from hypothesis import strategies as st

from streaming.core.engine.events import Reason
from streaming.core.engine.pending import PendingSet

# What happened to a sequence before the acks: sent (attempt, delay), made due, or nothing.
_HISTORY = st.lists(
    st.tuples(
        st.integers(1, 12),
        st.one_of(
            st.tuples(st.just("sent"), st.integers(1, 3), st.sampled_from([1.0, 1.0, 1.0, 2.5])),
            st.tuples(st.just("due"), st.integers(1, 3), st.just(0.0)),
            st.tuples(st.just("nak"), st.integers(1, 3), st.sampled_from([0.0, 0.5, 3.0])),
        ),
    ),
    max_size=30,
)


def _build(history: list[tuple[int, tuple[str, int, float]]]) -> PendingSet:
    pending = PendingSet()
    now = 0.0
    for seq, (kind, attempt, delay) in history:
        now += 0.25
        if kind == "sent":
            pending.sent(seq, attempt, delay, now + delay)
        elif kind == "nak":  # given back (when pending) for `delay`
            pending.nak(seq, now + delay, int((now + delay) * 1e9))
        else:
            pending.add_due(seq, attempt, Reason.MEMBER_LEFT)
    return pending


def _state(pending: PendingSet) -> tuple[int, list[int], list[tuple[int, int]]]:
    return len(pending), sorted(pending), sorted((seq, pending.attempt(seq)) for seq in pending)


@given(_HISTORY, st.data())
def test_removing_a_burst_is_removing_each_in_turn(
    history: list[tuple[int, tuple[str, int, float]]], data: st.DataObject
) -> None:
    one_by_one, at_once = _build(history), _build(history)
    # Acks of what is pending (the usual burst), or of anything (duplicates, unknown sequences).
    held = sorted(one_by_one)
    acks = data.draw(
        st.one_of(
            st.permutations(held).flatmap(lambda p: st.integers(0, len(p)).map(lambda n: p[:n])),
            st.lists(st.integers(1, 14), max_size=20),
        )
    )
    expected = [one_by_one.remove(seq) for seq in acks]
    removed, first_attempts = at_once.remove_many(acks)
    assert removed == expected
    assert first_attempts == all(entry is None or entry[0] == 1 for entry in expected)
    assert _state(at_once) == _state(one_by_one)


def test_a_burst_of_first_deliveries_in_one_lane_reports_when_each_was_sent() -> None:
    pending = PendingSet()
    pending.sent_first_many([1, 2, 3], 2.0, 12.0)  # sent at 10.0
    pending.sent(4, 3, 2.0, 13.0)  # a third attempt, sent at 11.0
    assert pending.remove_many([3, 1]) == ([(1, 10.0), (1, 10.0)], True)
    assert pending.remove_many([4, 2]) == ([(3, 11.0), (1, 10.0)], False)
    assert pending.remove_many([9]) == ([None], True)
    assert len(pending) == 0


@given(_HISTORY, st.dictionaries(st.integers(1, 14), st.integers(1, 4), max_size=12))
def test_adding_many_due_is_adding_each_in_sequence_order(
    history: list[tuple[int, tuple[str, int, float]]], attempts: dict[int, int]
) -> None:
    """A recovered subscription's pending messages, into an empty set (recovery) or not."""
    for before in ([], history):
        one_by_one, at_once = _build(before), _build(before)
        for seq in sorted(attempts):
            one_by_one.add_due(seq, attempts[seq], Reason.RESTART)
        at_once.add_due_many(attempts, Reason.RESTART)
        assert _state(at_once) == _state(one_by_one)
        assert list(at_once.due()) == list(one_by_one.due()), "due in the same order"


@given(_HISTORY, st.lists(st.sampled_from([0.1, 0.3, 1.0, 2.0]), max_size=12))
def test_nakd_entries_come_back_in_the_order_of_their_ends_and_none_early(
    history: list[tuple[int, tuple[str, int, float]]], steps: list[float]
) -> None:
    pending = _build(history)
    ends = {seq: until for seq in pending if (until := pending.naked_until(seq)) is not None}
    size, now = len(pending), 7.5  # _build's clock ends at 0.25 per step, at most 7.5
    assert pending.in_flight == size - pending.due_count - len(ends)
    deadline = pending.next_deadline()
    assert deadline is None or not ends or deadline <= min(end for end, _ in ends.values())
    for step in steps:
        now += step
        released = pending.release_naks(now)
        assert all(ends[seq][0] <= now for seq in released), "back before its end"
        assert [ends[seq][0] for seq in released] == sorted(ends[seq][0] for seq in released)
        for seq in released:
            del ends[seq]
        assert all(end > now for end, _ in ends.values()), "an ended nak was not released"
        assert len(pending) == size, "a nak'd message stays pending throughout"


def test_a_set_emptied_after_a_large_backlog_gives_its_memory_back() -> None:
    """100,000 recovered as due, each redelivered, then all acked: the due queue frees its table once
    drained, and the lane and the attempt counts once emptied (a dict keeps its table on delete)."""
    count = 100_000
    tracemalloc.start()
    try:
        pending = PendingSet()
        pending.add_due_many(dict.fromkeys(range(1, count + 1), 1), Reason.RESTART)
        recovered = tracemalloc.get_traced_memory()[0]
        while (item := pending.peek_due()) is not None:
            pending.sent(item[0], 2, 30.0, 130.0)
        assert pending.due_count == 0 and len(pending) == count
        redelivered = tracemalloc.get_traced_memory()[0]
        seqs = list(range(1, count + 1))
        for at in range(0, count, 1000):
            removed, first = pending.remove_many(seqs[at : at + 1000])
            assert all(entry is not None and entry[0] == 2 for entry in removed) and not first
        del seqs, removed
        emptied = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(pending) == 0 and pending.peek_due() is None
    # The drained due queue's table (~6 MB here) is gone while the lane holds all of them again.
    assert redelivered < recovered + 2_000_000, (recovered, redelivered)
    assert emptied < 1_000_000, emptied
