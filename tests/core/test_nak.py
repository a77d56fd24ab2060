"""Negative acks with a delay, at the engine level: a message given back comes again once its delay is
over (not before), as its next attempt, honouring MaxDeliver; in a queue group it goes to whichever
member can take it; the wait survives a member leaving, a durable's absence and a restart (over real
LMDB files). Time is virtual (the harness fires timers at their deadlines)."""

from __future__ import annotations

from pathlib import Path

from storage import LmdbStore, SubOptions
from streaming.core.engine import Naked, Reason
from streaming.core.engine.engine import MAX_NAK_DELAY_S
from tests.core.harness import Harness

NAK, NEW = Reason.NAK, Reason.NEW


def test_a_nakd_message_comes_back_after_its_delay_as_its_next_attempt() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe(ack_wait_s=30)
    h.publish("foo", count=3)
    assert h.take(sub) == [(1, 1, NEW), (2, 1, NEW), (3, 1, NEW)]
    assert h.nak(sub, 2, 5.0)
    h.advance(4.999)
    assert h.take(sub) == [], "not before its delay"
    h.advance(0.001)
    assert h.take(sub) == [(2, 2, NAK)]
    assert [(e.seq, e.attempt, e.delay_s) for e in h.events(Naked)] == [(2, 1, 5.0)]
    h.advance(29)  # its AckWait runs again from the redelivery: 1 and 3 expire at 30, 2 not yet
    assert [(s, r) for s, _, r in h.take(sub)] == [(1, Reason.ACK_TIMEOUT), (3, Reason.ACK_TIMEOUT)]
    h.advance(5)
    assert h.take(sub) == [(2, 3, Reason.ACK_TIMEOUT)]


def test_a_nak_with_no_delay_sends_it_again_at_once_and_an_acked_one_never() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe(ack_wait_s=30)
    h.publish("foo", count=2)
    h.take(sub)
    assert h.nak(sub, 1, 0)
    assert h.take(sub) == [(1, 2, NAK)], "within the call: no timer pass needed"
    assert h.nak(sub, 2, 3)
    assert h.ack(sub, 2) == [True], "a nak'd message may still be acked while it waits"
    h.advance(10)
    assert h.take(sub) == []
    assert not h.nak(sub, 2, 1), "a nak of what is not pending is ignored"
    assert not h.nak(sub, 99, 1)


def test_nakd_messages_count_against_max_inflight_until_acked() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe(ack_wait_s=30, max_inflight=2)
    h.publish("foo", count=3)
    assert h.seqs(sub) == [1, 2]
    h.nak(sub, 1, 2)
    assert h.seqs(sub) == [], "still unacknowledged: no room for 3"
    h.ack(sub, 2)
    assert h.seqs(sub) == [3]
    h.advance(2)
    assert h.take(sub) == [(1, 2, NAK)]


def test_a_nak_counts_as_an_attempt_against_max_deliver() -> None:
    h = Harness()
    h.client()
    dead = h.subscribe("foo.dead")
    sub = h.subscribe(ack_wait_s=30, options=SubOptions(max_deliver=2))
    h.publish("foo", b"poison")
    h.take(sub)
    h.nak(sub, 1, 1)
    h.advance(1)
    assert h.take(sub) == [(1, 2, NAK)]
    h.nak(sub, 1, 1)
    h.advance(1)
    assert h.take(sub) == [], "a third attempt would pass MaxDeliver"
    assert h.seqs(dead) == [1]
    assert h.engine.inspect.pending(sub) == {}


def test_the_delay_is_cut_to_the_longest_allowed() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe(ack_wait_s=30)
    h.publish("foo", b"x")
    h.take(sub)
    h.nak(sub, 1, 10 * MAX_NAK_DELAY_S)
    assert h.engine.inspect.naked(sub) == {1: h.now + MAX_NAK_DELAY_S}


def test_in_a_queue_group_it_goes_to_a_member_that_can_take_it_and_a_leave_keeps_the_wait() -> None:
    h = Harness()
    h.client("a")
    h.client("b")
    a = h.subscribe(client="a", queue="q", ack_wait_s=30, max_inflight=1)
    b = h.subscribe(client="b", queue="q", ack_wait_s=30, max_inflight=1)
    h.publish("foo", count=2)
    assert (h.seqs(a), h.seqs(b)) == ([1], [2])
    h.nak(a, 1, 3)
    h.ack(b, 2)
    h.advance(3)
    assert h.take(a) + h.take(b) == [(1, 2, NAK)]
    holder = a if 1 in h.engine.inspect.pending(a) else b
    other = b if holder == a else a
    h.nak(other, 1, 4)  # any member may give back a message of its group
    h.engine.unsubscribe(holder, h.now)
    h.collect()
    assert h.engine.inspect.naked(other) == {1: h.now + 4}, "the wait moved with the message"
    h.advance(3.9)
    assert h.take(other) == []
    h.advance(0.1)
    assert h.take(other) == [(1, 3, NAK)]


def test_a_durable_away_past_the_delay_gets_it_on_its_return_and_one_back_sooner_waits() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe(durable="d", ack_wait_s=30)
    h.publish("foo", count=2)
    h.take(sub)
    h.nak(sub, 1, 2)
    h.nak(sub, 2, 10)
    h.engine.close_subscription(sub, h.now)
    h.collect()
    h.advance(5)
    again = h.subscribe(durable="d", ack_wait_s=30)
    assert again == sub
    assert h.take(sub) == [(1, 2, NAK)], "its delay ended while it was away; 2's has not"
    h.advance(4.9)
    assert h.take(sub) == []
    h.advance(0.1)
    assert h.take(sub) == [(2, 2, NAK)]


def test_a_restart_keeps_the_wait_over_lmdb_files(tmp_path: Path) -> None:
    h = Harness(LmdbStore(tmp_path))
    h.client()
    sub = h.subscribe(durable="d", ack_wait_s=30)
    h.publish("foo", count=3)
    h.take(sub)
    h.nak(sub, 2, 8)
    h.advance(3)
    h.collect()
    h.store.close()
    h.restart(LmdbStore(tmp_path))
    assert h.take(sub) == [(1, 2, Reason.RESTART), (3, 2, Reason.RESTART)], "the rest comes first, as always"
    assert h.engine.inspect.naked(sub) == {2: h.now + 5}, "5 s of its delay were left"
    h.publish("foo", b"4")
    assert h.seqs(sub) == [4], "new messages do not wait for it"
    h.advance(4.9)
    assert h.take(sub) == []
    h.advance(0.1)
    assert h.take(sub) == [(2, 2, NAK)]
    h.ack(sub, 1, 2, 3, 4)
    h.collect()
    h.store.close()
    h.restart(LmdbStore(tmp_path))
    assert h.take(sub) == []


def test_a_timer_pass_for_another_message_releases_nothing_early() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe(ack_wait_s=1)
    h.publish("foo", count=2)
    h.take(sub)
    h.nak(sub, 2, 1.2)
    h.advance(1)  # 1's AckWait ends: the subscription's timer fires 0.2 s before 2's delay does
    assert h.take(sub) == [(1, 2, Reason.ACK_TIMEOUT)]
    h.advance(0.199)
    assert h.take(sub) == []
    h.advance(0.001)
    assert h.take(sub) == [(2, 2, NAK)]
