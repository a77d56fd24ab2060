"""The store against a plain model, driven by Hypothesis: every rule is applied to both and compared.

The model is dictionaries and lists with the retention rules written out directly (oldest first: what
is too old goes, then the oldest while over a count or size limit, always keeping the newest). The
LMDB machine also has a `reopen` rule, so recovery is checked at every step of every example.
Example counts: the "ci" profile (tests/conftest.py) runs 300 examples of up to 50 steps per machine.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from storage import (
    ChannelLimits,
    ChannelNameConflictError,
    ClearPending,
    ClientRecord,
    DeleteSubscription,
    LmdbStore,
    MemoryStore,
    NewMessage,
    SaveSubscription,
    SetLastSent,
    SetPending,
    Store,
    StoreLimits,
    SubscriptionRecord,
    TooManyChannelsError,
)
from storage.codec import message_size

S = 1_000_000_000
LIMITS = StoreLimits(
    max_channels=3,
    channel=ChannelLimits(max_msgs=6, max_bytes=300),
    per_channel={"b": ChannelLimits(max_age_s=30), "c": ChannelLimits(max_msgs=-1, max_bytes=-1)},
)
NAMES = st.sampled_from(["a", "A", "b", "B", "c", "d"])
PAYLOADS = st.binary(max_size=60)


@attrs.define
class ModelChannel:
    name: str
    first: int = 1
    last: int = 0
    last_ts: int = 0
    msgs: dict[int, tuple[int, bytes, str]] = attrs.Factory(dict)  # seq -> (ts, data, reply)

    def size(self, seq: int) -> int:
        _, data, reply = self.msgs[seq]
        return message_size(reply.encode(), data)

    def evict(self, now: int) -> range:
        limits = LIMITS.for_channel(self.name)
        start = self.first
        if limits.max_age_s:
            while self.msgs and self.msgs[self.first][0] <= now - limits.max_age_ns:
                self._drop_oldest()
        while len(self.msgs) > 1 and (
            (limits.max_msgs and len(self.msgs) > limits.max_msgs)
            or (limits.max_bytes and sum(self.size(s) for s in self.msgs) > limits.max_bytes)
        ):
            self._drop_oldest()
        return range(start, self.first)

    def _drop_oldest(self) -> None:
        del self.msgs[self.first]
        self.first += 1


class StoreMachine(RuleBasedStateMachine):
    recoverable = False

    def __init__(self) -> None:
        super().__init__()
        self.channels: dict[str, ModelChannel] = {}  # by lower-cased name
        self.subs: dict[int, SubscriptionRecord] = {}
        self.pending: dict[int, dict[int, int]] = {}
        self.clients: dict[str, ClientRecord] = {}
        self.now = 1_000 * S
        self.store: Store = self.open()

    def open(self) -> Store:
        return MemoryStore(limits=LIMITS)

    def teardown(self) -> None:
        self.store.close()

    def existing(self, name: str) -> ModelChannel | None:
        found = self.channels.get(name.lower())
        return found if found is not None and found.name == name else None

    # -- channels --------------------------------------------------------------------------------

    @rule(name=NAMES)
    def ensure_channel(self, name: str) -> None:
        other = self.channels.get(name.lower())
        if other is not None and other.name != name:
            try:
                self.store.ensure_channel(name)
            except ChannelNameConflictError:
                return
            raise AssertionError(f"{name} was accepted although {other.name} exists")
        if other is None and len(self.channels) >= LIMITS.max_channels:
            try:
                self.store.ensure_channel(name)
            except TooManyChannelsError:
                return
            raise AssertionError("a channel beyond max_channels was created")
        info = self.store.ensure_channel(name)
        self.channels.setdefault(name.lower(), ModelChannel(name))
        assert info.name == name

    @precondition(lambda self: self.channels)
    @rule(data=st.data())
    def delete_channel(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.channels)))
        name = self.channels.pop(key).name
        self.store.delete_channel(name)
        for sub_id in [i for i, r in self.subs.items() if r.channel == name]:
            del self.subs[sub_id]
            self.pending.pop(sub_id, None)

    # -- messages ------------------------------------------------------------------------------

    @precondition(lambda self: self.channels)
    @rule(
        data=st.data(),
        step_s=st.integers(-5, 20),
        batch=st.lists(
            st.tuples(st.integers(0, 5), PAYLOADS, st.sampled_from(["", "_INBOX.r"])), min_size=1, max_size=8
        ),
    )
    def append(self, data: st.DataObject, step_s: int, batch: list[tuple[int, bytes, str]]) -> None:
        names = sorted(c.name for c in self.channels.values())
        now = self.now + step_s * S  # may go backwards: timestamps must still not
        self.now = max(self.now, now)
        messages = [NewMessage(names[i % len(names)], payload, reply) for i, payload, reply in batch]
        result = self.store.append(messages, now_unix_ns=now)
        expected_assigned = []
        touched: dict[str, ModelChannel] = {}
        for msg in messages:
            ch = self.channels[msg.channel.lower()]
            ch.last += 1
            ch.last_ts = max(ch.last_ts, now)
            ch.msgs[ch.last] = (ch.last_ts, msg.data, msg.reply)
            expected_assigned.append((ch.last, ch.last_ts))
            touched[ch.name] = ch
        dropped = {name: gone for name, ch in touched.items() if (gone := ch.evict(now))}
        assert result.assigned == expected_assigned
        assert result.dropped == dropped

    @rule(step_s=st.integers(0, 40))
    def expire(self, step_s: int) -> None:
        self.now += step_s * S
        result = self.store.expire(now_unix_ns=self.now)
        dropped = {ch.name: gone for ch in self.channels.values() if (gone := ch.evict(self.now))}
        assert result.dropped == dropped
        dues = [
            ch.msgs[ch.first][0] + LIMITS.for_channel(ch.name).max_age_ns
            for ch in self.channels.values()
            if ch.msgs and LIMITS.for_channel(ch.name).max_age_s
        ]
        assert result.next_expiry_unix_ns == (min(dues) if dues else None)

    @precondition(lambda self: self.channels)
    @rule(data=st.data(), start=st.integers(0, 40), count=st.integers(0, 10))
    def read(self, data: st.DataObject, start: int, count: int) -> None:
        ch = data.draw(st.sampled_from(sorted(self.channels.values(), key=lambda c: c.name)))
        got = [(m.seq, m.timestamp_unix_ns, m.data, m.reply, m.subject) for m in self.store.read(ch.name, start, count)]
        wanted = [(s, *ch.msgs[s], ch.name) for s in sorted(ch.msgs) if s >= start][:count]
        assert got == [(s, ts, d, r, n) for s, ts, d, r, n in wanted]
        single = self.store.get(ch.name, start)
        assert (single.data if single else None) == (ch.msgs[start][1] if start in ch.msgs else None)

    @precondition(lambda self: self.channels)
    @rule(data=st.data(), back_s=st.integers(-10, 200))
    def first_at_or_after(self, data: st.DataObject, back_s: int) -> None:
        ch = data.draw(st.sampled_from(sorted(self.channels.values(), key=lambda c: c.name)))
        ts = self.now - back_s * S
        wanted = next((s for s in sorted(ch.msgs) if ch.msgs[s][0] >= ts), ch.last + 1)
        assert self.store.first_seq_at_or_after(ch.name, ts) == wanted

    # -- subscriptions and clients -----------------------------------------------------------

    @precondition(lambda self: self.channels)
    @rule(data=st.data(), durable=st.booleans())
    def new_subscription(self, data: st.DataObject, durable: bool) -> None:
        ch = data.draw(st.sampled_from(sorted(self.channels.values(), key=lambda c: c.name)))
        sub_id = self.store.new_subscription_id()
        assert sub_id not in self.subs
        record = SubscriptionRecord(
            sub_id,
            ch.name,
            "cli",
            f"_INBOX.{sub_id}",
            f"_ACK.{sub_id}",
            1000,
            5,
            durable_name="d" if durable else "",
            is_durable=durable,
            last_sent=ch.last,
        )
        self.store.apply([SaveSubscription(record)])
        self.subs[sub_id] = record

    @precondition(lambda self: self.subs)
    @rule(
        data=st.data(),
        ops=st.lists(st.tuples(st.sampled_from("spcl"), st.integers(1, 30), st.integers(1, 9)), max_size=10),
    )
    def update_pending(self, data: st.DataObject, ops: list[tuple[str, int, int]]) -> None:
        sub_id = data.draw(st.sampled_from(sorted(self.subs)))
        updates: list[Any] = []
        for kind, seq, attempt in ops:
            if kind == "s":
                updates.append(SetPending(sub_id, seq, attempt))
                self.pending.setdefault(sub_id, {})[seq] = attempt
            elif kind == "c":
                updates.append(ClearPending(sub_id, seq))
                self.pending.get(sub_id, {}).pop(seq, None)
            elif kind == "l":
                updates.append(SetLastSent(sub_id, seq))
                self.subs[sub_id] = attrs.evolve(self.subs[sub_id], last_sent=seq)
            else:
                closed = attrs.evolve(self.subs[sub_id], is_closed=not self.subs[sub_id].is_closed)
                updates.append(SaveSubscription(closed))
                self.subs[sub_id] = closed
        self.store.apply(updates)

    @precondition(lambda self: self.subs)
    @rule(data=st.data())
    def delete_subscription(self, data: st.DataObject) -> None:
        sub_id = data.draw(st.sampled_from(sorted(self.subs)))
        self.store.apply([DeleteSubscription(sub_id)])
        del self.subs[sub_id]
        self.pending.pop(sub_id, None)

    @rule(client=st.sampled_from(["x", "y", "z"]), conn=st.binary(max_size=4), register=st.booleans())
    def client(self, client: str, conn: bytes, register: bool) -> None:
        if register:
            record = ClientRecord(client, f"_HB.{client}", conn)
            self.store.register_client(record)
            self.clients[client] = record
        else:
            self.store.unregister_client(client)
            self.clients.pop(client, None)

    # -- what must always hold ---------------------------------------------------------------------

    @invariant()
    def recovered_state_matches_the_model(self) -> None:
        state = self.store.recover()
        got_channels = {(c.name, c.first_seq, c.last_seq, c.msgs, c.bytes) for c in state.channels}
        want_channels = {
            (c.name, c.first, c.last, len(c.msgs), sum(c.size(s) for s in c.msgs)) for c in self.channels.values()
        }
        assert got_channels == want_channels
        got_subs = {s.record.sub_id: (s.record, dict(s.pending)) for s in state.subscriptions}
        want_subs = {}
        for sub_id, record in self.subs.items():
            pending = self.pending.get(sub_id, {})
            raised = attrs.evolve(record, last_sent=max([record.last_sent, *pending]))
            want_subs[sub_id] = (raised, pending)
        assert got_subs == want_subs
        assert {c.client_id: c for c in state.clients} == self.clients


class LmdbStoreMachine(StoreMachine):
    recoverable = True

    def open(self) -> Store:
        if not hasattr(self, "directory"):
            self.directory = Path(tempfile.mkdtemp(prefix="store-machine-"))
        # Checkpoints only when a rule asks, so that a crash finds the journal in a known state.
        return LmdbStore(
            self.directory, limits=LIMITS, map_size=128 * 1024, checkpoint_bytes=1 << 30, checkpoint_interval=3600
        )

    @initialize()
    def fresh(self) -> None:
        assert self.store.channels() == []

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = self.open()

    @rule()
    def checkpoint(self) -> None:
        assert isinstance(self.store, LmdbStore)
        self.store.checkpoint()

    @rule()
    def crash(self) -> None:
        """Recover from the files as a killed process leaves them: whatever the journal holds that no
        checkpoint copied yet is replayed (a process crash keeps every commit: the page cache has it)."""
        copy = Path(tempfile.mkdtemp(prefix="store-machine-"))
        shutil.copytree(self.directory, copy, ignore=shutil.ignore_patterns("LOCK"), dirs_exist_ok=True)
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = copy
        self.store = self.open()

    def teardown(self) -> None:
        super().teardown()
        shutil.rmtree(self.directory, ignore_errors=True)


TestMemoryStoreMachine = StoreMachine.TestCase
TestLmdbStoreMachine = LmdbStoreMachine.TestCase
TestMemoryStoreMachine.settings = settings(TestMemoryStoreMachine.settings, stateful_step_count=50)
TestLmdbStoreMachine.settings = settings(TestLmdbStoreMachine.settings, stateful_step_count=50)
