"""The reference server's acceptance scenarios for subscriptions and redelivery, at the engine level.

One test per scenario, named after its number and the reference tests it covers. Time is virtual
(the harness fires timers exactly at their deadlines); the store is the real in-memory store, and
restarts rebuild the engine from it (tests/core/test_lmdb_restart.py does the same over LMDB files).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import (
    ChannelLimits,
    ClusterIdMismatchError,
    LmdbStore,
    MemoryStore,
    Message,
    NewMessage,
    StartPosition,
    StoreLimits,
)
from streaming.core.engine import Reason, RequestError, reader
from streaming.core.engine.state import share_out
from tests.core.harness import Harness, S

NEW, TIMEOUT, LEFT, RESTART, RESUME = (
    Reason.NEW,
    Reason.ACK_TIMEOUT,
    Reason.MEMBER_LEFT,
    Reason.RESTART,
    Reason.RESUME,
)


def test_start_position_new_only_last_received_first_sequence() -> None:
    h = Harness()
    h.client()
    h.publish("foo", b"1", b"2", b"3")
    new_only = h.subscribe(start=StartPosition.NEW_ONLY)
    last = h.subscribe(start=StartPosition.LAST_RECEIVED)
    first = h.subscribe(start=StartPosition.FIRST)
    assert h.seqs(new_only) == []
    assert h.seqs(last) == [3]
    assert h.seqs(first) == [1, 2, 3]
    h.publish("foo", b"4")
    assert [h.seqs(s) for s in (new_only, last, first)] == [[4], [4], [4]]


def test_start_position_sequence_start() -> None:
    h = Harness(limits=StoreLimits(channel=ChannelLimits(max_msgs=10)))
    h.client()
    h.publish("foo", count=20)
    below = h.subscribe(start=StartPosition.SEQUENCE_START, start_sequence=1)
    assert h.seqs(below) == list(range(11, 21)), "below the oldest: from the first available"
    beyond = h.subscribe(start=StartPosition.SEQUENCE_START, start_sequence=21)
    inside = h.subscribe(start=StartPosition.SEQUENCE_START, start_sequence=15)
    assert h.seqs(beyond) == []
    assert h.seqs(inside) == [15, 16, 17, 18, 19, 20]
    h.publish("foo", b"new")
    assert h.seqs(beyond) == [21]


def test_start_position_time_delta() -> None:
    h = Harness()
    h.client()
    h.publish("foo", b"old")
    h.tick_to(h.now + 10)
    h.publish("foo", b"newer")
    h.tick_to(h.now + 10)
    everything = h.subscribe(start=StartPosition.TIME_DELTA_START, start_time_delta_s=60)
    between = h.subscribe(start=StartPosition.TIME_DELTA_START, start_time_delta_s=15)
    after = h.subscribe(start=StartPosition.TIME_DELTA_START, start_time_delta_s=5)
    assert h.seqs(everything) == [1, 2]
    assert h.seqs(between) == [2]
    assert h.seqs(after) == []
    h.publish("foo", b"x")
    assert h.seqs(after) == [3]


def test_start_position_ignored_on_durable_resume_and_queue_join() -> None:
    h = Harness()
    h.client()
    h.publish("foo", count=3)
    dur = h.subscribe(durable="d", start=StartPosition.FIRST)
    assert h.seqs(dur) == [1, 2, 3]
    h.ack(dur, 1, 2, 3)
    h.engine.close_subscription(dur, h.now)
    h.publish("foo", b"4")
    again = h.subscribe(durable="d", start=StartPosition.SEQUENCE_START, start_sequence=100)
    assert again == dur
    assert h.seqs(dur) == [4], "resume continues where it was; the start position is ignored"
    q1 = h.subscribe(queue="g", start=StartPosition.FIRST)
    assert sorted(h.seqs(q1)) == [1, 2, 3, 4]
    q2 = h.subscribe(queue="g", start=StartPosition.FIRST)
    assert h.seqs(q2) == [], "a joining member continues from the group's position"
    dq = h.subscribe(queue="g2", durable="dq", start=StartPosition.LAST_RECEIVED)
    assert h.seqs(dq) == [4]
    h.ack(dq, 4)
    h.engine.close_subscription(dq, h.now)
    dq2 = h.subscribe(queue="g2", durable="dq", start=StartPosition.FIRST)
    assert h.seqs(dq2) == [], "re-joining a durable group ignores the start position too"


@pytest.mark.parametrize("kind", ["plain", "queue", "durable"])
def test_stalled_delivery(kind: str) -> None:
    h = Harness()
    h.client()
    extra = {"queue": {"queue": "g"}, "durable": {"durable": "d"}}.get(kind, {})
    sub = h.subscribe(max_inflight=1, ack_wait_s=30, **extra)  # type: ignore[arg-type]
    h.publish("foo", count=3)
    assert h.seqs(sub) == [1]
    h.advance(0.7)
    assert h.seqs(sub) == [], "nothing more until the ack"
    h.ack(sub, 1)
    assert h.seqs(sub) == [2]
    h.advance(0.7)
    h.ack(sub, 2)
    assert h.seqs(sub) == [3]
    h.ack(sub, 3)
    h.advance(60)
    assert h.take(sub) == [], "nothing was redelivered"


def test_queue_members_take_turns_when_equally_loaded() -> None:
    # One message at a time, acked before the next: both members are idle at every pick, so they
    # must alternate (a pick that is not used for a message must not rotate the group).
    h = Harness()
    h.client()
    a = h.subscribe(queue="g")
    b = h.subscribe(queue="g")
    got: dict[int, list[int]] = {a: [], b: []}
    for _ in range(10):
        h.publish("foo", b"x")
        for member in (a, b):
            seqs = h.seqs(member)
            got[member] += seqs
            h.ack(member, *seqs)
    assert got == {a: [1, 3, 5, 7, 9], b: [2, 4, 6, 8, 10]}


@given(members=st.integers(2, 5), messages=st.integers(1, 40), batch=st.integers(1, 4))
def test_equally_loaded_queue_members_share_work_evenly(members: int, messages: int, batch: int) -> None:
    # Fairness: publishing `batch` messages at a time, each burst acked before the next, no member
    # ever gets more than one message more than another.
    h = Harness()
    h.client()
    subs = [h.subscribe(queue="g") for _ in range(members)]
    counts = dict.fromkeys(subs, 0)
    sent = 0
    while sent < messages:
        n = min(batch, messages - sent)
        h.publish("foo", count=n)
        sent += n
        for sub in subs:
            seqs = h.seqs(sub)
            counts[sub] += len(seqs)
            h.ack(sub, *seqs)
    assert sum(counts.values()) == messages
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def _one_by_one(loads: list[int], rooms: list[int], count: int) -> list[int]:
    """How many each member gets when each message goes to the least loaded member with room left,
    ties to the earlier one: the choice made message by message."""
    given = [0] * len(loads)
    for _ in range(count):
        best = None
        for i, (load, room) in enumerate(zip(loads, rooms, strict=True)):
            if given[i] < room and (best is None or load + given[i] < loads[best] + given[best]):
                best = i
        if best is None:
            break
        given[best] += 1
    return given


@given(
    members=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 12)), min_size=1, max_size=6),
    count=st.integers(1, 80),
)
def test_a_read_is_shared_out_as_message_by_message_choices_would(members: list[tuple[int, int]], count: int) -> None:
    loads, rooms = [load for load, _ in members], [room for _, room in members]
    given, last_round = share_out(loads, rooms, count)
    assert given == _one_by_one(loads, rooms, count)
    assert last_round == sorted(last_round)


def test_a_burst_goes_to_idle_members_as_one_block_each_in_order() -> None:
    h = Harness()
    h.client()
    members = [h.subscribe(queue="g", max_inflight=10) for _ in range(4)]
    first = 1
    # Message by message the 25th would go to the first member, so the next burst starts at the second.
    for burst, counts in ((25, [7, 6, 6, 6]), (22, [5, 6, 6, 5])):
        h.publish("foo", count=burst)
        got = [h.seqs(m) for m in members]
        assert [len(seqs) for seqs in got] == counts
        blocks = sorted(got)
        assert [seq for seqs in blocks for seq in seqs] == list(range(first, first + burst)), "blocks, in order"
        for m, seqs in zip(members, got, strict=True):
            h.ack(m, *seqs)
        first += burst


def test_queue_max_inflight_and_unstalled_on_acks() -> None:
    h = Harness()
    h.client()
    h.publish("foo", count=100)
    member = h.subscribe(queue="g", max_inflight=5, start=StartPosition.FIRST)
    got: list[int] = []
    while len(got) < 100:
        batch = h.seqs(member)
        assert 0 < len(batch) <= 5
        got += batch
        h.ack(member, *batch)
    assert got == list(range(1, 101))

    h2 = Harness()
    h2.client()
    members = [h2.subscribe(queue="big", max_inflight=64) for _ in range(4)]
    h2.publish("foo", count=10_000)
    seen: list[int] = []
    while len(seen) < 10_000:
        progressed = False
        for m in members:
            batch = h2.seqs(m)
            seen += batch
            progressed |= bool(batch)
            h2.ack(m, *batch)
        assert progressed
    assert sorted(seen) == list(range(1, 10_001))


class CountingStore(MemoryStore):
    reads = 0

    def read(self, channel: str, start_seq: int, max_count: int) -> list[Message]:
        self.reads += 1
        return super().read(channel, start_seq, max_count)


class _ReadCountingStore(MemoryStore):
    """A real memory store that counts the messages read from it, by backlog reads and by lookups."""

    asked = 0

    def read(self, channel: str, start_seq: int, max_count: int) -> list[Message]:
        found = super().read(channel, start_seq, max_count)
        self.asked += len(found)
        return found

    def get_many(self, channel: str, seqs: Sequence[int]) -> list[Message | None]:
        self.asked += len(seqs)
        return super().get_many(channel, seqs)


def test_a_fan_out_reads_each_message_once() -> None:
    # A backlog in the store, delivered to 20 subscriptions and expiring everywhere at once: the
    # first subscription's read takes the 50 messages from the store; the other 19 subscriptions'
    # reads and every redelivery find them in the engine's cache.
    store = _ReadCountingStore()
    store.ensure_channel("foo")
    store.append([NewMessage("foo", b"m%d" % i) for i in range(50)])
    h = Harness(store)
    h.client()
    subs = [h.subscribe(ack_wait_s=1, start=StartPosition.FIRST) for _ in range(20)]
    assert all(len(h.seqs(sub)) == 50 for sub in subs)
    assert store.asked == 50, f"{store.asked} messages read for 20 subscriptions of 50"
    h.advance(1)
    assert all(h.seqs(sub) == list(range(1, 51)) for sub in subs), "every copy redelivered"
    assert store.asked == 50, f"{store.asked} messages read back for 20 x 50 redeliveries"


@pytest.mark.parametrize("queue", ["", "g"])
def test_a_subscriber_behind_the_publisher_gets_what_was_just_published_without_a_store_read(queue: str) -> None:
    # MaxInflight holds back most of a commit: the rest goes out as acks free room, from what the
    # commit handed over, not read back and checked again. With no one behind, nothing is kept.
    store = _ReadCountingStore()
    h = Harness(store)
    h.client()
    sub = h.subscribe(queue=queue, max_inflight=4)
    h.publish("foo", count=40)
    got: list[int] = []
    while len(got) < 40:
        seqs = h.seqs(sub)
        assert seqs, f"stalled after {got}"
        got += seqs
        h.ack(sub, *seqs)
    assert got == list(range(1, 41)) and store.asked == 0, f"{store.asked} messages read back"
    cached = h.engine._reader._new.messages
    h.publish("foo", count=3)
    assert h.seqs(sub) == [41, 42, 43]
    assert h.engine._reader._new.messages == cached, "a commit everyone took at once is not kept"


def test_a_cache_too_small_for_the_backlog_still_delivers_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two subscriptions drifting apart in a backlog larger than the cache: each still gets every
    # message once, in order, whatever the cache dropped in between.
    monkeypatch.setattr(reader, "_GENERATION", 16)
    store = _ReadCountingStore()
    store.ensure_channel("foo")
    store.append([NewMessage("foo", b"m%d" % i) for i in range(200)])
    h = Harness(store)
    h.client()
    first = h.subscribe(ack_wait_s=30, start=StartPosition.FIRST, max_inflight=20)
    second = h.subscribe(ack_wait_s=30, start=StartPosition.FIRST, max_inflight=7)
    got: dict[int, list[bytes]] = {first: [], second: []}
    for _ in range(40):
        for sub in (first, second):
            batch = h.received.pop(sub, [])
            got[sub] += [d.message.data for d in batch]
            h.ack(sub, *(d.message.seq for d in batch))
    assert got[first] == got[second] == [b"m%d" % i for i in range(200)]
    assert store.asked > 200, "the cache was too small to serve the slower subscription"


def test_one_stalled_member_does_not_stall_the_group() -> None:
    store = CountingStore()
    h = Harness(store)
    h.client()
    stalled = h.subscribe(queue="g", max_inflight=1)
    free = h.subscribe(queue="g", max_inflight=100)
    h.publish("foo", count=10)
    assert len(h.seqs(stalled)) == 1
    assert len(h.seqs(free)) == 9, "the stalled member does not hold the others back"
    # Now stall the whole group: no store lookups happen for new publishes.
    h.publish("foo", count=91)
    h.take(free)
    before = store.reads
    h.publish("foo", count=5)
    h.publish("foo", count=5)
    assert store.reads == before
    assert h.take(free) == []
    assert h.take(stalled) == []
    h.ack(free, 2)
    assert len(h.take(free)) == 1, "an ack un-stalls the group"


def test_delivery_with_gaps_and_dropped_messages() -> None:
    h = Harness(limits=StoreLimits(channel=ChannelLimits(max_msgs=3)))
    h.client()
    dur = h.subscribe(durable="d", max_inflight=2)
    queue = h.subscribe(queue="g", max_inflight=2)
    h.publish("foo", b"1", b"2")
    assert h.seqs(dur) == [1, 2]
    assert h.seqs(queue) == [1, 2]
    h.publish("foo", count=8)  # evicts 1..7: 1 and 2 leave pending, which frees room
    assert h.seqs(dur) == [8, 9], "evicted sequences are skipped"
    assert h.seqs(queue) == [8, 9]
    assert sorted(h.engine.inspect.pending(dur)) == [8, 9]
    h.engine.close_subscription(dur, h.now)
    h.ack(queue, 8, 9)
    assert h.seqs(queue) == [10]
    h.publish("foo", count=3)  # 11..13: 8..10 are evicted while the durable is offline
    again = h.subscribe(durable="d", max_inflight=10)
    assert again == dur
    assert h.seqs(dur) == [11, 12, 13], "a resumed durable continues from the first available message"


def test_redelivery_and_queue_redelivery() -> None:
    h = Harness()
    h.client()
    plain = h.subscribe(ack_wait_s=1)
    queue = h.subscribe(queue="g", ack_wait_s=1)
    h.publish("foo", b"x")
    assert h.take(plain) == [(1, 1, NEW)]
    assert h.take(queue) == [(1, 1, NEW)]
    h.advance(0.999)
    assert h.take(plain) == []
    h.advance(0.001)
    assert h.take(plain) == [(1, 2, TIMEOUT)]
    assert h.take(queue) == [(1, 2, TIMEOUT)]
    h.ack(plain, 1)
    h.ack(queue, 1)
    assert h.engine.inspect.pending(plain) == {}
    assert h.engine.inspect.pending(queue) == {}
    assert h.engine.next_deadline(plain) is None, "the timer is gone"
    h.advance(10)
    assert h.take(plain) == []
    assert h.take(queue) == []


def test_multiple_redeliveries_are_spaced_by_ack_wait() -> None:
    h = Harness()
    h.client()
    plain = h.subscribe(ack_wait_s=1)
    q1 = h.subscribe(queue="g", ack_wait_s=1)
    q2 = h.subscribe(queue="g", ack_wait_s=1)
    h.publish("foo", b"x")
    times: dict[int, list[float]] = {sub: [h.now for _ in h.take(sub)] for sub in (plain, q1, q2)}
    assert len(times[plain]) == 1
    assert len(times[q1] + times[q2]) == 1
    for _ in range(4):
        h.advance(0.25)
        for sub in (plain, q1, q2):
            times[sub] += [h.now for _ in h.take(sub)]
        h.advance(0.75)
        for sub in (plain, q1, q2):
            times[sub] += [h.now for _ in h.take(sub)]
    gaps = [b - a for a, b in zip(times[plain], times[plain][1:], strict=False)]
    assert len(gaps) == 4
    assert all(0.5 <= g <= 1.7 for g in gaps)
    queue_times = sorted(times[q1] + times[q2])
    queue_gaps = [b - a for a, b in itertools.pairwise(queue_times)]
    assert len(queue_gaps) == 4
    assert all(0.5 <= g <= 1.7 for g in queue_gaps)


def test_redelivery_count_per_sub_and_group_persisted() -> None:
    h = Harness()
    h.client()
    plain = h.subscribe(ack_wait_s=1, durable="d")
    q1 = h.subscribe(queue="g", ack_wait_s=1)
    q2 = h.subscribe(queue="g", ack_wait_s=1)
    h.publish("foo", b"x")
    h.advance(3)
    assert [a for _, a, _ in h.take(plain)] == [1, 2, 3, 4], "redeliveryCount 0, 1, 2, 3 (attempt - 1)"
    assert sorted(a for _, a, _ in h.take(q1) + h.take(q2)) == [1, 2, 3, 4], "counted per group"
    h.restart()
    assert [a for _, a, _ in h.take(plain)] == [5], "we persist attempts: they continue after a restart"
    assert [a for _, a, _ in h.take(q1) + h.take(q2)] == [5]
    h.ack(plain, 1)
    h.ack(q1, 1)
    h.publish("foo", b"y")
    assert [a for _, a, _ in h.take(plain)] == [1]


def test_dropped_messages_are_not_redelivered() -> None:
    h = Harness(limits=StoreLimits(channel=ChannelLimits(max_msgs=3)))
    h.client()
    sub = h.subscribe(ack_wait_s=1)
    h.publish("foo", count=3)
    assert h.seqs(sub) == [1, 2, 3]
    h.store.append([])  # nothing
    h.publish("foo", b"4")  # evicts 1
    assert h.seqs(sub) == [4]
    assert 1 not in h.engine.inspect.pending(sub)
    h.advance(1)
    assert h.seqs(sub) == [2, 3, 4], "the evicted one never comes back; the rest in order"


def test_message_moved_to_another_member() -> None:
    h = Harness()
    h.client("a")
    h.client("b")
    qa = h.subscribe(queue="g", client="a", ack_wait_s=1, durable="dur")
    h.publish("foo", b"x")
    assert h.seqs(qa) == [1]
    qb = h.subscribe(queue="g", client="b", ack_wait_s=1, durable="dur")
    h.advance(1)
    assert h.seqs(qb) == [1], "the redelivery goes to the member with fewer pending"
    assert h.engine.inspect.pending(qa) == {}
    assert list(h.engine.inspect.pending(qb)) == [1]
    h.restart()
    assert h.engine.inspect.pending(qa) == {} and list(h.engine.inspect.pending(qb)) == [1], "also after a restart"
    h.take(qb)
    assert h.ack(qa, 1) == [True], "an ack from the other member clears it"
    assert h.engine.inspect.pending(qb) == {}
    h.advance(5)
    assert h.take(qa) == [] and h.take(qb) == [], "redelivered only once"


def test_failed_heartbeats_skip_members_and_durables() -> None:
    h = Harness()
    h.client("sick")
    h.client("well")
    sick_q = h.subscribe(queue="g", client="sick", ack_wait_s=1)
    well_q = h.subscribe(queue="g", client="well", ack_wait_s=1)
    dur = h.subscribe(client="sick", durable="d", ack_wait_s=1)
    h.engine.set_heartbeat_failed("sick", True, h.now)
    h.publish("foo", count=4)
    assert h.seqs(sick_q) == []
    assert h.seqs(well_q) == [1, 2, 3, 4]
    h.advance(1)
    assert h.take(sick_q) == []
    assert [s for s, _, _ in h.take(well_q)] == [1, 2, 3, 4], "redeliveries avoid the failing member"
    assert h.seqs(dur) == [1, 2, 3, 4], "new messages still go to the durable"
    h.advance(3)
    assert h.take(dur) == [], "no AckWait redelivery to a client failing heartbeats"
    h.drop_client("sick")  # the dead client is closed: its durable goes offline
    h.advance(5)
    h.client("sick")
    again = h.subscribe(client="sick", durable="d", ack_wait_s=1)
    assert [(s, r) for s, _, r in h.take(again)] == [(1, RESUME), (2, RESUME), (3, RESUME), (4, RESUME)]
    h.advance(1)
    assert len(h.take(again)) == 4, "redelivery resumes after the durable is resumed"


def test_no_duplicate_redelivery_after_ack() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe(ack_wait_s=1)
    h.publish("foo", b"x")
    h.advance(1)
    assert h.take(sub) == [(1, 1, NEW), (1, 2, TIMEOUT)]
    h.ack(sub, 1)
    h.ack(sub, 1)
    h.advance(10)
    assert h.take(sub) == []


def test_leaving_member_hands_over_pending_at_once() -> None:
    h = Harness()
    h.client()
    stays = h.subscribe(queue="g", ack_wait_s=60, max_inflight=10)
    leaves = h.subscribe(queue="g", ack_wait_s=3600, max_inflight=10)
    h.publish("foo", count=6)
    mine = h.seqs(stays)
    theirs = h.seqs(leaves)
    assert len(mine) == len(theirs) == 3
    h.engine.unsubscribe(leaves, h.now)
    h.collect()
    moved = h.take(stays)
    assert sorted(s for s, _, _ in moved) == sorted(theirs), "redelivered at once, not after an AckWait"
    assert all(r is LEFT and a == 2 for _, a, r in moved)
    assert sorted(h.engine.inspect.pending(stays)) == sorted(mine + theirs)


def test_queue_group_removed_on_last_member_leaving() -> None:
    h = Harness()
    h.client()
    h.publish("foo", count=3)
    member = h.subscribe(queue="g", start=StartPosition.FIRST)
    assert h.seqs(member) == [1, 2, 3]
    h.engine.unsubscribe(member, h.now)
    again = h.subscribe(queue="g", start=StartPosition.FIRST)
    assert h.seqs(again) == [1, 2, 3], "a new group starts from its own start position"
    h.drop_client("c")
    h.client()
    third = h.subscribe(queue="g", start=StartPosition.FIRST)
    assert h.seqs(third) == [1, 2, 3], "also when the last member's connection closed"


def test_durable_queue_group_lifecycle() -> None:
    h = Harness()
    h.client("a")
    h.client("b")
    member = h.subscribe(queue="g", durable="dur", client="a")
    plain_group = h.subscribe(queue="g", client="a")
    h.publish("foo", b"1")
    assert h.seqs(member) == [1] and h.seqs(plain_group) == [1], "dur:g and g are different groups"
    h.ack(member, 1)
    h.drop_client("a")
    assert h.engine.inspect.group_members("foo", "dur:g") == []
    h.publish("foo", b"2")
    h.restart()
    rejoin = h.subscribe(queue="g", durable="dur", client="b")
    assert h.seqs(rejoin) == [2], "any client re-joins and gets only the next message"
    with pytest.raises(RequestError, match="can't contain the character ':'"):
        h.subscribe(queue="g", durable="bad:name", client="b")
    h.engine.unsubscribe(rejoin, h.now)
    fresh = h.subscribe(queue="g", durable="dur", client="b", start=StartPosition.FIRST)
    assert h.seqs(fresh) == [1, 2], "unsubscribe of the last member deleted the group"


def test_durable_queue_redelivery_on_rejoin() -> None:
    h = Harness()
    h.client("a")
    member = h.subscribe(queue="g", durable="dur", client="a", ack_wait_s=60)
    h.publish("foo", count=3)
    assert h.seqs(member) == [1, 2, 3]
    h.drop_client("a")
    h.publish("foo", b"4")
    h.client("b")
    back = h.subscribe(queue="g", durable="dur", client="b", ack_wait_s=60)
    assert h.take(back) == [(1, 2, RESUME), (2, 2, RESUME), (3, 2, RESUME), (4, 1, NEW)], (
        "pending first, at once (not after the 60 s AckWait), then new"
    )


def test_durable_can_reconnect_once() -> None:
    h = Harness()
    h.client()
    dur = h.subscribe(durable="d")
    with pytest.raises(RequestError, match="stan: duplicate durable registration"):
        h.subscribe(durable="d")
    h.publish("foo", b"1", b"2")
    h.ack(dur, 1)
    first_inbox = h.engine.subscription(dur)
    h.engine.close_subscription(dur, h.now)
    again = h.subscribe(durable="d")
    assert again == dur
    assert [(s, r) for s, _, r in h.take(dur)] == [(1, NEW), (2, NEW), (2, RESUME)]
    record = h.engine.subscription(dur)
    assert first_inbox is not None
    assert record is not None
    assert record.ack_inbox != first_inbox.ack_inbox
    h.ack(dur, 2)
    h.engine.close_subscription(dur, h.now)
    h.restart()
    h.subscribe(durable="d")
    assert h.take(dur) == [], "acked messages are not redelivered, also after a restart"
    h.client("other")
    other = h.subscribe(durable="d", client="other", start=StartPosition.FIRST)
    assert other != dur and h.seqs(other) == [1, 2], "the client id is part of a durable's name"


def test_durable_removed_on_unsubscribe_kept_on_close() -> None:
    h = Harness()
    h.client()
    h.publish("foo", b"1")
    dur = h.subscribe(durable="d", start=StartPosition.FIRST)
    q = h.subscribe(durable="dq", queue="g", start=StartPosition.FIRST)
    h.ack(dur, *h.seqs(dur))
    h.ack(q, *h.seqs(q))
    h.engine.close_subscription(dur, h.now)
    h.engine.close_subscription(q, h.now)
    h.publish("foo", b"2")
    dur = h.subscribe(durable="d", start=StartPosition.FIRST)
    q = h.subscribe(durable="dq", queue="g", start=StartPosition.FIRST)
    assert h.seqs(dur) == [2] and h.seqs(q) == [2], "close kept them: they continue with the next one"
    h.engine.unsubscribe(dur, h.now)
    h.engine.unsubscribe(q, h.now)
    dur = h.subscribe(durable="d", start=StartPosition.FIRST)
    q = h.subscribe(durable="dq", queue="g", start=StartPosition.FIRST)
    assert h.seqs(dur) == [1, 2] and h.seqs(q) == [1, 2], "unsubscribe deleted them"


def test_durable_redelivery_on_resume_with_max_inflight() -> None:
    h = Harness()
    h.client()
    dur = h.subscribe(durable="d", max_inflight=3, ack_wait_s=30)
    h.publish("foo", count=3)
    assert h.seqs(dur) == [1, 2, 3]
    h.engine.close_subscription(dur, h.now)
    h.publish("foo", count=3)
    dur = h.subscribe(durable="d", max_inflight=3, ack_wait_s=1)
    h.publish("foo", count=2)  # publishers keep going while it resumes
    assert h.take(dur) == [(1, 2, RESUME), (2, 2, RESUME), (3, 2, RESUME)], "pending first, flagged"
    h.advance(1)
    assert [s for s, _, _ in h.take(dur)] == [1, 2, 3], "pending >= MaxInflight: the timer still redelivers"
    h.ack(dur, 1, 2, 3)
    assert h.seqs(dur) == [4, 5, 6]
    h.ack(dur, 4, 5, 6)
    assert h.seqs(dur) == [7, 8]


def test_restart_redelivers_once_per_sub_then_resumes() -> None:
    h = Harness()
    h.client()
    a = h.subscribe(max_inflight=10)
    b = h.subscribe(max_inflight=10)
    idle = h.subscribe(max_inflight=10)
    h.publish("foo", count=3)
    h.ack(idle, 1, 2, 3)
    h.take(a), h.take(b), h.take(idle)
    h.restart()
    assert h.take(a) == [(1, 2, RESTART), (2, 2, RESTART), (3, 2, RESTART)]
    assert h.take(b) == [(1, 2, RESTART), (2, 2, RESTART), (3, 2, RESTART)]
    assert h.take(idle) == []
    newcomer = h.subscribe(start=StartPosition.FIRST)
    assert all(r is NEW and att == 1 for _, att, r in h.take(newcomer)), "stored is not redelivered for new subs"
    h.publish("foo", b"4")
    assert h.seqs(idle) == [4], "an idle subscription below MaxInflight receives new messages"
    assert h.seqs(a) == [4]


def test_offline_durables_unknown_clients_and_group_position(tmp_path: Path) -> None:
    h = Harness()
    h.client("gone")
    h.client("stays")
    closed = h.subscribe(durable="closed", client="stays")
    h.engine.close_subscription(closed, h.now)
    plain_of_gone = h.subscribe(client="gone")
    q1 = h.subscribe(queue="g", client="stays")
    q2 = h.subscribe(queue="g", client="stays")
    h.publish("foo", count=4)
    h.ack(q1, *h.seqs(q1))
    h.ack(q2, *h.seqs(q2))
    h.engine.unsubscribe(q2, h.now)
    h.store.unregister_client("gone")  # the server forgot it; its NATS connection never came back
    h.restart()
    assert h.engine.subscription(plain_of_gone) is None, "subscriptions of unknown clients are dropped"
    assert not h.engine.is_online(closed)
    h.publish("foo", b"5")
    assert h.take(closed) == [], "offline durables receive nothing"
    assert h.seqs(q1) == [5], "the group's position survived a member leaving and a restart"
    LmdbStore(tmp_path, "alpha").close()
    with pytest.raises(ClusterIdMismatchError):
        LmdbStore(tmp_path, "beta")


def test_limits() -> None:
    h = Harness(limits=StoreLimits(max_channels=2, max_subs=2, channel=ChannelLimits(max_msgs=5, max_bytes=10_000)))
    h.client()
    h.subscribe("a")
    h.subscribe("a", durable="d")
    with pytest.raises(RequestError, match="too many subscriptions per channel"):
        h.subscribe("a")
    with pytest.raises(RequestError, match="too many subscriptions per channel"):
        h.subscribe("a", queue="g")
    h.subscribe("b")
    with pytest.raises(RequestError, match="too many channels"):
        h.subscribe("c")
    assert h.store.channel_info("c") is None, "the refused channel was not created"
    counting = h.subscribe("b", max_inflight=100)
    h.publish("b", count=12)
    info = h.store.channel_info("b")
    assert info is not None
    assert info.msgs == 5
    assert sorted(h.engine.inspect.pending(counting)) == [8, 9, 10, 11, 12], "evicted messages left pending"
    per_channel = Harness(
        limits=StoreLimits(channel=ChannelLimits(max_msgs=5), per_channel={"big": ChannelLimits(max_msgs=-1)})
    )
    per_channel.client()
    per_channel.publish("big", count=20)
    big = per_channel.store.channel_info("big")
    assert big is not None
    assert big.msgs == 20


def test_time_is_only_what_it_is_given() -> None:
    """The engine never reads a clock: the same inputs at other times give the same outputs."""
    for offset in (0.0, 1e6):
        h = Harness()
        h.tick_to(h.now + offset)
        h.client()
        sub = h.subscribe(ack_wait_s=2)
        h.publish("foo", b"x")
        h.advance(1.999)
        assert h.take(sub) == [(1, 1, NEW)]
        h.advance(0.001)
        assert h.take(sub) == [(1, 2, TIMEOUT)]
    assert S == 1_000_000_000


def test_due_redeliveries_hold_new_messages_while_heartbeats_fail() -> None:
    """A durable resumed by a client that is failing heartbeats: neither its pending nor new messages
    go out until the client answers again, and then the pending ones come first."""
    h = Harness()
    h.client()
    dur = h.subscribe(durable="d", ack_wait_s=1)
    h.publish("foo", b"1")
    assert h.seqs(dur) == [1]
    h.engine.close_subscription(dur, h.now)
    h.engine.set_heartbeat_failed("c", True, h.now)
    h.subscribe(durable="d", ack_wait_s=1)
    h.publish("foo", b"2")
    assert h.take(dur) == []
    h.engine.set_heartbeat_failed("c", False, h.now)
    h.collect()
    assert h.take(dur) == [(1, 2, RESUME), (2, 1, NEW)]


def test_max_inactivity() -> None:
    """TestMaxInactivity / TestMaxInactivityOnConnectionClose: idle channels without active
    subscriptions are deleted; offline durables do not keep them alive; publishes push it back."""
    h = Harness(limits=StoreLimits(channel=ChannelLimits(max_inactivity_s=10)))
    h.client()
    h.client("other")
    active = h.subscribe("busy")
    h.subscribe("quiet", durable="d")
    h.engine.close_subscription(h.subscribe("quiet2"), h.now)
    h.publish("quiet", b"x")
    h.engine.close_subscription(h.subscribe("quiet", durable="d2", client="other"), h.now)
    h.drop_client("c")  # connection close: "busy" and the durable on "quiet" lose their last active sub
    assert h.engine.inactive_channels(h.now) == []
    h.tick_to(h.now + 5)
    h.publish("quiet", b"y")  # a publish pushes the deadline back
    h.tick_to(h.now + 6)
    assert h.engine.inactive_channels(h.now) == ["busy", "quiet2"]
    h.tick_to(h.now + 4)
    assert sorted(h.engine.inactive_channels(h.now)) == ["busy", "quiet", "quiet2"]
    for name in h.engine.inactive_channels(h.now):
        h.store.delete_channel(name)
        h.engine.drop_channel(name)
    assert h.store.channels() == []
    assert h.engine.subscriptions() == [], "the offline durables went with their channel"
    h.client()
    again = h.subscribe("quiet", durable="d", start=StartPosition.FIRST)
    h.publish("quiet", b"new")
    assert h.take(again) == [(1, 1, NEW)], "a re-created channel starts at sequence 1"
    assert active not in h.engine.subscriptions()


class _CountingStore(MemoryStore):
    """A real memory store that counts the messages the engine reads back from it."""

    read_messages = 0

    def read(self, channel: str, start_seq: int, max_count: int) -> list[Message]:
        out = super().read(channel, start_seq, max_count)
        self.read_messages += len(out)
        return out


@pytest.mark.parametrize("queue", ["", "g"])
def test_an_ack_reads_only_what_the_subscriber_has_room_for(queue: str) -> None:
    # A backlog in the store (not the engine's cache of what was just published): each ack frees one
    # slot, so each ack may read one message, not a batch (which made queue groups ~20x slower).
    store = _CountingStore()
    store.ensure_channel("foo")
    store.append([NewMessage("foo", b"m%d" % i) for i in range(2_000)])
    h = Harness(store)
    h.client()
    sub = h.subscribe(queue=queue, max_inflight=10, start=StartPosition.FIRST)
    delivered = 0
    for _ in range(100):
        seqs = h.seqs(sub)
        assert len(seqs) >= 1
        delivered += len(seqs)
        h.ack(sub, *seqs)
    assert delivered == 1_000
    assert store.read_messages <= delivered + 10, f"{store.read_messages} read for {delivered} delivered"
