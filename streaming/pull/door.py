"""The HTTP pull door: pull consumers become engine subscriptions whose messages are handed out on demand.

An adapter on the delivery core like the other doors:
- a consumer is an engine subscription (plain, durable, queue member) with the consumer's AckWait and
  MaxInflight, delivered on demand: the door opens its window (`DoorApi.set_window`) to what it has
  handed out plus one per waiting pull, so the engine sends a new message only to a consumer that is
  pulling (through the door's outbound port, inboxes under `_PULL.`), and none waits unpulled while
  its AckWait runs or while another member of its queue group is idle. Handing one out restarts its
  AckWait (`ack_progress`), so the wait runs from the response;
- AckWait redelivery, queue-group sharing, durable resume and recovery are the engine's; the door
  voids the tag of a delivery the engine sent again. Messages sent again wait in the consumer for its
  next pull, ahead of newer ones; a member of a queue group with nothing to pull takes one waiting in
  another member (the engine keeps counting it as that member's; acks reach it through the group);
- an ack is an engine ack, answered once the state write that records it is stored; a nack puts the
  message back at once, ahead of newer ones, for the next pull of this consumer or its group;
- a publish goes through the same group commit as every other door's, answered after its commit.

The engine knows a consumer as client `pull:<id>`, or `pull:d:<durable>` for a durable outside a
queue group, so that a new consumer with that durable name resumes it. STAN client IDs cannot hold
':', so no STAN client can act for a consumer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

import attrs
import trio

from streaming.core.door_api import DoorApi, Permissions
from streaming.core.errors import RequestError
from streaming.core.outbound import ChannelInfo, Delivery, Publish, SubOptions, SubscribeRequest
from streaming.pull import protocol as pp

log = logging.getLogger(__name__)

INBOX_PREFIX = "_PULL."


class Conflict(Exception):
    """A consumer the engine refuses because of another (a durable already attached, ...)."""


@attrs.frozen
class PullStatistics:
    consumers: int
    created: int
    expired: int
    handed_out: int
    acked: int
    nacked: int
    stale_acks: int  # acks refused with 412
    published: int


class PullConsumer:
    """A live consumer: its state, its engine client and subscription, and a waiting pull's event."""

    __slots__ = ("consumer", "engine_client", "group_key", "sub_id", "waiter", "window")

    def __init__(self, consumer: pp.Consumer, engine_client: str, group_key: tuple[str, str, str]) -> None:
        self.consumer = consumer
        self.engine_client = engine_client
        self.group_key = group_key
        self.sub_id = 0
        self.waiter: trio.Event | None = None  # set when a message may be there to pull
        self.window = 0  # what its engine subscription's window was last set to


@attrs.define
class PullResult:
    status: int  # 200, 409, 412, 503
    handout: pp.Handout | None = None


