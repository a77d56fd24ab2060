"""Invariants of wildcard subscriptions, driven by Hypothesis over the in-memory store and a virtual
clock: patterns over channels that appear as the run goes, plain, durable and in queue groups (plain
and durable, ordered or not), acks (from any member of a group) and naks naming the channel,
AckWait, close/unsubscribe, client drops and restarts. What the model tracks per message is its
owner: a part (a wildcard's share of one channel, whose sub id is stable across durable resumes and
restarts), or for a queue group its group on that channel.

W1 no loss across channels: for every owner, each message after its start position up to its
   position is acked or pending there (on some member, for a group).
W2 every channel a pattern matches is followed, and from the right place: a channel that existed when
   the subscription was made from its start position, one made later from its first message.
W3 MaxInflight counts across channels: a wildcard never holds more pending messages over all its
   channels than its MaxInflight (a queue member: no more first deliveries, as others' messages
   handed to it when they leave go beyond it, as on a channel's queue group).
W8 an ordered group never has two messages of one channel pending at once, over all its members.
W4 room is used: an online wildcard with room under its MaxInflight has been sent everything stored
   on every channel it follows.
W5 per channel, first deliveries in sequence order; attempts strictly increase; acked never again.
W6 no AckWait redelivery early and none overdue; a nak'd message not before its delay.
W7 after a restart, each part's recovered messages go out before any new one of that channel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage import StartPosition, StoreLimits, SubOptions
from streaming.core.engine import Delivered, Event, Reason, RequestError, per_message
from streaming.core.errors import DUPLICATE_DURABLE
from streaming.wire.subjects import matches
from tests.core.harness import Harness

CHANNELS = ["w.a", "w.b", "w.c", "w.a.deep", "v.a"]
PATTERNS = ["w.*", "w.>"]
EPS = 1e-9
NAK_EPS = 1e-6
# A durable keeps one MaxInflight (a resume with another would let it hold more than the new one).
DURABLE_INFLIGHT = {"d1": 2, "d2": 3}
ORDERED = {"g1": True, "g2": False}  # a group keeps its order or not for all its members
Owner = tuple[str, ...]


@attrs.define
class Sent:
    at: float
    delay: float
    attempt: int
    part: int = 0
    reason: Reason = Reason.NEW


@attrs.define
class Wild:
    pattern: str
    max_inflight: int
    at_subscribe: dict[str, int]  # channel -> where its part must start (existing channels)


class WildcardMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(limits=StoreLimits(max_subs=0))
        self.h.recorder.on_events = self._on_events  # type: ignore[method-assign]
        self.wilds: dict[int, Wild] = {}
        self.acked: dict[tuple[Owner, int], bool] = {}  # (owner, seq) acked
        self.sent: dict[tuple[Owner, int], Sent] = {}
        self.last_new: dict[Owner, int] = {}
        self.naked: dict[tuple[Owner, int], float] = {}
        self.owners: dict[int, Owner] = {}  # part -> owner, kept for parts that are gone
        self.group_starts: dict[Owner, int] = {}  # a group's owner on a channel -> its start position
        self.events: list[Any] = []
        for client in ("c1", "c2"):
            self.h.client(client)

    # -- deliveries (W5, W6) -------------------------------------------------------------------

    def _on_events(self, events: Sequence[Event]) -> None:
        for event in per_message(events):
            self.events.append(event)
            if isinstance(event, Delivered):
                self._check(event)

    def _owner(self, part: int) -> Owner:
        """A part's owner: the part itself, or for a queue member its group on the part's channel."""
        owner = self.owners.get(part)
        if owner is None:
            record = self.h.engine.subscription(part)
            assert record is not None and record.parent_id
            parent = self.h.engine.subscription(record.parent_id)
            assert parent is not None
            owner = (str(part),)
            if record.queue_group:
                owner = (parent.channel, record.durable_name, record.queue_group, record.channel)
            self.owners[part] = owner
        return owner

    def _check(self, event: Delivered) -> None:
        owner = self._owner(event.sub.sub_id)
        now, key = self.h.now, (owner, event.seq)
        assert not self.acked.get(key), f"W5: acked {key} delivered again"
        previous = self.sent.get(key)
        back = self.naked.pop(key, None)
        if back is not None:
            assert now + NAK_EPS >= back, f"W6: nak'd {key} back {back - now:.3f}s early"
        if previous is not None:
            assert event.attempt > previous.attempt, "W5: attempts must increase"
        if event.reason is Reason.ACK_TIMEOUT:
            assert previous is not None and now + EPS >= previous.at + previous.delay, f"W6: {key} early"
        if event.reason is Reason.NEW:
            assert previous is None and event.seq > self.last_new.get(owner, 0), "W5: out of order"
            self.last_new[owner] = event.seq
        self.sent[key] = Sent(now, event.ack_wait_s, event.attempt, event.sub.sub_id, event.reason)

    # -- rules ---------------------------------------------------------------------------------

    @rule(channel=st.sampled_from(CHANNELS), count=st.integers(1, 4))
    def publish(self, channel: str, count: int) -> None:
        self.h.publish(channel, count=count)

    @precondition(lambda self: len(self.wilds) < 4)
    @rule(
        pattern=st.sampled_from(PATTERNS),
        client=st.sampled_from(["c1", "c2"]),
        durable=st.sampled_from(["", "d1", "d2"]),
        queue=st.sampled_from(["", "", "g1", "g2"]),
        max_inflight=st.integers(1, 3),
        first=st.booleans(),
        ack_wait_s=st.sampled_from([1.0, 2.0]),
    )
    def subscribe(
        self, pattern: str, client: str, durable: str, queue: str, max_inflight: int, first: bool, ack_wait_s: float
    ) -> None:
        limit = DURABLE_INFLIGHT.get(durable, max_inflight)
        existing = {info.name: info.last_seq for info in self.h.store.channels()}
        try:
            sub_id = self.h.subscribe(
                pattern,
                client,
                durable=durable,
                queue=queue,
                max_inflight=limit,
                ack_wait_s=ack_wait_s,
                start=StartPosition.FIRST if first else StartPosition.NEW_ONLY,
                options=SubOptions(ordered=ORDERED.get(queue, False)),
            )
        except RequestError as exc:
            assert str(exc) == DUPLICATE_DURABLE
            return
        if sub_id not in self.wilds:
            tokens = pattern.split(".")
            starts = {c: 0 if first else last for c, last in existing.items() if matches(tokens, c.split("."))}
            self.wilds[sub_id] = Wild(pattern, limit, starts)
            for channel, part in self._parts(sub_id).items():
                owner = self._owner(part)
                if queue and owner not in self.group_starts:  # the group is made: its start on the channel
                    record = self.h.engine.subscription(part)
                    assert record is not None
                    # A group made on the channel by a publish (the pattern's member was there first)
                    # may have sent, and had acked, messages before this subscribe: it started before them.
                    sent = [seq for (o, seq) in [*self.sent, *self.acked] if o == owner]
                    self.group_starts[owner] = min([starts.get(channel, 0), *[seq - 1 for seq in sent]])

    def _online(self) -> list[int]:
        return sorted(s for s in self.wilds if self.h.engine.is_online(s))

    def _parts(self, sub_id: int) -> dict[str, int]:
        wild = self.h.engine.wildcard(sub_id)
        assert wild is not None
        return {channel: part.record.sub_id for channel, part in wild.parts.items()}

    def _draw_pending(self, data: st.DataObject) -> tuple[int, str, int, int] | None:
        sub_id = data.draw(st.sampled_from(self._online()))
        held = sorted(
            (channel, seq, part)
            for channel, part in self._parts(sub_id).items()
            for seq in self.h.engine.inspect.pending(part)
        )
        if not held:
            return None
        channel, seq, part = data.draw(st.sampled_from(held))
        return sub_id, channel, seq, part

    @precondition(lambda self: self._online())
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        drawn = self._draw_pending(data)
        if drawn is None:
            return
        sub_id, channel, seq, part = drawn
        assert self.h.ack_on(sub_id, channel, seq) == [True]
        key = (self._owner(part), seq)
        self.acked[key] = True
        self.sent.pop(key, None)
        self.naked.pop(key, None)

    @precondition(lambda self: self._online())
    @rule(data=st.data(), delay=st.sampled_from([0.0, 0.5, 1.5]))
    def nak(self, data: st.DataObject, delay: float) -> None:
        drawn = self._draw_pending(data)
        if drawn is None:
            return
        _, _, seq, part = drawn
        self.naked[(self._owner(part), seq)] = self.h.now + delay
        assert self.h.nak(part, seq, delay)

    @rule(dt=st.sampled_from([0.3, 1.0, 2.5]))
    def advance_time(self, dt: float) -> None:
        self.h.advance(dt)

    @precondition(lambda self: self._online())
    @rule(data=st.data(), how=st.sampled_from(["close", "unsubscribe"]))
    def leave(self, data: st.DataObject, how: str) -> None:
        sub_id = data.draw(st.sampled_from(self._online()))
        record = self.h.engine.subscription(sub_id)
        assert record is not None
        if how == "close":
            self.h.engine.close_subscription(sub_id, self.h.now)
        else:
            self.h.engine.unsubscribe(sub_id, self.h.now)
        self.h.collect()
        if not self.h.engine.has_subscription(sub_id):
            self.wilds.pop(sub_id)
        self._forget_gone_groups()

    @rule(client=st.sampled_from(["c1", "c2"]))
    def drop_client(self, client: str) -> None:
        gone = [s for s in self._online() if self.h.engine.subscription(s).client_id == client]  # type: ignore[union-attr]
        self.h.drop_client(client)
        self.h.client(client)
        for sub_id in gone:
            if not self.h.engine.has_subscription(sub_id):
                self.wilds.pop(sub_id)
        self._forget_gone_groups()

    def _forget_gone_groups(self) -> None:
        """A queue group that ended (its last member left, not durable): a new one of the same name
        starts afresh."""
        for owner in {o for o in self.owners.values() if len(o) == 4}:
            pattern, durable, queue, channel = owner
            key = f"{durable}:{queue}" if durable else queue
            if self.h.engine.group(channel, f"{pattern} {key}") is None:
                self.group_starts.pop(owner, None)
                self.owners = {part: o for part, o in self.owners.items() if o != owner}
                self.acked = {k: v for k, v in self.acked.items() if k[0] != owner}
                self.sent = {k: v for k, v in self.sent.items() if k[0] != owner}
                self.naked = {k: v for k, v in self.naked.items() if k[0] != owner}
                self.last_new.pop(owner, None)

    @rule()
    def restart(self) -> None:
        self.h.collect()
        inspect = self.h.engine.inspect
        parts = [p for s in self._online() for p in self._parts(s).values()]
        recovered = {p: set(inspect.pending(p)) - set(inspect.naked(p)) for p in parts}
        mark = len(self.events)
        self.h.restart()
        order: dict[int, list[tuple[int, Reason]]] = {}
        for event in self.events[mark:]:
            if isinstance(event, Delivered):
                order.setdefault(event.sub.sub_id, []).append((event.seq, event.reason))
        for part, pending in recovered.items():
            reasons = [r for _, r in order.get(part, [])]
            if Reason.NEW in reasons:
                assert Reason.RESTART not in reasons[reasons.index(Reason.NEW) :], "W7: new before recovered"
            assert {s for s, r in order.get(part, []) if r is Reason.RESTART} == pending, "W7: not all recovered"

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def channels_followed_and_nothing_lost(self) -> None:
        channels = {info.name for info in self.h.store.channels()}
        held: dict[Owner, set[int]] = {}
        position: dict[Owner, int] = {}
        start: dict[Owner, int] = {}
        for sub_id, model in self.wilds.items():
            tokens = model.pattern.split(".")
            parts = self._parts(sub_id)
            matching = {c for c in channels if matches(tokens, c.split("."))}
            assert set(parts) == matching, f"W2: {model.pattern} follows {sorted(parts)}, not {sorted(matching)}"
            for channel, part in parts.items():
                record = self.h.engine.subscription(part)
                assert record is not None
                owner = self._owner(part)
                held.setdefault(owner, set()).update(self.h.engine.inspect.pending(part))
                position[owner] = record.last_sent
                if record.queue_group:
                    start[owner] = self.group_starts.get(owner, 0)
                else:
                    start[owner] = model.at_subscribe.get(channel, 0)
        for owner, pending in held.items():
            for seq in range(start[owner] + 1, position[owner] + 1):
                assert seq in pending or self.acked.get((owner, seq)), f"W1: {seq} lost for {owner}"
            sent = [seq for (o, seq) in self.sent if o == owner] + [seq for (o, seq) in self.acked if o == owner]
            assert all(seq > start[owner] for seq in sent), f"W2: {owner} sent from before {start[owner]}"
            if len(owner) == 4 and ORDERED[owner[2]]:
                assert len(pending) <= 1, f"W8: {sorted(pending)} of {owner[3]} out at once in an ordered group"

    @invariant()
    def max_inflight_across_channels_and_room_used(self) -> None:
        now = self.h.now
        for sub_id in self._online():
            model = self.wilds[sub_id]
            parts = self._parts(sub_id)
            total = sum(len(self.h.engine.inspect.pending(p)) for p in parts.values())
            wild = self.h.engine.wildcard(sub_id)
            assert wild is not None and wild.count == total, "the shared count drifted from the parts"
            for part in parts.values():
                deadline = self.h.engine.next_deadline(part)
                assert deadline is None or deadline > now, "W6: an expired message was not redelivered"
                assert not self.h.engine.inspect.waiting(part), "W6: due messages wait on a healthy part"
            if wild.group is not None:
                first = 0
                for part in parts.values():
                    owner = self._owner(part)
                    for seq in self.h.engine.inspect.pending(part):
                        sent = self.sent.get((owner, seq))
                        first += sent is not None and sent.part == part and sent.reason is Reason.NEW
                assert first <= model.max_inflight, f"W3: {first} first deliveries out > {model.max_inflight}"
                continue
            assert total <= model.max_inflight, f"W3: {total} pending > MaxInflight {model.max_inflight}"
            if total < model.max_inflight:
                for channel, part in parts.items():
                    info = self.h.store.channel_info(channel)
                    record = self.h.engine.subscription(part)
                    assert info is not None and record is not None
                    assert record.last_sent >= info.last_seq, f"W4: room, but {channel} not sent up to {info.last_seq}"


TestWildcards = WildcardMachine.TestCase
TestWildcards.settings = settings(TestWildcards.settings, stateful_step_count=50)
