"""The active's store and replay, on real LMDB stores: whatever the active does, replaying its log
gives another store the same channels, messages, subscriptions and clients, and replaying again from
any earlier position changes nothing (which is what lets a member save its position lazily). A log
that refuses a record leaves the local store untouched and stops every later change."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage import ChannelLimits, ClientRecord, SaveSubscription, SetPending, Store, StoreLimits, open_store
from storage.records import ClearPending, DeleteSubscription, NewMessage, SaveClient, SetLastSent, SubscriptionRecord
from streaming.ft import oplog
from streaming.ft.position import Position
from streaming.ft.replay import DivergedError, replay, replay_at
from streaming.ft.store import NotActiveError, ReplicatedStore

CID = "test-cluster"
LIMITS = StoreLimits(channel=ChannelLimits(max_msgs=6, max_bytes=0, max_age_s=0.0))


class ListLog:
    """The log as a list (unit tests of the store; JetStream itself is in test_failover)."""

    def __init__(self, max_record: int = 1 << 20) -> None:
        self.records: list[bytes] = []
        self.max_record = max_record
        self.refuse: NotActiveError | None = None

    def append(self, record: bytes) -> int:
        if self.refuse is not None:
            raise self.refuse
        self.records.append(record)
        return len(self.records)


def lmdb(directory: Path) -> Store:
    return open_store("lmdb", directory, CID, LIMITS, sync=False, verify="quick")


def picture(store: Store) -> dict[str, Any]:
    """Everything a client could see of a store."""
    state = store.recover()
    return {
        "channels": [(c.name, c.first_seq, c.last_seq, c.msgs, c.bytes) for c in state.channels],
        "messages": {
            c.name: [(m.seq, m.timestamp_unix_ns, m.data, m.reply) for m in store.read(c.name, 1, 1000)]
            for c in state.channels
        },
        "subscriptions": sorted(((s.record, dict(s.pending)) for s in state.subscriptions), key=lambda s: s[0].sub_id),
        "clients": sorted(state.clients, key=lambda c: c.client_id),
    }


def replayed(records: list[bytes], directory: Path, *, flush_at: int | None = None) -> dict[str, Any]:
    """A member replaying the log into an empty data directory; with `flush_at`, it flushes there (as
    its periodic flush does), crashes after the last record, and replays from its saved position."""
    directory.mkdir()
    position = Position.load(directory)
    with lmdb(directory / "store") as store:
        for seq, raw in enumerate(records, 1):
            replay_at(store, position, seq, oplog.decode(raw))
            if seq == flush_at:
                store.sync()
                position.save(seq)
        if flush_at is not None:
            position = Position.load(directory)  # what a restart finds
            for seq, raw in enumerate(records[position.applied :], position.applied + 1):
                replay_at(store, position, seq, oplog.decode(raw))
        return picture(store)


class ActiveAndReplicas(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        self.log = ListLog(max_record=600)  # small: large batches are split over several records
        self.store = ReplicatedStore(lmdb(self.root / "active"), self.log, Position.load(self.root))
        self.subs: list[int] = []
        self.now = 1_000_000_000
        self.checks = 0

    def teardown(self) -> None:
        self.store.close()
        self.tmp.cleanup()

    @rule(channel=st.sampled_from(["a", "b", "c"]), sizes=st.lists(st.integers(0, 200), min_size=1, max_size=12))
    def publish(self, channel: str, sizes: list[int]) -> None:
        self.store.ensure_channel(channel)
        self.now += 1_000
        batch = [NewMessage(channel, bytes([i % 256]) * n, f"r{i}") for i, n in enumerate(sizes)]
        self.store.append(batch, now_unix_ns=self.now)

    @rule(channel=st.sampled_from(["a", "b", "c"]))
    def subscribe(self, channel: str) -> None:
        self.store.ensure_channel(channel)
        sub_id = self.store.new_subscription_id()
        record = SubscriptionRecord(sub_id, channel, "c1", "_INBOX.1", "_ack.1", 1000, 10)
        self.store.apply([SaveClient(ClientRecord("c1", "_hb")), SaveSubscription(record)])
        self.subs.append(sub_id)

    @precondition(lambda self: self.subs)
    @rule(data=st.data(), seqs=st.lists(st.integers(1, 40), max_size=5))
    def deliver_and_ack(self, data: st.DataObject, seqs: list[int]) -> None:
        sub_id = data.draw(st.sampled_from(self.subs))
        updates: list[Any] = [SetPending(sub_id, s, 1) for s in seqs]
        updates += [SetLastSent(sub_id, max(seqs, default=0))]
        updates += [ClearPending(sub_id, s) for s in seqs[: len(seqs) // 2]]
        self.store.apply(updates)

    @precondition(lambda self: self.subs)
    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        sub_id = data.draw(st.sampled_from(self.subs))
        self.store.apply([DeleteSubscription(sub_id)])
        self.subs.remove(sub_id)

    @rule(channel=st.sampled_from(["a", "b", "c"]))
    def delete(self, channel: str) -> None:
        if self.store.channel_info(channel) is not None:
            self.store.delete_channel(channel)
            self.subs = [s for s in self.subs if s in {r.record.sub_id for r in self.store.recover().subscriptions}]

    @invariant()
    def replicas_see_what_the_active_has(self) -> None:
        if len(self.log.records) % 4:  # a fresh LMDB store per check: not after every step
            return
        want = picture(self.store.inner)
        n, self.checks = len(self.log.records), self.checks + 1
        assert replayed(self.log.records, self.root / f"r{self.checks}") == want
        assert replayed(self.log.records, self.root / f"again{self.checks}", flush_at=n // 2) == want


ActiveAndReplicas.TestCase.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)
test_replicas_and_replays_from_any_earlier_position = ActiveAndReplicas.TestCase


def test_a_refused_record_changes_nothing_here_and_stops_every_later_change(tmp_path: Path) -> None:
    log = ListLog()
    lost: list[NotActiveError] = []
    store = ReplicatedStore(lmdb(tmp_path / "s"), log, Position.load(tmp_path), on_lost=lost.append)
    store.ensure_channel("a")
    store.append([NewMessage("a", b"1")], now_unix_ns=1)
    log.refuse = NotActiveError("fenced")
    with pytest.raises(NotActiveError):
        store.append([NewMessage("a", b"2")], now_unix_ns=2)
    assert [m.data for m in store.read("a", 1, 10)] == [b"1"]
    assert len(lost) == 1
    log.refuse = None  # even a log that would take it now: this member stays stopped
    with pytest.raises(NotActiveError):
        store.apply([SaveClient(ClientRecord("c", "_hb"))])
    assert store.recover().clients == []
    assert len(log.records) == 2
    store.close()


def test_the_position_saved_never_claims_more_than_the_flushed_store(tmp_path: Path) -> None:
    log = ListLog()
    store = ReplicatedStore(lmdb(tmp_path / "s"), log, Position.load(tmp_path))
    store.ensure_channel("a")
    store.append([NewMessage("a", b"1")], now_unix_ns=1)
    assert Position.load(tmp_path).applied == 0  # nothing saved before a flush
    store.sync()
    assert store.position.saved == 2
    store.close()


def test_a_store_that_lacks_what_came_before_an_append_is_diverged(tmp_path: Path) -> None:
    with lmdb(tmp_path / "s") as store:
        with pytest.raises(DivergedError):
            replay(store, oplog.Append(1, {"a": 5}, (NewMessage("a", b"x"),)))
        store.ensure_channel("a")
        store.append([NewMessage("a", b"1"), NewMessage("a", b"2")], now_unix_ns=1)
        replay(store, oplog.Append(1, {"a": 2}, (NewMessage("a", b"2"),)))  # held already: skipped
        assert store.channel_info("a").last_seq == 2  # type: ignore[union-attr]


def test_a_replay_from_before_a_deletion_the_store_has_done_leaves_that_channel_out(tmp_path: Path) -> None:
    """A crash after the store deleted a channel and before the position moved past the deletion."""
    log = ListLog()
    with ReplicatedStore(lmdb(tmp_path / "active"), log, Position.load(tmp_path)) as active:
        active.ensure_channel("gone")
        active.ensure_channel("kept")
        active.append([NewMessage("gone", b"1"), NewMessage("kept", b"2")], now_unix_ns=1)
        record = SubscriptionRecord(active.new_subscription_id(), "gone", "c1", "_INBOX.1", "_ack.1", 1000, 10)
        active.apply([SaveSubscription(record)])
        active.delete_channel("gone")
        want = picture(active.inner)
    member = tmp_path / "member"
    member.mkdir()
    position = Position.load(member)
    with lmdb(member / "store") as store:
        for seq, raw in enumerate(log.records[:-1], 1):
            replay_at(store, position, seq, oplog.decode(raw))
        position.mark_delete(len(log.records), "gone")
        replay(store, oplog.decode(log.records[-1]))  # done, then the crash: the position is still 0
        position = Position.load(member)
        assert position.applied == 0 and position.deleting == (len(log.records), "gone")
        for seq, raw in enumerate(log.records, 1):
            replay_at(store, position, seq, oplog.decode(raw))
        assert picture(store) == want
        assert Position.load(member).deleting is None