class PullDoor:
    def __init__(self, core: DoorApi, settings: pp.PullSettings) -> None:
        self.core = core
        self.settings = settings
        self._consumers: dict[str, PullConsumer] = {}
        self._by_sub: dict[int, PullConsumer] = {}
        self._groups: dict[tuple[str, str, str], set[PullConsumer]] = {}
        self._tombstones: dict[str, float] = {}
        self._epoch = format(time.time_ns() // 1_000_000, "x")
        self._serial = 0
        self._created = self._expired = self._handed = self._acked = self._nacked = self._stale = 0
        self._published = 0
        core.add_door(self, INBOX_PREFIX)

    def statistics(self) -> PullStatistics:
        return PullStatistics(
            consumers=len(self._consumers),
            created=self._created,
            expired=self._expired,
            handed_out=self._handed,
            acked=self._acked,
            nacked=self._nacked,
            stale_acks=self._stale,
            published=self._published,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Expire idle consumers and forget old tombstones and tags, every `sweep_s`, until cancelled."""
        task_status.started()
        while True:
            await trio.sleep(self.settings.sweep_s)
            self.sweep(trio.current_time())

    def sweep(self, now: float) -> None:
        for live in list(self._consumers.values()):
            consumer = live.consumer
            if live.waiter is None and now - consumer.last_active > consumer.options.idle_timeout_s:
                log.debug("pull consumer %s expired", consumer.id)
                self._expired += 1
                self.close(live, unsubscribe=False)
            else:
                consumer.prune(now, self.settings.ack_replay_window_s)
        self._tombstones = {cid: until for cid, until in self._tombstones.items() if until > now}

    # -- consumers -----------------------------------------------------------------------------

    def get(self, consumer_id: str) -> PullConsumer | None:
        live = self._consumers.get(consumer_id)
        if live is not None:
            live.consumer.last_active = trio.current_time()
        return live

    def tombstoned(self, consumer_id: str) -> bool:
        return self._tombstones.get(consumer_id, 0.0) > trio.current_time()

    async def create(self, channel: str, options: pp.ConsumerOptions) -> PullConsumer:
        """A new consumer on `channel`; raises RequestError (a bad channel or start) or Conflict."""
        await self.core.wait_ready()
        await self.core.ensure_channel(channel)
        consumer_id = pp.new_id()
        now = trio.current_time()
        consumer = pp.Consumer(consumer_id, channel, options, self._epoch, now)
        if options.durable:
            self._check_durable(channel, options)
        if options.durable and not options.group:
            engine_client = f"pull:d:{options.durable}"
            if self.core.has_client(engine_client):
                raise Conflict("a consumer with this durable name is attached")
        else:
            engine_client = f"pull:{consumer_id}"
        live = PullConsumer(consumer, engine_client, (channel, options.durable, options.group))
        self.core.attach_client(engine_client)
        request = SubscribeRequest(
            client_id=engine_client,
            channel=channel,
            inbox=f"{INBOX_PREFIX}{consumer_id}",
            ack_inbox=f"{INBOX_PREFIX}{consumer_id}.acks",  # no broker subscription reaches it
            ack_wait_ms=options.ack_wait_s * 1000,
            max_inflight=options.max_inflight,
            durable_name=options.durable,
            queue_group=options.group,
            options=SubOptions(ordered=options.ordered),
            start_position=options.start,
            start_sequence=options.start_sequence,
            start_time_delta_ns=options.start_time_delta_ns,
            on_demand=True,
        )

        def answer(sub_id: int) -> None:  # before any of its messages arrive
            live.sub_id = sub_id
            self._consumers[consumer_id] = live
            self._by_sub[sub_id] = live
            self._groups.setdefault(live.group_key, set()).add(live)

        try:
            self.core.subscribe(request, answer)
        except RequestError:
            self.core.detach_client(engine_client)
            raise
        self._created += 1
        return live

    def _check_durable(self, channel: str, options: pp.ConsumerOptions) -> None:
        """A durable name stays with the queue group it was made with (or with none): using it
        otherwise would silently start a second cursor under the same name."""
        bound = self.core.durable_bindings(channel, options.durable, f"pull:d:{options.durable}")
        other = next((group for group in bound if group != options.group), None)
        if other is None:
            return
        where = f"queue group {other!r}" if other else "no queue group"
        raise Conflict(f"durable {options.durable!r} exists on {channel!r} with {where}")

    def close(self, live: PullConsumer, *, unsubscribe: bool) -> None:
        """DELETE (or idle expiry): what it holds goes back to the engine and its tags are void;
        `unsubscribe` also removes a durable."""
        consumer = live.consumer
        if self._consumers.pop(consumer.id, None) is None:
            return
        now = trio.current_time()
        consumer.void_all(now, "closed")
        self._tombstones[consumer.id] = now + self.settings.tombstone_ttl_s
        self._by_sub.pop(live.sub_id, None)
        members = self._groups.get(live.group_key)
        if members is not None:
            members.discard(live)
            if not members:
                del self._groups[live.group_key]
        if live.waiter is not None:
            live.waiter.set()
        if unsubscribe:
            self.core.unsubscribe(live.sub_id)
        self.core.detach_client(live.engine_client)  # a plain one goes; a durable stays, offline

    # -- pulls -----------------------------------------------------------------------------------

    async def pull(self, live: PullConsumer, step: int | None, wait_s: float) -> PullResult:
        consumer = live.consumer
        now = trio.current_time()
        if step is not None:
            if step == consumer.step:
                replay = consumer.replayable(now)
                return PullResult(200, replay) if replay is not None else PullResult(412)
            if step != consumer.step + 1:
                return PullResult(412)
        if consumer.full():
            return PullResult(409)
        if not self._available(live):
            # Open the window by one: the engine sends what there is before this returns.
            consumer.waiting += 1
            try:
                self._open(live)
                deadline = trio.current_time() + wait_s
                while not self._available(live):
                    if trio.current_time() >= deadline or self._consumers.get(consumer.id) is not live:
                        break
                    waiter = live.waiter = live.waiter or trio.Event()
                    with trio.move_on_at(deadline):
                        await waiter.wait()
                    if live.waiter is waiter:
                        live.waiter = None
            finally:
                consumer.waiting -= 1
            if self._consumers.get(consumer.id) is not live:
                return PullResult(503)  # closed meanwhile (the caller answers 404)
            consumer.last_active = trio.current_time()
            if step is not None and step != consumer.step + 1:
                self._open(live)
                return PullResult(412)  # another pull took this step meanwhile
            if consumer.full():
                self._open(live)
                return PullResult(409)
        self._serial += 1
        lent = self._borrow(live)
        handout = consumer.take(trio.current_time(), time.time(), format(self._serial, "x"), lent)
        if handout is None:
            self._open(live)  # the waiting pull's share of the window goes
            return PullResult(503)
        self._handed += 1
        if step is not None:
            consumer.step = step
        consumer.last = handout
        self._open(live)  # before any ack: what it frees must not be refilled past the window
        if consumer.options.ack_manual:
            self.core.ack_progress(live.sub_id, handout.seq)  # its AckWait runs from this response
        else:
            self.core.ack(live.sub_id, handout.seq)  # at-most-once: acknowledged as it is handed out
        return PullResult(200, handout)

    def _open(self, live: PullConsumer) -> None:
        """Set the engine subscription's window to what the consumer can take now."""
        consumer = live.consumer
        if consumer.naked:
            # A nacked message the engine no longer holds here (evicted by a limit, or dead-lettered,
            # while it waited out its delay) never comes back to this consumer: it stops counting.
            consumer.naked = {seq for seq in consumer.naked if self.core.holds(live.sub_id, seq)}
        window = consumer.window()
        if window == live.window or live.consumer.id not in self._consumers:
            return
        live.window = window
        self.core.set_window(live.sub_id, window)  # from `deliver` too: what it lets through comes after

    def _available(self, live: PullConsumer) -> bool:
        """Whether a pull of this consumer would get a message now (its own, or its group's)."""
        if live.consumer.has_ready():
            return True
        return (
            any(
                other.consumer.redelivered or (other.consumer.new and not other.consumer.waiting)
                for other in self._groups.get(live.group_key, ())
                if other is not live
            )
            if live.group_key[2]
            else False
        )

    def _borrow(self, live: PullConsumer) -> pp.Ready | None:
        """For a queue member with nothing re-enqueued to pull: the lowest re-enqueued message another
        member holds, else (when it has nothing new either) the oldest new one another member holds."""
        if not live.group_key[2]:
            return None
        consumer = live.consumer
        own = consumer.first_redelivered()
        best: tuple[int, PullConsumer] | None = None
        for other in self._groups.get(live.group_key, ()):
            seq = other.consumer.first_redelivered() if other is not live else None
            if seq is not None and (own is None or seq < own) and (best is None or seq < best[0]):
                best = (seq, other)
        if best is not None:
            return best[1].consumer.lend(best[0])
        if consumer.has_ready():
            return None
        for other in self._groups.get(live.group_key, ()):
            if other is not live and other.consumer.new and not other.consumer.waiting:
                return other.consumer.lend()
        return None

    async def acknowledge(
        self, live: PullConsumer, seq: int, if_match: str | None, acknowledge: bool, delay: float = 0.0
    ) -> pp.AckDecision:
        consumer = live.consumer
        now = trio.current_time()
        decision = consumer.decide(if_match, seq, acknowledge, now, self.settings)
        if decision.status == 412:
            self._stale += 1
        if not decision.action:
            self._open(live)  # the decision may have voided an expired delivery
            return decision
        if acknowledge:
            consumer.settle(seq, True, now)
            self._open(live)  # narrowed before the ack, which would otherwise refill what it frees
            self._acked += 1
            self.core.ack(live.sub_id, seq)
            await self.core.acks_stored()  # 204 only once the ack is stored
            return decision
        # The engine takes it back: after the delay (0: at once; a restart keeps the wait) it sends
        # it as its next attempt, MaxDeliver counting it, to this consumer or, in a group, to a
        # member that can take it.
        self._nacked += 1
        ready = consumer.settle(seq, False, now, requeue=False)
        if ready is not None and not ready.borrowed:
            consumer.naked.add(seq)  # still pending on this consumer's subscription: its window counts it
        self._open(live)
        if not self.core.nak(live.sub_id, seq, delay) and ready is not None:
            consumer.naked.discard(seq)
            consumer.requeue_ready(ready)  # the engine no longer holds it here: ready here at once
            self._open(live)
            self._wake(live)
        return decision

    def _wake(self, live: PullConsumer) -> None:
        """A message is ready at `live`: its waiting pull, or else its group's, may take it."""
        if live.waiter is not None:
            live.waiter.set()
            return
        if live.group_key[2]:
            for other in self._groups.get(live.group_key, ()):
                if other.waiter is not None:
                    other.waiter.set()

    # -- publishing ------------------------------------------------------------------------------

    async def publish(self, channel: str, data: bytes, content_type: str = "") -> int:
        """Store one message; its sequence once committed. Raises RequestError or StoreError."""
        await self.core.wait_ready()
        refusal = self.core.refusal(channel, "publish")
        if refusal is not None:
            raise refusal
        (outcome,) = await self.core.publish_and_wait([Publish(channel, data, content_type=content_type)])
        if isinstance(outcome, Exception):
            raise outcome
        self._published += 1
        return outcome

    def refusal(self, channel: str, action: str, permissions: Permissions | None) -> RequestError | None:
        """Why a publish to (or a consumer on) `channel` is refused now (see `DoorApi.refusal`)."""
        return self.core.refusal(channel, action, permissions)

    def channel_info(self, channel: str) -> ChannelInfo | None:
        """What the store holds of `channel` (None: no such channel)."""
        return self.core.channel_info(channel)

    # -- the outbound port -------------------------------------------------------------------------

    def deliver(self, deliveries: Sequence[Delivery]) -> None:
        now = trio.current_time()
        for d in deliveries:
            live = self._by_sub.get(d.sub_id)
            if live is None:
                continue
            m = d.message
            if live.group_key[2]:  # a queue member: another member's delivery of it is void now
                for other in self._groups.get(live.group_key, ()):
                    if other is not live:
                        other.consumer.forget(m.seq, now, "redelivered")
                        self._open(other)
            live.consumer.offer(m.seq, m.timestamp_unix_ns, m.data, d.attempt, now, m.content_type)
            self._open(live)
            self._wake(live)

    def holding(self) -> AbstractContextManager[None]:
        return nullcontext()

    async def wait_reachable(self, inboxes: list[str]) -> None:
        return  # consumers do not outlive the process; durables resume when a consumer comes back
