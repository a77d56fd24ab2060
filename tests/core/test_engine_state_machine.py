"""Redelivery invariants of the engine, driven by Hypothesis over the in-memory store and a virtual clock.

Rules: publish, subscribe (plain, durable, queue, durable queue; resuming a durable or re-joining a
group when it exists), ack (valid, from any group member, stale, duplicate), ack-progress, nak with a
delay (from any group member), advance time, a timer pass between deadlines,
member leave (close/unsubscribe), client drop, heartbeat failure and recovery, restart (rebuild from
the store). The model is a plain dataclass of what was published, acked, delivered and
when; every delivery and every step is checked against it:

I1 no loss: every message after an owner's start position, up to its position, is acked, dead-lettered,
   evicted by a limit, or pending on that owner (the subscription, or any member of its queue group).
I2 no message pending on two members of one queue group.
I3 first deliveries never exceed MaxInflight; with the MaxInflight-on-redeliveries option, what is in
   flight never does either.
I4 attempts of one message to one owner strictly increase; an acked message is never delivered again.
I5 no AckWait redelivery before the message's wait (from its delivery or last ack-progress) is over.
I6 every expired message of an online subscription has been redelivered (or dead-lettered), unless its
   client is failing heartbeats (then redeliveries wait, as in STAN).
I7 an owner's ack floor never moves back.
I8 after a restart, each subscription's recovered messages are sent before any new one.
I9 first deliveries reach an owner in sequence order.
I10 a nak'd message is not sent again before its delay is over (across member leaves, durable
   resumes and restarts), and then it is sent as its next attempt (I4, I6 with the nak's end as its
   deadline).
With MaxDeliver=N: no message is delivered more than N times, and each one past it appears in the
dead-letter channel exactly once.

Example counts: the "ci" profile (tests/conftest.py) runs 300 examples of up to 60 steps per machine
(about 15 s for the three machines); locally 60. Seeded bugs it catches within that budget: attempts not
incremented (I4), expiry 0.3 s early (I5), a member hand-over not persisted (I1 after restart), acks
from another group member ignored (I4). "New before due while heartbeats fail" needs a rare sequence and
is pinned by a scenario test instead (test_scenarios.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage import ChannelLimits, StoreLimits, SubOptions
from streaming.core.engine import DeadLettered, Delivered, Event, Reason, RequestError, SubRef, per_message
from streaming.core.engine.state import group_key
from streaming.core.errors import DUPLICATE_DURABLE
from tests.core.harness import Harness

Owner = tuple[str, str, int]
CHANNEL = "foo"
DEAD = "foo.dead"
LIMITS = StoreLimits(
    max_subs=0, channel=ChannelLimits(max_msgs=25), per_channel={DEAD: ChannelLimits(max_msgs=-1, max_bytes=-1)}
)
EPS = 1e-9
# A nak's end survives a restart as Unix ns and the harness's wall clock moves in whole ns: within 1 µs.
NAK_EPS = 1e-6


@attrs.define
class Sent:
    at: float  # when its current wait started (delivery or ack-progress)
    delay: float
    attempt: int
    reason: Reason
    sub_id: int
    subscribes: int = 0  # how many subscribe calls had been made when it was sent


@attrs.define
class Model:
    published: int = 0
    start: dict[Owner, int] = attrs.Factory(dict)  # position at creation
    acked: dict[Owner, set[int]] = attrs.Factory(dict)
    dead: set[tuple[Owner, int]] = attrs.Factory(set)
    sent: dict[tuple[Owner, int], Sent] = attrs.Factory(dict)
    last_new: dict[Owner, int] = attrs.Factory(dict)
    floor: dict[Owner, int] = attrs.Factory(dict)
    max_inflight: dict[int, int] = attrs.Factory(dict)
    window: dict[int, int] = attrs.Factory(dict)  # what set_window opened (a pull door's consumer)
    naked: dict[tuple[Owner, int], float] = attrs.Factory(dict)  # nak'd: not to be sent before this time
    subscribes: int = 0  # subscribe calls so far
    incarnation: dict[int, int] = attrs.Factory(dict)  # sub id -> `subscribes` at its latest subscribe (a resume)
    dead_total: int = 0


class EngineMachine(RuleBasedStateMachine):
    max_deliver = 0
    limit_redeliveries = False

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(limits=LIMITS)
        self.h.recorder.on_events = self._on_events  # type: ignore[method-assign]
        self.model = Model()
        self.events: list[tuple[float, Any]] = []
        self.checked = 0
        self.hb_failed: set[str] = set()
        self.hb_recovered: dict[str, float] = {}  # expiries skipped while failing wait one more AckWait
        for client in ("c1", "c2"):
            self.h.client(client)

    def _on_events(self, events: Sequence[Event]) -> None:
        for event in per_message(events):
            self._on_event(event)

    def _on_event(self, event: Any) -> None:
        self.events.append((self.h.now, event))
        if isinstance(event, Delivered):
            self._check_delivery(self.h.now, event)
        elif isinstance(event, DeadLettered):
            key = (self._owner_of(event.sub), event.seq)
            assert key not in self.model.dead, f"{key} dead-lettered twice"
            assert event.attempts == self.max_deliver
            self.model.dead.add(key)
            self.model.dead_total += 1
            self.model.sent.pop(key, None)
            back = self.model.naked.pop(key, None)
            assert back is None or self.h.now + NAK_EPS >= back, f"I10: {key} dead-lettered before its nak's delay"

    # -- per-delivery checks (I3 part, I4, I5, I9, MaxDeliver) ------------------------------------

    def _owner(self, sub_id: int) -> Owner:
        return self.h.engine.inspect.owner_key(sub_id)

    @staticmethod
    def _owner_of(sub: SubRef) -> Owner:
        """Whom an event's acks count for, from the event alone: observers hear a pass's events at its
        end, when the subscription may be gone already (a client dropped in the same pass)."""
        if sub.queue_group:
            return (sub.channel, group_key(sub.durable_name, sub.queue_group), 0)
        return (sub.channel, "", sub.sub_id)

    def _check_delivery(self, now: float, event: Delivered) -> None:
        sub_id, seq = event.sub.sub_id, event.seq
        owner = self._owner_of(event.sub)
        exists = self.h.engine.has_subscription(sub_id)
        if exists:
            assert owner == self._owner(sub_id)
        key = (owner, seq)
        assert seq not in self.model.acked.get(owner, set()), f"I4: acked {key} delivered again"
        previous = self.model.sent.get(key)
        back = self.model.naked.pop(key, None)
        if back is not None:
            assert now + NAK_EPS >= back, f"I10: nak'd {key} sent again {back - now:.3f}s before its delay ended"
            assert event.reason is not Reason.NEW
        if previous is not None:
            assert event.attempt > previous.attempt, f"I4: attempts went {previous.attempt} -> {event.attempt}"
        if event.reason is Reason.ACK_TIMEOUT:
            assert previous is not None
            assert now + EPS >= previous.at + previous.delay, f"I5: {key} redelivered {now - previous.at}s after"
        if event.reason is Reason.NEW:
            assert self.model.window.get(sub_id, 1) > 0, "a new message went out through a closed window"
            # Checked at the end of the pass that sent it: nothing of this subscription may still wait.
            if exists:
                assert not self.h.engine.inspect.waiting(sub_id), "I8: a new message went out before due redeliveries"
            assert previous is None, f"{key} sent as new twice"
            assert seq > self.model.last_new.get(owner, 0), "I9: first deliveries out of order"
            self.model.last_new[owner] = seq
        if self.max_deliver:
            assert event.attempt <= self.max_deliver, f"MaxDeliver: attempt {event.attempt}"
        self.model.sent[key] = Sent(now, event.ack_wait_s, event.attempt, event.reason, sub_id, self.model.subscribes)

    # -- rules -----------------------------------------------------------------------------------

    @rule(count=st.integers(1, 6))
    def publish(self, count: int) -> None:
        self.h.publish(CHANNEL, count=count)
        self.model.published += count

    @precondition(lambda self: len(self.h.engine.subscriptions()) < 6)
    @rule(
        kind=st.sampled_from(["plain", "durable", "queue", "dqueue"]),
        client=st.sampled_from(["c1", "c2"]),
        name=st.sampled_from(["a", "b"]),
        max_inflight=st.integers(1, 4),
        ack_wait_s=st.sampled_from([1.0, 2.0, 3.0]),
        first=st.booleans(),
    )
    def subscribe(self, kind: str, client: str, name: str, max_inflight: int, ack_wait_s: float, first: bool) -> None:
        from storage import StartPosition

        options = SubOptions(max_deliver=self.max_deliver, max_inflight_redeliveries=self.limit_redeliveries)
        self.model.subscribes += 1  # before: the call may deliver at once
        try:
            sub_id = self.h.subscribe(
                CHANNEL,
                client,
                ack_wait_s=ack_wait_s,
                max_inflight=max_inflight,
                durable=name if kind in ("durable", "dqueue") else "",
                queue=f"g{name}" if kind in ("queue", "dqueue") else "",
                start=StartPosition.FIRST if first else StartPosition.NEW_ONLY,
                options=options,
            )
        except RequestError as exc:
            assert str(exc) == DUPLICATE_DURABLE
            assert kind == "durable"
            return
        owner = self._owner(sub_id)
        record = self.h.engine.subscription(sub_id)
        assert record is not None
        self.model.max_inflight[sub_id] = max_inflight
        self.model.incarnation[sub_id] = self.model.subscribes
        self.model.window.pop(sub_id, None)
        if owner not in self.model.start:
            info = self.h.store.channel_info(CHANNEL)
            assert info is not None
            delivered_now = [s for (o, s) in self.model.sent if o == owner]
            self.model.start[owner] = min([record.last_sent, *[s - 1 for s in delivered_now]])

    def _pending_of(self, sub_id: int) -> list[int]:
        return sorted(self.h.engine.inspect.pending(sub_id))

    def _draw_pending(self, data: st.DataObject) -> tuple[Owner, int, int] | None:
        """(owner, seq, member) for an ack or a nak: a message pending on an online subscription, and
        who answers for it (any online member of its queue group may, reference PR #654). None when
        the subscription drawn holds nothing."""
        sub_id = data.draw(st.sampled_from(self._online()))
        pending = self._pending_of(sub_id)
        if not pending:
            return None
        seq = data.draw(st.sampled_from(pending))
        owner = self._owner(sub_id)
        member = data.draw(st.sampled_from([m for m in self._members(owner) if self.h.engine.is_online(m)]))
        return owner, seq, member

    @precondition(lambda self: self._online())
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        drawn = self._draw_pending(data)
        if drawn is None:
            return
        owner, seq, acker = drawn
        assert self.h.ack(acker, seq) == [True]
        self.model.acked.setdefault(owner, set()).add(seq)
        self.model.sent.pop((owner, seq), None)
        self.model.naked.pop((owner, seq), None)

    @precondition(lambda self: self._online())
    @rule(data=st.data())
    def ack_run(self, data: st.DataObject) -> None:
        """A read's burst of acks to one subscription in one call: its own pending messages, other
        members', stale and repeated sequences, in any order. Each pending one counts once."""
        sub_id = data.draw(st.sampled_from(self._online()))
        owner = self._owner(sub_id)
        members = self._members(owner)
        held = {seq for m in members for seq in self.h.engine.inspect.pending(m)}
        acker = data.draw(st.sampled_from([m for m in members if self.h.engine.is_online(m)]))
        some_seq = st.integers(0, 80) if not held else st.one_of(st.sampled_from(sorted(held)), st.integers(0, 80))
        seqs = data.draw(st.lists(some_seq, max_size=8))
        acked = held.intersection(seqs)
        assert self.h.pipeline.ack_many(acker, seqs) == len(acked)
        for seq in acked:
            self.model.acked.setdefault(owner, set()).add(seq)
            self.model.sent.pop((owner, seq), None)
            self.model.naked.pop((owner, seq), None)
        still = {seq for m in members for seq in self.h.engine.inspect.pending(m)}
        assert not still & acked, "an acked message is still pending"

    @precondition(lambda self: self._online())
    @rule(data=st.data(), seq=st.integers(0, 80))
    def ack_stale_or_duplicate(self, data: st.DataObject, seq: int) -> None:
        sub_id = data.draw(st.sampled_from(self._online()))
        owner = self._owner(sub_id)
        members = self._members(owner)
        if any(seq in self.h.engine.inspect.pending(m) for m in members):
            return
        before = {m: self.h.engine.inspect.pending(m) for m in members}
        assert self.h.ack(sub_id, seq) == [False]
        assert {m: self.h.engine.inspect.pending(m) for m in members} == before, "a stale ack changed something"

    @precondition(lambda self: self._online())
    @rule(data=st.data())
    def ack_progress(self, data: st.DataObject) -> None:
        sub_id = data.draw(st.sampled_from(self._online()))
        pending = self._pending_of(sub_id)
        if not pending:
            return
        seq = data.draw(st.sampled_from(pending))
        if self.h.engine.ack_progress(sub_id, seq, self.h.now):
            self.model.sent[(self._owner(sub_id), seq)].at = self.h.now
        self.h.collect()

    @precondition(lambda self: self._online())
    @rule(data=st.data(), delay=st.sampled_from([0.0, 0.4, 0.7, 1.2, 2.5]))
    def nak(self, data: st.DataObject, delay: float) -> None:
        """A negative ack, from any member of the message's group: it comes back after `delay`."""
        drawn = self._draw_pending(data)
        if drawn is None:
            return
        owner, seq, acker = drawn
        self.model.naked[(owner, seq)] = self.h.now + delay  # before: a delay of 0 sends it within the call
        assert self.h.nak(acker, seq, delay)

    @precondition(lambda self: self._online())
    @rule(data=st.data(), window=st.integers(0, 5))
    def set_window(self, data: st.DataObject, window: int) -> None:
        """Deliveries on demand: the window opens and closes; redeliveries still go out, new messages
        only through an open window, and nothing is lost or owned twice meanwhile."""
        sub_id = data.draw(st.sampled_from(self._online()))
        self.model.window[sub_id] = min(window, self.model.max_inflight[sub_id])
        self.h.engine.set_window(sub_id, window, self.h.now)
        self.h.collect()

    @rule(dt=st.sampled_from([0.1, 0.5, 0.999, 1.0, 1.5, 3.0, 7.0]))
    def advance_time(self, dt: float) -> None:
        self.h.advance(dt)

    @precondition(lambda self: self._online())
    @rule(data=st.data(), dt=st.sampled_from([0.05, 0.2, 0.35]))
    def timer_pass_between_deadlines(self, data: st.DataObject, dt: float) -> None:
        """Time passes without reaching any deadline, and the runtime runs a subscription's timer pass
        anyway (a deadline that moved since it was armed): it must send nothing early (I5, I10)."""
        deadlines = [d for s in self.h.engine.subscriptions() if (d := self.h.engine.next_deadline(s)) is not None]
        if deadlines and min(deadlines) <= self.h.now + dt:
            return
        self.h.tick_to(self.h.now + dt)
        self.h.engine.expire(data.draw(st.sampled_from(self._online())), self.h.now)
        self.h.collect()

    @precondition(lambda self: self._online())
    @rule(data=st.data(), how=st.sampled_from(["close", "unsubscribe"]))
    def leave(self, data: st.DataObject, how: str) -> None:
        sub_id = data.draw(st.sampled_from(self._online()))
        owner = self._owner(sub_id)
        record = self.h.engine.subscription(sub_id)
        assert record is not None
        last_member = len(self._members(owner)) == 1
        if how == "close":
            self.h.engine.close_subscription(sub_id, self.h.now)
        else:
            self.h.engine.unsubscribe(sub_id, self.h.now)
        self.h.collect()
        self._forget_windows()
        kept = record.is_durable and how == "close" and (not record.queue_group or last_member)
        if record.queue_group and not last_member:
            return  # the group lives on in the other members
        if not kept:
            self._forget_owner(owner)

    @rule(client=st.sampled_from(["c1", "c2"]))
    def drop_client(self, client: str) -> None:
        """The client's connection is gone (close or heartbeat timeout); it connects again."""
        mine = [s for s in self._online() if self.h.engine.subscription(s).client_id == client]  # type: ignore[union-attr]
        doomed: list[Owner] = []
        for sub_id in mine:
            record = self.h.engine.subscription(sub_id)
            assert record is not None
            owner = self._owner(sub_id)
            others = [m for m in self._members(owner) if m not in mine]
            if not record.is_durable and not others:
                doomed.append(owner)
        self.h.drop_client(client)
        self.h.client(client)
        self._forget_windows()
        self.hb_failed.discard(client)
        for owner in doomed:
            self._forget_owner(owner)

    def _forget_windows(self) -> None:
        """A subscription that went offline has no window: a durable taken up again (the same id)
        gets its MaxInflight, or what its new door opens."""
        engine = self.h.engine
        self.model.window = {
            s: w for s, w in self.model.window.items() if engine.has_subscription(s) and engine.is_online(s)
        }

    @rule(client=st.sampled_from(["c1", "c2"]), failed=st.booleans())
    def heartbeat(self, client: str, failed: bool) -> None:
        """The client stops (or starts again) answering heartbeats."""
        self.h.engine.set_heartbeat_failed(client, failed, self.h.now)
        self.h.collect()
        if failed:
            self.hb_failed.add(client)
        elif client in self.hb_failed:
            self.hb_failed.discard(client)
            self.hb_recovered[client] = self.h.now

    @rule()
    def restart(self) -> None:
        self.h.collect()
        inspect = self.h.engine.inspect
        # What a nak holds back still waits after the restart (I10), the rest comes first.
        recovered = {s: set(inspect.pending(s)) - set(inspect.naked(s)) for s in self._online()}
        mark = len(self.events)
        self.model.window.clear()  # a new server knows nothing of windows: doors open them again
        self.h.restart()
        self.hb_failed.clear()  # a new server knows nothing of earlier heartbeat failures
        # I8: recovered messages before any new one, per subscription, and all of them at once.
        sent: dict[int, list[tuple[int, Reason]]] = {}
        for _, event in self.events[mark:]:
            if isinstance(event, Delivered):
                sent.setdefault(event.sub.sub_id, []).append((event.seq, event.reason))
        for sub_id, pending in recovered.items():
            reasons = [r for _, r in sent.get(sub_id, [])]
            if Reason.NEW in reasons:
                assert Reason.RESTART not in reasons[reasons.index(Reason.NEW) :], "I8: new before recovered"
            if not self.limit_redeliveries and not self.max_deliver:
                redelivered = {s for s, r in sent.get(sub_id, []) if r is Reason.RESTART}
                assert redelivered == set(pending) - self._evicted(), "I8: not every recovered message came first"

    # -- helpers -----------------------------------------------------------------------------------

    def _online(self) -> list[int]:
        return sorted(s for s in self.h.engine.subscriptions() if self.h.engine.is_online(s))

    def _members(self, owner: Owner) -> list[int]:
        return [s for s in self.h.engine.subscriptions() if self._owner(s) == owner]

    def _forget_owner(self, owner: Owner) -> None:
        for key in [k for k in self.model.sent if k[0] == owner]:
            del self.model.sent[key]
        for key in [k for k in self.model.naked if k[0] == owner]:
            del self.model.naked[key]
        self.model.dead = {k for k in self.model.dead if k[0] != owner}
        for table in (self.model.start, self.model.acked, self.model.last_new, self.model.floor):
            table.pop(owner, None)

    def _evicted(self) -> set[int]:
        info = self.h.store.channel_info(CHANNEL)
        return set(range(1, info.first_seq)) if info else set()

    # -- invariants over the whole state ----------------------------------------------------------

    @invariant()
    def no_loss_and_no_double_ownership(self) -> None:
        info = self.h.store.channel_info(CHANNEL)
        if info is None:
            return
        owners: dict[Owner, list[int]] = {}
        for sub_id in self.h.engine.subscriptions():
            owners.setdefault(self._owner(sub_id), []).append(sub_id)
        for owner, subs in owners.items():
            pendings = [set(self.h.engine.inspect.pending(s)) for s in subs]
            union: set[int] = set().union(*pendings)
            assert sum(len(p) for p in pendings) == len(union), "I2: a message pending on two members"
            record = self.h.engine.subscription(subs[0])
            assert record is not None
            start = self.model.start.get(owner, record.last_sent)
            acked = self.model.acked.get(owner, set())
            dead = {seq for (o, seq) in self.model.dead if o == owner}
            for seq in range(max(start + 1, info.first_seq), record.last_sent + 1):
                assert seq in union or seq in acked or seq in dead, f"I1: {owner} lost message {seq}"
            floor = min(union | {record.last_sent + 1}) - 1
            floor = max(floor, info.first_seq - 1)
            assert floor >= self.model.floor.get(owner, 0), "I7: the ack floor moved back"
            self.model.floor[owner] = floor

    @invariant()
    def max_inflight_and_expiry(self) -> None:
        now = self.h.now
        for sub_id in self._online():
            pending = self.h.engine.inspect.pending(sub_id)
            owner = self._owner(sub_id)
            in_flight = set(pending) - self.h.engine.inspect.waiting(sub_id)
            first_sent = [
                s
                for seq in in_flight
                if (s := self.model.sent.get((owner, seq))) and s.reason is Reason.NEW and s.sub_id == sub_id
            ]
            new_outstanding = len(first_sent)
            limit = self.model.max_inflight[sub_id]
            # A resumed durable may hold more than its new MaxInflight from before (sent under the old
            # one, and nak'd so not redelivered yet): then it must send nothing new until under it.
            since = self.model.incarnation[sub_id]
            sent_since = any(s.subscribes >= since for s in first_sent)
            assert new_outstanding <= limit or not sent_since, (
                f"I3: {new_outstanding} first deliveries in flight > {limit}"
            )
            if self.limit_redeliveries:
                assert self.h.engine.inspect.in_flight(sub_id) <= limit, "I3: in flight beyond MaxInflight"
                continue
            record = self.h.engine.subscription(sub_id)
            assert record is not None
            if record.client_id in self.hb_failed:
                continue  # redeliveries to a client failing heartbeats wait, by design
            assert not self.h.engine.inspect.waiting(sub_id), "I6: due messages are waiting on a healthy subscription"
            deadline = self.h.engine.next_deadline(sub_id)
            assert deadline is None or deadline > now, "I6: an expired message was not redelivered"
            recovered = self.hb_recovered.get(record.client_id, -1.0)
            naked = self.h.engine.inspect.naked(sub_id)
            for seq in pending:
                if seq in naked:
                    assert abs(naked[seq] - self.model.naked[(owner, seq)]) < NAK_EPS, "I10: a nak's end moved"
                    continue
                sent = self.model.sent.get((owner, seq))
                assert sent is not None
                assert now < max(sent.at, recovered) + sent.delay + EPS, f"I6: {seq} overdue on {sub_id}"

    @invariant()
    def a_subscription_with_room_is_fed(self) -> None:
        """I8: a healthy subscription outside queue groups with room under its MaxInflight (or window)
        has been sent everything stored: an ack that frees a slot fills it."""
        info = self.h.store.channel_info(CHANNEL)
        if info is None:
            return
        for sub_id in self._online():
            record = self.h.engine.subscription(sub_id)
            assert record is not None
            if record.queue_group or record.client_id in self.hb_failed:
                continue
            window = self.model.window.get(sub_id, self.model.max_inflight[sub_id])
            if len(self.h.engine.inspect.pending(sub_id)) < window:
                assert record.last_sent >= info.last_seq, f"I8: {sub_id} has room but was not sent {info.last_seq}"

    @invariant()
    def dead_letters_exactly_once(self) -> None:
        if not self.max_deliver:
            return
        info = self.h.store.channel_info(DEAD)
        stored = self.h.store.read(DEAD, 1, 10_000) if info else []
        letters = [json.loads(m.data) for m in stored]
        keys = [(d["sub_id"], d["seq"]) for d in letters]
        assert len(keys) == len(set(keys)), "a message appears twice in the dead-letter channel"
        assert len(keys) == self.model.dead_total, "every message past MaxDeliver is in the dead-letter channel"
        assert all(d["channel"] == CHANNEL and d["attempts"] == self.max_deliver for d in letters)


class EngineWithMaxDeliver(EngineMachine):
    max_deliver = 3


class EngineWithInflightOnRedeliveries(EngineMachine):
    limit_redeliveries = True


TestEngine = EngineMachine.TestCase
TestEngineWithMaxDeliver = EngineWithMaxDeliver.TestCase
TestEngineWithInflightOnRedeliveries = EngineWithInflightOnRedeliveries.TestCase
TestEngine.settings = settings(TestEngine.settings, stateful_step_count=60)
TestEngineWithMaxDeliver.settings = settings(TestEngineWithMaxDeliver.settings, stateful_step_count=60)
TestEngineWithInflightOnRedeliveries.settings = settings(
    TestEngineWithInflightOnRedeliveries.settings, stateful_step_count=60
)
