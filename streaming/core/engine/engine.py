"""The delivery engine: subscriptions, queue groups, durables, AckWait, MaxInflight, redelivery.

One job, the delivery rules, and one state machine: subscribe, deliver, ack, redeliver, leave all
change the same per-subscription and per-group state, so their transitions stay in this one module
(what it leaves to do is gathered by `streaming.core.engine.effects`, channel inactivity is
`activity`, rebuilding after a restart is `recovery` through the public `restore_*` calls here,
read-only queries for tests are `inspection`).

Sans-IO: every call takes `now` (clock seconds, e.g. `trio.current_time()`), changes state, and queues
what the outside must do. The commit pipeline (streaming/core/pipeline.py) takes them, as one `Effects`
record (`take_effects()`):

- `deliveries`: messages to send, in order;
- `dead_letters`: messages past MaxDeliver, to publish (before applying the updates);
- `updates`: subscription/pending records for `Store.apply` (batched, no fsync needed: losing
  them only causes redeliveries);
- `timer_changes`: subscriptions whose next deadline may have moved (or that are gone).

It reads messages from the store (cheap, in-process) and writes nothing to it except through
`ensure_channel` when a subscription names a channel that does not exist yet (a server should create
the channel first, off the event loop, as it must for a publish anyway). Behaviour is NATS
Streaming's by default (subscribe, ack, redeliver, unsubscribe, close); the opt-in options in
`SubOptions` (MaxDeliver with a dead-letter channel, backoff, MaxInflight applied to redeliveries)
and ack-progress change it only for subscriptions that ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

import attrs

# The engine depends on the store's interface only (storage.base), never on an implementation.
from storage.base import Store
from storage.errors import ChannelError
from storage.records import (
    ClearPending,
    ClearPendingRun,
    DeleteSubscription,
    Message,
    SaveSubscription,
    SetLastSent,
    SetPending,
    SetPendingRun,
    StartPosition,
    SubscriptionRecord,
)
from streaming.core import errors
from streaming.core.engine.activity import ChannelActivity
from streaming.core.engine.effects import Effects, EffectsAccumulator
from streaming.core.engine.events import (
    AckedRun,
    AckTimedOut,
    DeadLetter,
    DeadLettered,
    Delivered,
    DeliveredRun,
    Delivery,
    ExpiredByLimit,
    MemberJoined,
    MemberLeft,
    Naked,
    Reason,
    SubscriptionClosed,
    SubscriptionCreated,
    SubscriptionRemoved,
)
from streaming.core.engine.inspection import Inspection
from streaming.core.engine.pending import PendingSet
from streaming.core.engine.reader import MessageReader
from streaming.core.engine.state import (
    Client,
    Group,
    Sub,
    SubscribeRequest,
    SubscriptionView,
    Wildcard,
    WildGroup,
    group_key,
    ref,
)
from streaming.core.errors import RequestError
from streaming.wire.subjects import has_wildcard

READ_BATCH = 256
# The most messages one pump of a subscription (or a queue group) sends in one engine step; what is
# left is sent by `pump_more` in the next step, after the runtime let the deliveries out and other
# clients in. A durable resumed with 100,000 pending, or a MaxInflight of 100,000 over a backlog,
# would otherwise hold the event loop for ~0.5 s before its first message went out.
PUMP_STEP = 4096
# The longest a negative ack may hold a message back (a longer delay is cut to it): 30 days.
MAX_NAK_DELAY_S = 30 * 24 * 3600.0


class Engine(EffectsAccumulator):
    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self._subs: dict[int, Sub] = {}
        self._by_ack_inbox: dict[str, int] = {}
        self._plain: dict[str, dict[int, Sub]] = {}  # channel -> online non-queue subscriptions
        self._groups: dict[str, dict[str, Group]] = {}  # channel -> group key -> group
        self._durables: dict[tuple[str, str, str], Sub] = {}  # (client, channel, durable name)
        self._by_channel: dict[str, dict[int, Sub]] = {}  # every subscription, online or not (max_subs)
        self._clients: dict[str, Client] = {}
        self._reader = MessageReader(store)
        self._to_pump: dict[int, float] = {}  # subscriptions acks made room in -> the latest ack's now
        self._more: dict[int, float] = {}  # subscriptions a pump left with more to send (PUMP_STEP)
        self._last_seq: dict[str, int] = {}  # channel -> last stored sequence (kept by on_appended)
        # Recovered naks still waiting out their delay: (subscription, seq, seconds left, end in Unix
        # ns), made to wait at `start`.
        self._recovered_naks: list[tuple[Sub, int, float, int]] = []
        # Wildcard subscriptions (docs/engine.md, *Wildcard subscriptions*): by the pattern's sub id,
        # the durable ones also by (client, pattern, durable name); and the channels already matched
        # against them (a channel seen for the first time may need a part in each).
        self._wild: dict[int, Wildcard] = {}
        self._wild_durables: dict[tuple[str, str, str], Wildcard] = {}
        self._wild_groups: dict[tuple[str, str], WildGroup] = {}  # (pattern, group key) -> its group
        self._matched: set[str] = set()
        self._activity = ChannelActivity(store, self._active_subs)

    # -- outputs ---------------------------------------------------------------------------------

    def has_effects(self) -> bool:
        return bool(self._to_pump or self._deliveries or self._dead or self._updates or self._timers or self._events)

    def take_effects(self) -> Effects:
        """Everything queued since the last call, in one record (see the module docstring); first the
        subscriptions acks made room in are filled."""
        if self._to_pump:
            self._pump_acked()
        return self._take()

    def _pump_acked(self) -> None:
        to_pump, self._to_pump = self._to_pump, {}
        for sub_id, now in to_pump.items():
            sub = self._subs.get(sub_id)
            if sub is not None and sub.online:
                self._pump_sub(sub, now)

    def has_more(self) -> bool:
        """Some subscription has more to send than one step sends (`pump_more`)."""
        return bool(self._more)

    def pump_more(self, now: float) -> None:
        """Go on sending what the last steps' pumps left (PUMP_STEP), one more step's worth each."""
        more, self._more = self._more, {}
        for sub_id in more:
            sub = self._subs.get(sub_id)
            if sub is not None and sub.online:
                self._pump_sub(sub, now)

    def mark_timer(self, sub_id: int) -> None:
        """Have the runtime look at this subscription's deadline again."""
        self._timers.add(sub_id)

    # -- queries -----------------------------------------------------------------------------------

    def next_deadline(self, sub_id: int) -> float | None:
        """When this subscription's timer should fire next (None: it needs no timer now)."""
        sub = self._subs.get(sub_id)
        if sub is None or not sub.online:
            return None
        return sub.pending.next_deadline()

    def sub_for_ack_inbox(self, ack_inbox: str) -> int | None:
        return self._by_ack_inbox.get(ack_inbox)

    def ack_target(self, ack_inbox: str) -> tuple[int, str] | None:
        """(subscription, its client ID) that acks sent to `ack_inbox` are for (None: no such)."""
        sub_id = self._by_ack_inbox.get(ack_inbox)
        if sub_id is None:
            return None
        sub = self._subs.get(sub_id)
        return sub_id, (sub.record if sub is not None else self._wild[sub_id].record).client_id

    def holds(self, sub_id: int, seq: int) -> bool:
        sub = self._subs.get(sub_id)
        return sub is not None and seq in sub.pending

    def is_wildcard(self, sub_id: int) -> bool:
        return sub_id in self._wild

    def part_for(self, sub_id: int, channel: str) -> int | None:
        """The subscription that holds `channel`'s messages for `sub_id`: for a wildcard subscription
        its part on that channel (None: it follows no such channel), else `sub_id` itself."""
        wild = self._wild.get(sub_id)
        if wild is None:
            return sub_id
        part = wild.parts.get(channel)
        return None if part is None else part.record.sub_id

    def has_subscription(self, sub_id: int) -> bool:
        return sub_id in self._subs or sub_id in self._wild

    def subscription(self, sub_id: int) -> SubscriptionRecord | None:
        sub = self._subs.get(sub_id)
        if sub is None:
            wild = self._wild.get(sub_id)
            return None if wild is None else wild.record
        return attrs.evolve(sub.record, last_sent=self._position(sub))

    def subscriptions(self) -> list[int]:
        return [*self._subs, *self._wild]

    def views(self) -> list[SubscriptionView]:
        """Every subscription as monitoring shows it (O(subscriptions); for scrapes, not hot paths): a
        wildcard subscription once with its pattern (its pending messages over all its channels), and
        each of its parts on its channel (`record.parent_id` set)."""
        views = [
            SubscriptionView(
                attrs.evolve(sub.record, last_sent=self._position(sub)), sub.online, len(sub.pending), sub.stalled
            )
            for sub in self._subs.values()
        ]
        for wild in self._wild.values():
            full = wild.count >= wild.record.max_inflight
            views.append(SubscriptionView(wild.record, wild.online, wild.count, full))
        return views

    @property
    def inspect(self) -> Inspection:
        """Queries for tests, benchmarks and debugging (not used by the server)."""
        return Inspection(self)

    def state_of(self, sub_id: int) -> Sub:
        """What the engine holds of one subscription (for `Inspection`: read it, never change it)."""
        return self._subs[sub_id]

    def client_ids(self) -> list[str]:
        return list(self._clients)

    def is_online(self, sub_id: int) -> bool:
        sub = self._subs.get(sub_id)
        return sub.online if sub is not None else self._wild[sub_id].online

    def _position(self, sub: Sub) -> int:
        return sub.group.last_sent if sub.group is not None else sub.last_sent

    # -- clients -------------------------------------------------------------------------------

    def add_client(self, client_id: str) -> None:
        self._clients.setdefault(client_id, Client())

    def has_client(self, client_id: str) -> bool:
        return client_id in self._clients

    def client_closed(self, client_id: str, now: float) -> None:
        """Connection close, heartbeat timeout or replacement: each subscription as on `close`."""
        client = self._clients.pop(client_id, None)
        if client is None:
            return
        for sub_id in sorted(client.subs):
            sub = self._subs.get(sub_id)
            if sub is not None and sub.online:
                self._leave(sub, now, keep_durable=True)
            elif sub_id in self._wild:
                self._leave_wildcard(self._wild[sub_id], now, keep_durable=True)

    def set_heartbeat_failed(self, client_id: str, failed: bool, now: float) -> None:
        client = self._clients.get(client_id)
        if client is None or client.hb_failed == failed:
            return
        client.hb_failed = failed
        if not failed:
            for sub_id in sorted(client.subs):
                sub = self._subs.get(sub_id)
                if sub is not None and sub.online:
                    self._pump_sub(sub, now)
                elif sub_id in self._wild:
                    for part in list(self._wild[sub_id].parts.values()):
                        self._pump_sub(part, now)

    def _hb_failed(self, sub: Sub) -> bool:
        client = self._clients.get(sub.record.client_id)
        return client is not None and client.hb_failed

    # -- subscribing ---------------------------------------------------------------------------

    def subscribe(self, request: SubscribeRequest, now: float, wall_unix_ns: int) -> int:
        """Create, resume or join; returns the subscription id. Raises RequestError with STAN's text.

        Deliveries it queues must be sent after the SubscriptionResponse.
        """
        client = self._clients.get(request.client_id)
        if client is None:
            raise RequestError(errors.UNKNOWN_CLIENT)
        if has_wildcard(request.channel):
            return self._subscribe_wildcard(request, client, now, wall_unix_ns)
        try:
            self.store.ensure_channel(request.channel)
        except ChannelError as exc:
            raise RequestError(str(exc)) from exc
        if request.queue_group:
            if request.durable_name and ":" in request.durable_name:
                raise RequestError(errors.DURABLE_QUEUE_COLON)
            sub = self._join_group(request, now, wall_unix_ns)
        elif request.durable_name:
            sub = self._durable(request, now, wall_unix_ns)
        else:
            self._check_room(request.channel)
            sub = self._new_sub(request, self._start_after(request, wall_unix_ns), None)
        client.subs.add(sub.record.sub_id)
        self._by_ack_inbox[sub.record.ack_inbox] = sub.record.sub_id
        if sub.group is None:
            self._plain.setdefault(sub.record.channel, {})[sub.record.sub_id] = sub
        self._updates.append(SaveSubscription(attrs.evolve(sub.record, last_sent=self._position(sub))))
        self._pump_sub(sub, now)
        return sub.record.sub_id

    def durable_bindings(self, channel: str, durable_name: str, client_id: str) -> list[str]:
        """The queue groups durable `durable_name` names on `channel` (live or keeping an empty
        group's state), and "" when `client_id` holds a durable of that name outside any group."""
        found = [
            group.name.split(":", 1)[1]
            for group in self._groups.get(channel, {}).values()
            if group.durable and group.name.split(":", 1)[0] == durable_name
        ]
        if (client_id, channel, durable_name) in self._durables:
            found.append("")
        return found

    def creates_durable(self, request: SubscribeRequest) -> bool:
        """Whether `subscribe(request)` would make a durable (or durable queue group) that does not exist."""
        if not request.durable_name:
            return False
        if has_wildcard(request.channel):
            return (request.client_id, request.channel, request.durable_name) not in self._wild_durables
        if request.queue_group:
            group = self._groups.get(request.channel, {}).get(group_key(request.durable_name, request.queue_group))
            return group is None
        return (request.client_id, request.channel, request.durable_name) not in self._durables

    def _check_room(self, channel: str) -> None:
        max_subs = self.store.limits.max_subs
        if max_subs > 0 and len(self._by_channel.get(channel, ())) >= max_subs:
            raise RequestError(errors.TOO_MANY_SUBS)

    def _record_for(self, request: SubscribeRequest, last_sent: int) -> SubscriptionRecord:
        """A new subscription's record, with a new id."""
        return SubscriptionRecord(
            sub_id=self.store.new_subscription_id(),
            channel=request.channel,
            client_id=request.client_id,
            inbox=request.inbox,
            ack_inbox=request.ack_inbox,
            ack_wait_ms=request.ack_wait_ms,
            max_inflight=request.max_inflight,
            durable_name=request.durable_name,
            queue_group=request.queue_group,
            start_position=request.start_position,
            start_sequence=request.start_sequence,
            start_time_delta_ns=request.start_time_delta_ns,
            last_sent=last_sent,
            is_durable=bool(request.durable_name),
            options=request.options,
            exclude=request.exclude,
        )

    @staticmethod
    def _resumed(record: SubscriptionRecord, request: SubscribeRequest) -> SubscriptionRecord:
        """A durable's record taken up again by `request`: its inboxes, AckWait, MaxInflight, options."""
        return attrs.evolve(
            record,
            client_id=request.client_id,
            inbox=request.inbox,
            ack_inbox=request.ack_inbox,
            ack_wait_ms=request.ack_wait_ms,
            max_inflight=request.max_inflight,
            options=request.options,
            is_closed=False,
        )

    def _new_sub(self, request: SubscribeRequest, last_sent: int, group: Group | None) -> Sub:
        record = self._record_for(request, last_sent)
        sub = Sub(record, group, online=True)
        if request.on_demand:
            sub.window = 0
        self._add(sub)
        self._emit_if(SubscriptionCreated(sub.ref, resumed=False))
        return sub

    def _durable(self, request: SubscribeRequest, now: float, wall_unix_ns: int) -> Sub:
        key = (request.client_id, request.channel, request.durable_name)
        sub = self._durables.get(key)
        if sub is not None and sub.online:
            raise RequestError(errors.DUPLICATE_DURABLE)
        if sub is None:
            self._check_room(request.channel)
            sub = self._new_sub(request, self._start_after(request, wall_unix_ns), None)
            self._durables[key] = sub
            return sub
        # Resume: same position and pending; the new request's inboxes, AckWait and MaxInflight.
        self._resume(sub, request, now)
        return sub

    def _resume(self, sub: Sub, request: SubscribeRequest, now: float) -> None:
        self._by_ack_inbox.pop(sub.record.ack_inbox, None)
        sub.record = self._resumed(sub.record, request)
        sub.ref = ref(sub.record)
        sub.window = 0 if request.on_demand else request.max_inflight
        sub.online = True
        sub.pending.make_all_due(Reason.RESUME)
        sub.pending.release_naks(now)  # those whose delay ended while it was away
        self._emit_if(SubscriptionCreated(sub.ref, resumed=True))

    def _join_group(self, request: SubscribeRequest, now: float, wall_unix_ns: int) -> Sub:
        key = group_key(request.durable_name, request.queue_group)
        groups = self._groups.setdefault(request.channel, {})
        group = groups.get(key)
        if group is not None and group.ordered != request.options.ordered:
            raise RequestError(errors.ORDERED_MISMATCH)
        if group is not None and group.shadow is not None:
            sub = group.shadow  # the first member back takes over the empty durable group's state
            group.shadow = None
            self._resume(sub, request, now)
        else:
            self._check_room(request.channel)
            if group is None:
                group = groups[key] = Group(
                    request.channel,
                    key,
                    bool(request.durable_name),
                    self._start_after(request, wall_unix_ns),
                    request.options.ordered,
                )
            sub = self._new_sub(request, group.last_sent, group)
        group.members.append(sub)
        self._emit_if(MemberJoined(sub.ref))
        return sub

    def _start_after(self, request: SubscribeRequest, wall_unix_ns: int, channel: str = "") -> int:
        """The sequence after which a brand-new subscription or group starts on `channel` (default: the
        request's) at its start position."""
        channel = channel or request.channel
        info = self.store.channel_info(channel)
        assert info is not None
        position = request.start_position
        if position is StartPosition.LAST_RECEIVED:
            return info.last_seq - 1 if info.msgs else info.last_seq
        if position is StartPosition.TIME_DELTA_START:
            since = wall_unix_ns - request.start_time_delta_ns
            return self.store.first_seq_at_or_after(channel, since) - 1
        if position is StartPosition.SEQUENCE_START:
            wanted = request.start_sequence
            if wanted < info.first_seq:
                return info.first_seq - 1
            return info.last_seq if wanted > info.last_seq else wanted - 1
        if position is StartPosition.FIRST:
            return info.first_seq - 1
        return info.last_seq

    # -- wildcard subscriptions ------------------------------------------------------------------

    def _subscribe_wildcard(self, request: SubscribeRequest, client: Client, now: float, wall_unix_ns: int) -> int:
        """Create, resume or join a subscription to a pattern: a part on every channel it follows, each
        at the request's start position on that channel (a resumed durable keeps each part's; a queue
        member's parts join the channels' groups of its wildcard group)."""
        if request.on_demand:
            raise RequestError(errors.WILDCARD_ON_DEMAND)
        if request.queue_group:
            if request.durable_name and ":" in request.durable_name:
                raise RequestError(errors.DURABLE_QUEUE_COLON)
            wild = self._join_wild_group(request, now, wall_unix_ns)
        else:
            key = (request.client_id, request.channel, request.durable_name)
            found = self._wild_durables.get(key) if request.durable_name else None
            if found is not None and found.online:
                raise RequestError(errors.DUPLICATE_DURABLE)
            if found is None:
                wild = self._new_wildcard(request, None, wall_unix_ns)
                if request.durable_name:
                    self._wild_durables[key] = wild
            else:
                wild = found
                self._resume_wildcard(wild, request, now)
        sub_id = wild.record.sub_id
        client.subs.add(sub_id)
        self._by_ack_inbox[request.ack_inbox] = sub_id
        for part in list(wild.parts.values()):
            self._pump_sub(part, now)
        return sub_id

    def _new_wildcard(self, request: SubscribeRequest, wild_group: WildGroup | None, wall_unix_ns: int) -> Wildcard:
        record = self._record_for(request, 0)
        wild = Wildcard(record, online=True, group=wild_group)
        self._wild[record.sub_id] = wild
        self._updates.append(SaveSubscription(record))
        self._emit_if(SubscriptionCreated(ref(record), resumed=False))
        for info in self.store.channels():
            self._matched.add(info.name)
            if not wild.follows(info.name):
                continue
            if wild_group is None:
                self._add_part(wild, info.name, self._start_after(request, wall_unix_ns, info.name))
            else:
                start = self._start_after(request, wall_unix_ns, info.name)  # used if the group is new there
                group = self._channel_group(wild_group, info.name, start)
                self._add_part(wild, info.name, group.last_sent, group)
        return wild

    def _channel_group(self, wild_group: WildGroup, channel: str, start_after: int) -> Group:
        """A wildcard queue group's `Group` on `channel`, made (new messages after `start_after`) if it
        has none there yet."""
        groups = self._groups.setdefault(channel, {})
        key = wild_group.channel_key
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(channel, key, wild_group.durable, start_after, wild_group.ordered)
        return group

    def _resume_wildcard(self, wild: Wildcard, request: SubscribeRequest, now: float) -> None:
        """A durable wildcard subscription (or an empty durable wildcard group's shadow) taken up again."""
        wild.online = True
        wild.record = self._resumed(wild.record, request)
        self._updates.append(SaveSubscription(wild.record))
        self._emit_if(SubscriptionCreated(ref(wild.record), resumed=True))
        for part in wild.parts.values():
            self._resume(part, request, now)
            if part.group is None:
                self._plain.setdefault(part.record.channel, {})[part.record.sub_id] = part
            else:
                part.group.shadow = None
                part.group.members.append(part)
            self._updates.append(SaveSubscription(attrs.evolve(part.record, last_sent=self._position(part))))

    def _join_wild_group(self, request: SubscribeRequest, now: float, wall_unix_ns: int) -> Wildcard:
        key = group_key(request.durable_name, request.queue_group)
        wild_group = self._wild_groups.get((request.channel, key))
        if wild_group is not None and wild_group.ordered != request.options.ordered:
            raise RequestError(errors.ORDERED_MISMATCH)
        if wild_group is not None and wild_group.shadow is not None:
            wild = wild_group.shadow  # the first member back takes over the empty durable group's state
            wild_group.shadow = None
            self._resume_wildcard(wild, request, now)
        else:
            if wild_group is None:
                wild_group = self._wild_groups[(request.channel, key)] = WildGroup(
                    request.channel, key, bool(request.durable_name), request.options.ordered
                )
            wild = self._new_wildcard(request, wild_group, wall_unix_ns)
        wild_group.members.append(wild)
        return wild

    def _add_part(self, wild: Wildcard, channel: str, last_sent: int, group: Group | None = None) -> Sub:
        """A wildcard subscription's part on `channel`, new messages after `last_sent` (in `group`, its
        wildcard group's group on that channel, for a queue member)."""
        record = attrs.evolve(
            wild.record,
            sub_id=self.store.new_subscription_id(),
            channel=channel,
            last_sent=last_sent,
            parent_id=wild.record.sub_id,
            exclude=(),
        )
        part = self._attach_part(wild, record, group)
        self._updates.append(SaveSubscription(record))
        return part

    def _attach_part(self, wild: Wildcard, record: SubscriptionRecord, group: Group | None = None) -> Sub:
        part = Sub(record, group, wild.online, wild)
        wild.parts[record.channel] = part
        self._add(part)
        if group is not None:
            if wild.online:
                group.members.append(part)
            else:
                group.shadow = part  # an empty durable wildcard group keeps its state on each channel
        elif wild.online:
            self._plain.setdefault(record.channel, {})[record.sub_id] = part
        return part

    def _match_channel(self, channel: str, now: float) -> None:
        """A channel seen for the first time since the wildcard subscriptions were made (or since a
        restart): each that follows it and has no part there gets one, from its first message (the
        channel appeared after the subscription, so all of it is new to it)."""
        self._matched.add(channel)
        info = self.store.channel_info(channel)
        if info is None:
            return
        made: list[Sub] = []
        for wild in list(self._wild.values()):
            if channel in wild.parts or not wild.follows(channel):
                continue
            group = None
            if wild.group is not None:
                group = self._channel_group(wild.group, channel, info.first_seq - 1)
            part = self._add_part(wild, channel, info.first_seq - 1 if group is None else group.last_sent, group)
            if wild.online:
                made.append(part)
        for part in made:  # once all are made: a group's first message must have all its members to pick from
            self._pump_sub(part, now)

    def _leave_wildcard(self, wild: Wildcard, now: float, *, keep_durable: bool) -> None:
        """Unsubscribe or close a wildcard subscription: each part leaves its channel as a subscription
        (or a queue member) does. A closed durable, or the last member of a durable wildcard group,
        keeps every part's position and pending messages for its return."""
        record = wild.record
        self._by_ack_inbox.pop(record.ack_inbox, None)
        client = self._clients.get(record.client_id)
        if client is not None:
            client.subs.discard(record.sub_id)
        wild.waiting.clear()
        wild.stalled_groups.clear()
        wild_group = wild.group
        if wild_group is not None:
            wild_group.members.remove(wild)
            keep = not wild_group.members and wild_group.durable and keep_durable
        else:
            keep = record.is_durable and keep_durable
        for part in list(wild.parts.values()):
            self._leave(part, now, keep_durable=keep)
        if keep:
            wild.online = False
            wild.record = attrs.evolve(record, is_closed=True)
            if wild_group is not None:
                wild_group.shadow = wild
            self._updates.append(SaveSubscription(wild.record))
            self._emit_if(SubscriptionClosed(ref(record)))
            return
        wild.parts.clear()
        del self._wild[record.sub_id]
        if wild_group is None:
            self._wild_durables.pop((record.client_id, record.channel, record.durable_name), None)
        elif not wild_group.members:
            del self._wild_groups[(wild_group.pattern, wild_group.key)]
        self._updates.append(DeleteSubscription(record.sub_id))
        self._emit_if(SubscriptionRemoved(ref(record)))

    # -- leaving -------------------------------------------------------------------------------

    def unsubscribe(self, sub_id: int, now: float) -> None:
        self._end(sub_id, now, keep_durable=False)

    def close_subscription(self, sub_id: int, now: float) -> None:
        self._end(sub_id, now, keep_durable=True)

    def _end(self, sub_id: int, now: float, *, keep_durable: bool) -> None:
        sub = self._subs.get(sub_id)
        if sub is not None and sub.wild is None:
            self._leave(sub, now, keep_durable=keep_durable)
        elif sub_id in self._wild:
            self._leave_wildcard(self._wild[sub_id], now, keep_durable=keep_durable)
        else:
            raise RequestError(errors.INVALID_SUBSCRIPTION)

    def _leave(self, sub: Sub, now: float, *, keep_durable: bool) -> None:
        record = sub.record
        self._activity.touched(record.channel, now)  # the inactivity clock counts from the last one leaving
        self._by_ack_inbox.pop(record.ack_inbox, None)
        client = self._clients.get(record.client_id)
        if client is not None:
            client.subs.discard(record.sub_id)
        self._timers.add(record.sub_id)
        group = sub.group
        if group is None:
            self._plain.get(record.channel, {}).pop(record.sub_id, None)
            if record.is_durable and keep_durable:
                self._go_offline(sub)
            else:
                self._delete(sub)
            return
        group.members.remove(sub)
        if group.members:
            moved = self._hand_over(sub, group, now)
            self._emit_if(MemberLeft(sub.ref, moved))
            self._delete(sub)
            return
        self._emit_if(MemberLeft(sub.ref, 0))
        if group.durable and keep_durable:
            group.shadow = sub
            self._go_offline(sub)
        else:
            del self._groups[record.channel][group.name]
            self._delete(sub)

    def _add(self, sub: Sub) -> None:
        self._subs[sub.record.sub_id] = sub
        self._by_channel.setdefault(sub.record.channel, {})[sub.record.sub_id] = sub

    def _go_offline(self, sub: Sub) -> None:
        sub.online = False
        sub.record = attrs.evolve(sub.record, is_closed=True)
        self._updates.append(SaveSubscription(attrs.evolve(sub.record, last_sent=self._position(sub))))
        self._emit_if(SubscriptionClosed(sub.ref))

    def _delete(self, sub: Sub) -> None:
        record = sub.record
        del self._subs[record.sub_id]
        del self._by_channel[record.channel][record.sub_id]
        if record.is_durable and record.queue_group == "" and sub.wild is None:
            self._durables.pop((record.client_id, record.channel, record.durable_name), None)
        self._updates.append(DeleteSubscription(record.sub_id))
        self._emit_if(SubscriptionRemoved(sub.ref))

    def _hand_over(self, leaving: Sub, group: Group, now: float) -> int:
        """A leaving member's pending messages go round-robin to the others, due at once, but those
        given back with a nak, which wait out their delay on the member they go to."""
        pending = leaving.pending
        order = [(seq, pending.attempt(seq)) for seq in pending]  # due first, then by deadline, then nak'd
        self._distribute(group, order, Reason.MEMBER_LEFT, pending if pending.nak_count else None)
        # The group's position must survive the leaving member's record.
        self._updates.append(SetLastSent(group.members[0].record.sub_id, group.last_sent))
        self._pump_group(group, now)
        return len(order)

    def _distribute(
        self, group: Group, messages: list[tuple[int, int]], reason: Reason, naks: PendingSet | None = None
    ) -> None:
        """Hand (seq, attempt) pairs round-robin to the group's members, due at once and persisted
        (those `naks` holds back for a nak's delay wait for it where they go)."""
        targets = group.members
        for i, (seq, attempt) in enumerate(messages):
            target = targets[i % len(targets)]
            self._give(target, seq, attempt, reason)
            until = naks.naked_until(seq) if naks is not None else None
            if until is not None:
                target.pending.nak(seq, *until)
                self._updates.append(SetPending(target.record.sub_id, seq, attempt, not_before_ns=until[1]))

    def _give(self, target: Sub, seq: int, attempt: int, reason: Reason) -> None:
        """Make `seq` pending on `target`, due at once. Persisted now: the target may not be able to
        send it yet (full, or failing heartbeats), and a restart must still find it there."""
        target.pending.add_due(seq, attempt, reason)
        self._updates.append(SetPending(target.record.sub_id, seq, attempt))
        self._timers.add(target.record.sub_id)

    # -- acks ----------------------------------------------------------------------------------

    def ack(self, sub_id: int, seq: int, now: float) -> bool:
        """Apply an ack; False if it was stale, duplicate or unknown (ignored)."""
        sub = self._subs.get(sub_id)
        if sub is None:
            return False
        owner: Sub | None = sub
        removed = sub.pending.remove(seq)
        if removed is None:
            owner = self._owner(sub, seq)  # another member of its queue group may hold it
            if owner is None:
                return False
            removed = owner.pending.remove(seq)
            assert removed is not None
        assert owner is not None
        owner_id = owner.record.sub_id
        self._updates.append(ClearPending(owner_id, seq))
        if self._observers:
            run = self._ack_run
            if run is not None and run.sub is owner.ref:  # the next ack of a run (one read's)
                run.seqs.append(seq)
                run.acked.append(removed)
            else:
                self._ack_run = run = AckedRun(owner.ref, now, [seq], [removed])
                self._events.append(run)
            if removed[0] != 1:
                run.first_attempts = False
        self._timers.add(owner_id)
        if owner.online:
            # Filled at the next `take_effects`: a burst of acks read together costs one pump of the
            # subscription (one store read, one position update), not one per ack.
            self._to_pump[owner_id] = now
        return True

    def ack_many(self, sub_id: int, seqs: list[int], now: float) -> int:
        """`ack` of each of `seqs` on one subscription (a read's burst of acks); how many counted."""
        sub = self._subs.get(sub_id)
        if sub is None or not seqs:
            return 0
        removed, first_attempts = sub.pending.remove_many(seqs)
        if None in removed:
            return self._ack_some(sub, seqs, removed, now)
        own_id = sub.record.sub_id
        self._updates.append(ClearPendingRun(own_id, seqs.copy()))  # the caller's list stays its own
        if self._observers:
            run = self._ack_run
            if run is None or run.sub is not sub.ref:
                self._ack_run = run = AckedRun(sub.ref, now, [], [])
                self._events.append(run)
            run.seqs += seqs
            run.acked += removed  # type: ignore[arg-type]  # no None in it
            if not first_attempts:
                run.first_attempts = False
        self._timers.add(own_id)
        if sub.online:
            self._to_pump[own_id] = now
        return len(seqs)

    def _ack_some(self, sub: Sub, seqs: list[int], removed: list[tuple[int, float] | None], now: float) -> int:
        """`ack_many` when some of `seqs` were not pending on `sub` (`removed` has None for those): each
        of those the general way, in order among the others."""
        own_id = sub.record.sub_id
        run = self._ack_run if self._observers else None
        if run is not None and run.sub is not sub.ref:
            run = None
        cleared: list[int] = []
        acked = 0
        for seq, entry in zip(seqs, removed, strict=True):
            if entry is None:
                # Unknown, a duplicate, or held by another member of its queue group: the general way.
                acked += self.ack(own_id, seq, now)
                run = None  # `ack` may have started another member's run
                continue
            cleared.append(seq)
            if self._observers:
                if run is None:
                    run = self._ack_run
                    if run is None or run.sub is not sub.ref:
                        self._ack_run = run = AckedRun(sub.ref, now, [], [])
                        self._events.append(run)
                run.seqs.append(seq)
                run.acked.append(entry)
                if entry[0] != 1:
                    run.first_attempts = False
        if cleared:
            self._updates.append(ClearPendingRun(own_id, cleared))
            self._timers.add(own_id)
            if sub.online:
                self._to_pump[own_id] = now
        return acked + len(cleared)

    def set_window(self, sub_id: int, window: int, now: float) -> None:
        """Deliveries on demand: the subscription may hold `window` pending messages (never more than
        its MaxInflight) before new ones wait. A wider window is filled at the next `take_effects`;
        redeliveries are not held back by it (a pull door keeps them until they are pulled)."""
        sub = self._subs.get(sub_id)
        if sub is None:
            return
        window = max(0, min(window, sub.record.max_inflight))
        if window > sub.window and sub.online:
            self._to_pump[sub_id] = now
        sub.window = window

    def nak(self, sub_id: int, seq: int, delay: float, now: float, wall_unix_ns: int) -> bool:
        """A negative ack: the subscriber gives `seq` back, to be sent again once `delay` seconds have
        passed (0: at once) as its next attempt (MaxDeliver counts it). Meanwhile it stays pending
        (unacknowledged: MaxInflight counts it) and not in flight (its AckWait no longer runs); the
        time it comes back is stored with it, so a restart keeps it waiting. In a queue group it goes
        to whichever member can take it then. A delay over MAX_NAK_DELAY_S is cut to it. False if it
        was not pending (stale, duplicate, unknown)."""
        sub = self._subs.get(sub_id)
        owner = None if sub is None else self._owner(sub, seq)
        if owner is None:
            return False
        delay = min(max(0.0, delay), MAX_NAK_DELAY_S)
        until_ns = wall_unix_ns + round(delay * 1e9)
        owner.pending.nak(seq, now + delay, until_ns)
        attempt = owner.pending.attempt(seq)
        owner_id = owner.record.sub_id
        self._updates.append(SetPending(owner_id, seq, attempt, not_before_ns=until_ns))
        self._timers.add(owner_id)
        self._emit_if(Naked(owner.ref, seq, attempt, delay))
        if not delay:
            self.expire(owner_id, now)  # back at once, in this step (not at the runtime's next timer pass)
        return True

    def ack_progress(self, sub_id: int, seq: int, now: float) -> bool:
        """A "working" ack: restart the wait of one in-flight message without acking it."""
        sub = self._subs.get(sub_id)
        owner = None if sub is None else self._owner(sub, seq)
        if owner is None or not owner.pending.touch(seq, now):
            return False
        self._timers.add(owner.record.sub_id)
        return True

    def _owner(self, sub: Sub, seq: int) -> Sub | None:
        """Who has `seq` pending: the subscription, or for a queue member any member of its group (a
        message redistributed to another member may still be acked by the one it was first sent to)."""
        if seq in sub.pending:
            return sub
        if sub.group is not None:
            for member in sub.group.members:
                if member is not sub and seq in member.pending:
                    return member
        return None

    # -- messages arriving and leaving the channel ----------------------------------------------

    def on_appended(self, channel: str, now: float, messages: Sequence[Message] = ()) -> None:
        """New messages were committed to `channel` (pass them to spare the store a read)."""
        self._activity.touched(channel, now)
        if self._wild and channel not in self._matched:
            self._match_channel(channel, now)
        info = self.store.channel_info(channel)
        if info is not None:
            self._last_seq[channel] = info.last_seq
        if messages and info is not None:
            # A batch that went over a limit may have evicted some of its own messages already.
            kept = messages[max(0, info.first_seq - messages[0].seq) :]
            self._reader.hold_appended(channel, kept)
        plain = list(self._plain.get(channel, {}).values())
        groups = list(self._groups.get(channel, {}).values())
        for sub in plain:
            self._pump_sub(sub, now)
        for group in groups:
            self._pump_group(group, now)
        # Where each reader stands decides whether the batch stays in the cache (none held: no matter).
        positions = [sub.last_sent for sub in plain] + [group.last_sent for group in groups] if messages else []
        self._reader.release_appended(channel, positions)

    def has_readers(self, channel: str) -> bool:
        """Whether any online subscription or queue group on `channel` may want new messages (when
        none does, a publisher need not build the messages for `on_appended`)."""
        return bool(self._plain.get(channel) or self._groups.get(channel))

    def on_dropped(self, channel: str, dropped: range) -> None:
        """Messages evicted by limits leave every pending set and are never redelivered."""
        self._reader.forget()
        for sub in self._by_channel.get(channel, {}).values():
            if len(dropped) <= len(sub.pending):
                gone = [seq for seq in dropped if seq in sub.pending]
            else:
                gone = [seq for seq in sub.pending if seq in dropped]
            for seq in gone:
                self._forget(sub, seq)
                self._emit_if(ExpiredByLimit(sub.ref, seq))
            if gone:
                self._timers.add(sub.record.sub_id)

    def _forget(self, sub: Sub, seq: int) -> None:
        sub.pending.remove(seq)
        self._updates.append(ClearPending(sub.record.sub_id, seq))

    # -- channel inactivity (MaxInactivity) ------------------------------------------------------

    def _active_subs(self, channel: str) -> bool:
        # A wildcard's part keeps its channel only while it has messages pending there: a family of
        # channels followed by a pattern is still cleaned up channel by channel.
        plain = self._plain.get(channel, {})
        if any(sub.wild is None or len(sub.pending) for sub in plain.values()):
            return True
        groups = self._groups.get(channel, {}).values()
        return any(member.wild is None or len(member.pending) for g in groups for member in g.members)

    def inactive_channels(self, now: float) -> list[str]:
        """Channels idle for their MaxInactivity: no active subscription (offline durables and empty
        durable groups do not count) and no publish for that long. The caller deletes each one from
        the store and then calls `drop_channel`."""
        return self._activity.inactive(now)

    def next_inactivity_check(self, now: float) -> float | None:
        """When the next channel could become idle enough to delete (None: no channel has the limit)."""
        return self._activity.next_check(now)

    def drop_channel(self, channel: str) -> None:
        """Forget a deleted channel and everything on it (offline durables, empty durable groups)."""
        for sub in self._by_channel.pop(channel, {}).values():
            record = sub.record
            del self._subs[record.sub_id]
            if sub.wild is not None:  # a wildcard's part: the wildcard goes on with its other channels
                sub.wild.count -= len(sub.pending)  # what it held is gone with the channel
                sub.wild.parts.pop(channel, None)
                sub.wild.waiting.pop(record.sub_id, None)
                self._timers.add(record.sub_id)
                continue
            self._by_ack_inbox.pop(record.ack_inbox, None)
            self._durables.pop((record.client_id, record.channel, record.durable_name), None)
            client = self._clients.get(record.client_id)
            if client is not None:
                client.subs.discard(record.sub_id)
            self._timers.add(record.sub_id)
            self._emit_if(SubscriptionRemoved(sub.ref))
        for table in (self._plain, self._groups, self._last_seq):
            table.pop(channel, None)
        self._activity.forget(channel)
        self._matched.discard(channel)
        self._reader.release_appended(channel)
        self._reader.forget()

    # -- delivery ------------------------------------------------------------------------------

    def _pump_sub(self, sub: Sub, now: float) -> None:
        if sub.group is not None:
            self._pump_group(sub.group, now)
            wild = sub.wild
            if wild is not None and wild.stalled_groups:
                self._serve_stalled_groups(wild, now)
            return
        self._pump_plain(sub, now, drain=not self._hb_failed(sub))

    def _pump_plain(self, sub: Sub, now: float, *, drain: bool) -> None:
        """One step's worth (PUMP_STEP) for a subscription outside any group: what is due (if
        `drain`), then what is new once nothing is due; what the step leaves goes to `pump_more`."""
        budget = PUMP_STEP
        if sub.pending.due_count and drain:
            budget = self._drain_due(sub, now, budget)
        if not sub.pending.due_count and budget:
            budget = self._send_new(sub, now, budget) if sub.wild is None else self._send_new_shared(sub, now, budget)
        if not budget:
            self._more[sub.record.sub_id] = now

    def _serve_stalled_groups(self, wild: Wildcard, now: float) -> None:
        """The channels of a wildcard queue group that stalled on this member's MaxInflight, pumped in
        turn while it has room (each pump registers its group again if it stalls again)."""
        stalled = wild.stalled_groups
        while stalled and wild.count < wild.record.max_inflight:
            group, _ = stalled.popitem(last=False)
            if group.members:
                self._pump_group(group, now)

    def _send_new_shared(self, part: Sub, now: float, budget: int) -> int:
        """`_send_new` for a wildcard's part: the parts with new messages take turns for the room its
        MaxInflight leaves, this one after those already waiting, each a fair share of the room at a
        time (one busy channel must not starve the others)."""
        wild = part.wild
        assert wild is not None
        if part.last_sent < self._channel_last(part.record.channel):
            wild.waiting[part.record.sub_id] = None  # in turn (a part already waiting keeps its place)
        limit = wild.record.max_inflight
        waiting = wild.waiting
        while waiting and budget and wild.count < limit:
            turn, _ = waiting.popitem(last=False)
            each = self._subs.get(turn)
            if each is None or not each.online or each.wild is not wild or each.pending.due_count:
                continue  # gone, or its redeliveries go first (its next pump puts it back in turn)
            share = min(budget, max(1, (limit - wild.count) // (len(waiting) + 1)))
            left = self._send_new(each, now, share)
            budget -= share - left
            if each.last_sent < self._channel_last(each.record.channel):
                waiting[turn] = None
                if left == share:
                    break  # it could send nothing: no room after all
        return budget

    def _drain_due(self, sub: Sub, now: float, budget: int) -> int:
        """Redeliver what is due, in order, at most `budget` messages (what is left of it is returned);
        forced past MaxInflight unless the option says otherwise. The messages are read READ_BATCH at
        a time (one store read each), not one by one: a durable resumed after a restart may have
        100,000 due."""
        limit_redeliveries = sub.record.options.max_inflight_redeliveries
        channel = sub.record.channel
        ahead: dict[int, Message | None] = {}
        while budget and (item := sub.pending.peek_due()) is not None:
            if limit_redeliveries and sub.pending.in_flight >= sub.record.max_inflight:
                break
            seq, reason = item
            if seq not in ahead:  # the due queue is in order: read on from here
                count = min(READ_BATCH, budget)
                if limit_redeliveries:
                    count = min(count, sub.record.max_inflight - sub.pending.in_flight)
                seqs = list(islice(sub.pending.due(), count))
                ahead = dict(zip(seqs, self._reader.read_many(channel, seqs), strict=True))
            message = ahead.pop(seq)
            budget -= 1
            if message is None:  # evicted by a limit meanwhile: it never comes back
                self._forget(sub, seq)
                self._emit_if(ExpiredByLimit(sub.ref, seq))
                continue
            attempt = sub.pending.attempt(seq) + 1
            max_deliver = sub.record.options.max_deliver
            if max_deliver and attempt > max_deliver:
                self._dead_letter(sub, message, attempt - 1)
                continue
            self._send(sub, message, attempt, reason, now)
        return budget

    def _channel_last(self, channel: str) -> int:
        last = self._last_seq.get(channel)
        if last is None:
            info = self.store.channel_info(channel)
            last = self._last_seq[channel] = info.last_seq if info is not None else 0
        return last

    def _send_new(self, sub: Sub, now: float, budget: int) -> int:
        """Send what is new, at most `budget` messages; what is left of the budget is returned."""
        if sub.last_sent >= self._channel_last(sub.record.channel) or sub.stalled:
            return budget  # the common case after an ack: nothing new (no store lookup)
        info = self.store.channel_info(sub.record.channel)
        if info is None:
            return budget
        start = sub.last_sent
        wild = sub.wild
        while budget and sub.last_sent < info.last_seq and not sub.stalled:
            room = sub.window - len(sub.pending)  # `Sub.room`, inlined: a plain subscription's is this
            if wild is not None:
                room = min(room, wild.record.max_inflight - wild.count)
            batch = self._reader.read(sub.record.channel, sub.last_sent + 1, min(room, READ_BATCH, budget))
            if not batch:
                sub.last_sent = info.last_seq  # the rest was evicted
                break
            self._send_first(sub, batch, now)
            sub.last_sent = batch[-1].seq
            budget -= len(batch)
        if sub.last_sent != start:
            self._updates.append(SetLastSent(sub.record.sub_id, sub.last_sent))
        return budget

    def _pump_group(self, group: Group, now: float) -> None:
        blocked = False
        budget = PUMP_STEP
        for each in group.members:
            if each.pending.due_count and not self._hb_failed(each) and budget:
                budget = self._drain_due(each, now, budget)
            if each.pending.due_count and not self._hb_failed(each):
                blocked = True  # its redeliveries still wait for room: new messages wait too
        if not budget:  # the redeliveries took the step: new messages in the next one
            self._more[group.members[0].record.sub_id] = now
            return
        if blocked or group.last_sent >= self._channel_last(group.channel):
            return  # the common case after an ack: nothing new (no store lookup)
        if group.ordered and group.holds_any():
            return  # one message of the channel out at a time: the next once it is acked
        info = self.store.channel_info(group.channel)
        if info is None:
            return
        receivers: dict[int, Sub] = {}
        failed = self._failing(group)  # once: no client's heartbeat state changes during a pump
        while group.last_sent < info.last_seq:
            if not budget:
                self._more[group.members[0].record.sub_id] = now
                break
            # Share out no more than the members can take: after an ack that is one message, not a batch.
            wanted = 1 if group.ordered else min(READ_BATCH, budget, info.last_seq - group.last_sent)
            plan = group.share(wanted, failed)
            if not plan:
                # Every member is stalled: the group is stalled (no store lookups). Members that are
                # wildcards stall on MaxInflight over all their channels: the room an ack makes on
                # another channel must bring this one's pump back (`_serve_stalled_groups`).
                for m in group.members:
                    if m.wild is not None:
                        m.wild.stalled_groups[group] = None
                break
            batch = self._reader.read(group.channel, group.last_sent + 1, sum(n for _, n in plan))
            if not batch:
                group.last_sent = info.last_seq
                break
            budget -= len(batch)
            # Each member's block goes out as one run (one delay, one pending run, one event), in the
            # channel's order: observers hear the group's deliveries in order.
            start = 0
            for member, n in plan:
                block = batch[start : start + n]
                if not block:
                    break  # a limit evicted some of what was planned
                self._send_first(member, block, now)
                receivers[member.record.sub_id] = member
                start += n
            group.last_sent = batch[-1].seq
            if group.ordered:
                break
        for sub_id, receiver in receivers.items():
            receiver.last_sent = group.last_sent
            self._updates.append(SetLastSent(sub_id, group.last_sent))

    def _failing(self, group: Group) -> list[Sub]:
        """The members of `group` whose clients fail heartbeats."""
        return [m for m in group.members if self._hb_failed(m)]

    def _send(self, sub: Sub, message: Message, attempt: int, reason: Reason, now: float) -> None:
        delay = sub.delay(attempt)
        if attempt == 1:
            sub.pending.sent_first(message.seq, delay, now + delay)
        else:
            sub.pending.sent(message.seq, attempt, delay, now + delay)
        # A first delivery is of a message that was not pending here (sent_first): fresh.
        self._updates.append(SetPending(sub.record.sub_id, message.seq, attempt, attempt == 1))
        self._deliveries.append(Delivery(sub.record.sub_id, sub.record.inbox, message, attempt, reason))
        self._timers.add(sub.record.sub_id)
        if self._observers:
            self._emit(Delivered(sub.ref, message.seq, attempt, reason, delay))

    def _send_first(self, sub: Sub, messages: Sequence[Message], now: float) -> None:
        """`_send` of each message, all on their first attempt to one subscription: a backlog read is
        sent in one step (one delay, one deadline, one timer mark), not a call per message."""
        delay = sub.delay(1)
        sub_id, inbox = sub.record.sub_id, sub.record.inbox
        seqs = [m.seq for m in messages]
        sub.pending.sent_first_many(seqs, delay, now + delay)
        self._updates.append(SetPendingRun(sub_id, seqs))
        new = Reason.NEW
        self._deliveries += [Delivery(sub_id, inbox, m, 1, new) for m in messages]
        self._timers.add(sub_id)
        if self._observers:
            self._emit(DeliveredRun(sub.ref, seqs, delay))

    def _dead_letter(self, sub: Sub, message: Message, attempts: int) -> None:
        record = sub.record
        target = record.options.dead_letter_channel or f"{record.channel}.dead"
        self._forget(sub, message.seq)
        self._dead.append(
            DeadLetter(
                target,
                record.channel,
                message.seq,
                attempts,
                record.sub_id,
                record.client_id,
                record.durable_name,
                record.queue_group,
                message,
            )
        )
        self._emit_if(DeadLettered(sub.ref, message.seq, attempts, target))

    # -- timers ----------------------------------------------------------------------------------

    def expire(self, sub_id: int, now: float, limit: int = 1000) -> int:
        """Handle up to `limit` expired messages of one subscription; returns how many it handled
        (when that is `limit`, more may be due).

        The runtime calls it when the subscription's deadline passes and yields between calls.
        """
        sub = self._subs.get(sub_id)
        if sub is None or not sub.online:
            return 0
        released = sub.pending.release_naks(now) if sub.pending.nak_count else []  # now due
        expired = sub.pending.pop_expired(now, limit)
        if not expired and not released:
            return 0
        self._timers.add(sub_id)
        if sub.group is None and self._hb_failed(sub):
            # The client is not answering heartbeats: skip this pass, wait another AckWait (what a
            # nak released stays due until its heartbeats come back).
            for seq, delay in expired:
                sub.pending.sent(seq, sub.pending.attempt(seq), delay, now + delay)
            return len(expired) + len(released)
        if self._observers:
            for seq, delay in expired:
                self._emit(AckTimedOut(sub.ref, seq, sub.pending.attempt(seq), delay))
        options = sub.record.options
        if sub.group is None and not (released or options.max_inflight_redeliveries or options.max_deliver):
            # The common case, straight through: redeliver each expired message now, in order.
            pending, channel = sub.pending, sub.record.channel
            messages = self._reader.read_many(channel, [seq for seq, _ in expired])
            for (seq, _), message in zip(expired, messages, strict=True):
                if message is None:
                    self._forget(sub, seq)
                    self._emit_if(ExpiredByLimit(sub.ref, seq))
                else:
                    self._send(sub, message, pending.attempt(seq) + 1, Reason.ACK_TIMEOUT, now)
            return len(expired)
        if sub.group is None:
            self._pump_plain(sub, now, drain=True)
            return len(expired) + len(released)
        group = sub.group
        moving = [(seq, Reason.NAK) for seq in released]
        moving += [(seq, Reason.ACK_TIMEOUT) for seq, _ in expired]
        failed = self._failing(group)  # once: no client's heartbeat state changes during a pass
        for seq, reason in moving:
            target = group.pick(failed=failed)
            if target is not sub:
                attempt = sub.pending.attempt(seq)
                self._forget(sub, seq)
                self._give(target, seq, attempt, reason)
        self._pump_group(group, now)
        return len(expired) + len(released)

    # -- restart: the calls `streaming.core.engine.recovery` rebuilds the engine with ------------------

    def group(self, channel: str, key: str) -> Group | None:
        return self._groups.get(channel, {}).get(key)

    def wildcard(self, sub_id: int) -> Wildcard | None:
        return self._wild.get(sub_id)

    def restore_group(self, record: SubscriptionRecord, key: str) -> Group:
        """The queue group a recovered member belongs to (made on its first member), at the highest
        position any of its members recorded."""
        groups = self._groups.setdefault(record.channel, {})
        group = groups.get(key)
        if group is None:
            ordered = record.options.ordered
            group = groups[key] = Group(record.channel, key, record.is_durable, record.last_sent, ordered)
        group.last_sent = max(group.last_sent, record.last_sent)
        return group

    def restore(
        self,
        record: SubscriptionRecord,
        pending: dict[int, int],
        group: Group | None,
        *,
        online: bool,
        naks: dict[int, tuple[float, int]] | None = None,
    ) -> Sub:
        """A recovered subscription, with every pending message due (before any new one) except the
        nak'd ones in `naks` (seq -> (seconds of their delay left, its end in Unix ns)), which wait from
        `start`; online when its client is registered and it was not closed."""
        record = attrs.evolve(record, is_closed=not online)
        sub = Sub(record, group, online)
        self._restore_pending(sub, pending, naks)
        self._add(sub)
        if record.is_durable and not record.queue_group:
            self._durables[(record.client_id, record.channel, record.durable_name)] = sub
        if group is not None:
            group.members.append(sub)
        if online:
            self._by_ack_inbox[record.ack_inbox] = record.sub_id
            self._clients[record.client_id].subs.add(record.sub_id)
            if group is None:
                self._plain.setdefault(record.channel, {})[record.sub_id] = sub
        return sub

    def _restore_pending(self, sub: Sub, pending: dict[int, int], naks: dict[int, tuple[float, int]] | None) -> None:
        sub.pending.add_due_many(pending, Reason.RESTART)
        if naks:
            self._recovered_naks += [(sub, seq, *left) for seq, left in naks.items() if left[0] > 0 and seq in pending]

    def restore_wildcard(self, record: SubscriptionRecord, *, online: bool) -> Wildcard | None:
        """A recovered wildcard subscription (the pattern's record), without its parts yet
        (`restore_part`); online when its client is registered and it was not closed. An offline
        member of a wildcard queue group comes back as the group's shadow, unless it has one (None:
        its parts' messages go to the group, `hand_part_to_group`)."""
        record = attrs.evolve(record, is_closed=not online)
        wild_group = None
        if record.queue_group:
            key = group_key(record.durable_name, record.queue_group)
            wild_group = self._wild_groups.get((record.channel, key))
            if wild_group is None:
                wild_group = self._wild_groups[(record.channel, key)] = WildGroup(
                    record.channel, key, record.is_durable, record.options.ordered
                )
            if not online and (wild_group.shadow is not None or wild_group.members):
                return None  # the group lives on in others: what it held goes to them
        wild = self._wild[record.sub_id] = Wildcard(record, online, wild_group)
        if wild_group is not None:
            if online:
                wild_group.members.append(wild)
            else:
                wild_group.shadow = wild
        elif record.is_durable:
            self._wild_durables[(record.client_id, record.channel, record.durable_name)] = wild
        if online:
            self._by_ack_inbox[record.ack_inbox] = record.sub_id
            self._clients[record.client_id].subs.add(record.sub_id)
        return wild

    def restore_part(
        self,
        wild: Wildcard,
        record: SubscriptionRecord,
        pending: dict[int, int],
        naks: dict[int, tuple[float, int]] | None = None,
    ) -> None:
        """A recovered part of `wild` (its channel's position and pending messages, due first)."""
        group = None
        if wild.group is not None:
            group = self.restore_group(record, wild.group.channel_key)
        part = self._attach_part(wild, attrs.evolve(record, is_closed=not wild.online), group)
        self._restore_pending(part, pending, naks)

    def hand_part_to_group(self, pattern: str, record: SubscriptionRecord, pending: dict[int, int]) -> None:
        """The part of a member of a queue group on `pattern` that is not coming back: its pending
        messages go to the live members of its channel's group, or to the group's shadow."""
        key = group_key(record.durable_name, record.queue_group)
        wild_group = self._wild_groups.get((pattern, key))
        group = None if wild_group is None else self.group(record.channel, wild_group.channel_key)
        if group is not None and group.members:
            self.hand_to_members(group, pending)
        elif group is not None and group.shadow is not None:
            for seq, attempt in sorted(pending.items()):
                if seq not in group.shadow.pending:
                    group.shadow.pending.add_due(seq, attempt, Reason.RESTART)
                    self.merge_pending(group.shadow.record.sub_id, seq, attempt)
            group.last_sent = max(group.last_sent, record.last_sent)
        self.discard_recovered(record.sub_id)

    def restore_shadow(self, group: Group, sub: Sub) -> None:
        """`sub` keeps an empty durable group's position and pending messages for the members to come."""
        group.members.remove(sub)
        group.shadow = sub

    def hand_to_members(self, group: Group, pending: dict[int, int]) -> None:
        """A recovered subscription's pending messages go to the live members of its group."""
        self._distribute(group, sorted(pending.items()), Reason.RESTART)

    def merge_pending(self, sub_id: int, seq: int, attempt: int) -> None:
        """Record that `sub_id` holds `seq` pending (merging what another record of its group held)."""
        self._updates.append(SetPending(sub_id, seq, attempt))

    def discard_recovered(self, sub_id: int) -> None:
        """A recovered subscription record that is not coming back is deleted from the store."""
        self._updates.append(DeleteSubscription(sub_id))

    def start(self, now: float) -> None:
        """After recovery: redeliver everything recovered (but what nak'd messages wait for), then send
        what is new."""
        for sub, seq, left, until_ns in self._recovered_naks:
            sub.pending.nak(seq, now + left, until_ns)
            self._timers.add(sub.record.sub_id)
        self._recovered_naks = []
        for sub in list(self._subs.values()):
            if sub.online:
                self._pump_sub(sub, now)
