"""The door API: everything a front door may ask of the delivery core, and nothing more.

A front door (STAN, Bayeux, HTTP pull) is an adapter: it turns its protocol's requests into these calls
and receives what the core sends its clients through the `Outbound` port it registers (`add_door`).
It never touches the engine, the pipeline, the group commit, the runtime or the store (an import
contract checks that doors import only this module, `streaming.core.outbound` (the port and the
records that cross it) and `streaming.core.errors`).

- publishing: `publish_many` (the hot path: the outcome goes to each publish's origin, the door's
  port) and `submit` / `publish_and_wait` (a `Ticket` to await: doors that answer a request once its
  publishes are stored);
- subscriptions: `subscribe` (after `ensure_channel`), `unsubscribe`, `ack`, `ack_many`,
  `ack_progress`, `set_window` (safe from inside a delivery), `acks_stored`, and the lookups a door
  needs to route acks and requests;
- `refusal`: the one check, and the one error, for a channel being deleted or a user's permissions;
- clients: `attach_client` / `detach_client` (a door's own clients, in memory) and
  `register_client` / `unregister_client` (STAN clients, stored), `set_heartbeat_failed`;
- input spans: `span_started` / `span_ended` (or `span()`) around a burst of one connection's input,
  so its effects are carried out once and its publishes committed at its end.

Calls other than `add_door` and the recovery queries are for after `wait_ready`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Protocol

import attrs

from storage import ChannelError, DeleteClient, SaveClient, StoreError
from streaming.core.errors import ChannelBeingDeleted, NotPermitted, RequestError
from streaming.core.group_commit import Ticket
from streaming.core.outbound import (
    ChannelInfo,
    ClientRecord,
    Outbound,
    Outcome,
    Publish,
    SubscribeRequest,
    SubscriptionRecord,
    SubscriptionView,
)
from streaming.core.service import Core
from streaming.core.store_calls import call_store

__all__ = ["DoorApi", "Permissions", "RecoveredSubscription", "Ticket"]


class Permissions(Protocol):
    """What a user may do, as a door's transport learned it (streaming.security.permissions)."""

    def may_publish(self, subject: str) -> bool: ...

    def may_subscribe(self, subject: str) -> bool: ...

    def denied_within(self, subject: str) -> tuple[str, ...]: ...


@attrs.frozen
class RecoveredSubscription:
    """A subscription the store held at start: whose it is and where its messages and acks go."""

    client_id: str
    inbox: str
    ack_inbox: str


class DoorApi:
    def __init__(self, core: Core) -> None:
        self._core = core

    # -- before and around running -------------------------------------------------------------

    def add_door(self, port: Outbound, inbox_prefix: str = "") -> None:
        """Deliveries to inboxes starting with `inbox_prefix` go to `port` (no prefix: every inbox no
        other door claims). Call it before the core runs."""
        self._core.doors.add(port, inbox_prefix)

    @property
    def ready(self) -> bool:
        """Recovery is done: commits and deliveries flow."""
        return self._core.ready.is_set()

    async def wait_ready(self) -> None:
        """Return once the core runs: at once, without yielding, when it does (a door asks this per
        request, and a yield is a trip through the scheduler)."""
        ready = self._core.ready
        if not ready.is_set():
            await ready.wait()

    def recovered_clients(self) -> list[ClientRecord]:
        """The clients the store held at start (once the core runs)."""
        return list(self._core.recovered.clients)

    def recovered_subscriptions(self) -> list[RecoveredSubscription]:
        """The subscriptions the store held at start (once the core runs)."""
        return [
            RecoveredSubscription(s.record.client_id, s.record.inbox, s.record.ack_inbox)
            for s in self._core.recovered.subscriptions
        ]

    def recovered_channels(self) -> int:
        return len(self._core.recovered.channels)

    # -- input spans ---------------------------------------------------------------------------

    def span_started(self) -> None:
        """A door starts handling a burst of input (it does not await until `span_ended`)."""
        core = self._core
        core.pipeline.defer()
        core.group_commit.span_started()

    def span_ended(self, *, more_input: bool) -> None:
        """The burst is handled: carry out its effects, and commit its publishes now or in the commit
        task (`more_input`: the door has more of the same connection's input waiting)."""
        core = self._core
        core.pipeline.settle()
        core.group_commit.after_span(more_input=more_input)

    def commit_now(self) -> None:
        """What is queued for the group commit is committed here and now when that is quickest (a
        lone publisher's small batch, as at the end of a span), else by the commit task."""
        self._core.group_commit.after_span(more_input=False)

    @contextmanager
    def span(self) -> Iterator[None]:
        """`span_started` ... `span_ended(more_input=False)` around a block that does not await."""
        self.span_started()
        try:
            yield
        finally:
            self.span_ended(more_input=False)

    # -- refusals and channels -----------------------------------------------------------------

    def refusal(self, channel: str, action: str, permissions: Permissions | None = None) -> RequestError | None:
        """Why a `action` ("publish" or "subscribe") on `channel` must be refused, or None: the channel
        is being deleted (`ChannelBeingDeleted`), or the user's `permissions` do not allow it
        (`NotPermitted`). Every door asks this one question and renders the answer its own way."""
        if permissions is not None:  # first: a user may not learn anything of a channel it may not use
            allowed = permissions.may_publish(channel) if action == "publish" else permissions.may_subscribe(channel)
            if not allowed:
                return NotPermitted(action, channel)
        if self._core.pipeline.is_deleting(channel):
            return ChannelBeingDeleted()
        return None

    @property
    def refusing(self) -> bool:
        """Whether `refusal` refuses anything but for permissions now (a channel is being deleted): a
        door on a hot path asks this once per burst of publishes, and `refusal` only when it is."""
        return self._core.pipeline.deleting_any

    async def ensure_channel(self, name: str) -> None:
        """Create a channel a subscription names, off the event loop (an fsynced write), before the
        engine needs it. Raises RequestError for a name the store refuses (too many channels, a clash
        in case, one being deleted), StoreError when the store cannot write."""
        core = self._core
        if core.pipeline.is_deleting(name):
            raise ChannelBeingDeleted()
        try:
            if core.store.channel_info(name) is None:
                await call_store(partial(core.store.ensure_channel, name), in_thread=core.in_thread)
        except ChannelError as exc:
            raise RequestError(str(exc)) from exc

    def channel_info(self, name: str) -> ChannelInfo | None:
        """What the store holds of a channel (None: no such channel, or a name it refuses)."""
        try:
            return self._core.store.channel_info(name)
        except ChannelError:
            return None

    def store_write_error(self) -> StoreError | None:
        """Why the store refuses writes, while it does (publishes, or subscription state)."""
        return self._core.runtime.write_error

    # -- publishing ----------------------------------------------------------------------------

    def publish_many(self, publishes: list[Publish], source: object) -> Awaitable[None] | None:
        """Queue publishes from one `source` (any value telling one publisher from another) for the
        next group commit; each one's origin hears its outcome. Returns an awaitable when the commit
        queue is full (await it before reading on: back-pressure)."""
        commit = self._core.group_commit
        return None if commit.submit_many(publishes, source) else commit.wait_room()

    async def submit(self, publishes: Sequence[Publish], source: object = None) -> Ticket:
        """Queue publishes (their origins are replaced) and return the ticket that hears their
        outcomes; waits for room in a full commit queue first. `source`: the publisher (a
        connection), when it is not one request (the default)."""
        ticket = Ticket(len(publishes))
        if publishes:
            # Each rebuilt with the ticket as its origin, field by field: half the cost of `_replace`,
            # on the path of every HTTP publish.
            run = [Publish(c, d, r, g, a, ticket, t) for c, d, r, g, a, _, t in publishes]
            pending = self.publish_many(run, ticket if source is None else source)
            if pending is not None:
                await pending
        return ticket

    async def publish_and_wait(self, publishes: Sequence[Publish]) -> list[Outcome]:
        """`submit`, then each publish's outcome once all are committed."""
        return await (await self.submit(publishes)).outcomes()

    async def flush_publishes(self) -> None:
        """Wait until every publish submitted so far is committed and acknowledged."""
        await self._core.group_commit.flush()

    # -- clients -------------------------------------------------------------------------------

    def attach_client(self, client_id: str) -> None:
        """A client the door keeps itself (in memory): its subscriptions may now be made."""
        self._core.pipeline.add_client(client_id)

    def detach_client(self, client_id: str) -> None:
        """The client is gone: its plain subscriptions go, its durables stay (offline)."""
        self._core.pipeline.client_closed(client_id)

    def has_client(self, client_id: str) -> bool:
        return self._core.engine.has_client(client_id)

    async def register_client(self, record: ClientRecord) -> bool:
        """A client the store keeps (STAN): attached, and its record stored before this returns True;
        False when the store refuses writes (a full disk): it is served from memory meanwhile, and its
        record is written with the rest of the state once the store takes it."""
        core = self._core
        core.pipeline.add_client(record.client_id)
        core.runtime.queue_updates([SaveClient(record)])
        return await core.runtime.write_now()

    def unregister_client(self, client_id: str) -> None:
        """`detach_client`, and its record deleted from the store (with the next state write)."""
        core = self._core
        core.pipeline.client_closed(client_id)
        core.runtime.queue_updates([DeleteClient(client_id)])

    def set_heartbeat_failed(self, client_id: str, failed: bool) -> None:
        """While a client's heartbeats fail, its subscriptions get nothing new, and what its queue
        members hold goes to the other members when its AckWait ends."""
        self._core.pipeline.set_heartbeat_failed(client_id, failed)

    # -- subscriptions -------------------------------------------------------------------------

    def subscribe(self, request: SubscribeRequest, answer: Callable[[int], None]) -> int:
        """Add a subscription (its channel made by `ensure_channel`); `answer(sub_id)` (the door's
        response to the request) runs before any of its deliveries go out; its record is written
        without waiting for the state writes' linger. Raises RequestError."""
        sub_id = self._core.pipeline.subscribe(request, answer)
        self._core.runtime.write_soon()
        return sub_id

    def creates_durable(self, request: SubscribeRequest) -> bool:
        """Whether `subscribe(request)` would make a durable (or durable queue group) that does not exist."""
        return self._core.engine.creates_durable(request)

    def durable_bindings(self, channel: str, durable_name: str, client_id: str) -> list[str]:
        """The queue groups durable `durable_name` names on `channel`, and "" when `client_id` holds a
        durable of that name outside any group."""
        return self._core.engine.durable_bindings(channel, durable_name, client_id)

    def unsubscribe(self, sub_id: int, *, close: bool = False) -> None:
        """Remove a subscription (`close`: keep a durable's position for its return), written without
        waiting for the state writes' linger."""
        self._core.pipeline.unsubscribe(sub_id, close=close)
        self._core.runtime.write_soon()

    def ack(self, sub_id: int, seq: int) -> bool:
        return self._core.pipeline.ack(sub_id, seq)

    def ack_many(self, sub_id: int, seqs: list[int]) -> int:
        """`ack` of each of `seqs` on one subscription, carried out once; how many counted."""
        return self._core.pipeline.ack_many(sub_id, seqs)

    def nak(self, sub_id: int, seq: int, delay: float) -> bool:
        """A negative ack: `seq` comes back after `delay` seconds (0: at once) as its next attempt,
        honouring MaxDeliver; False if it was not pending on the subscription (or its queue group)."""
        return self._core.pipeline.nak(sub_id, seq, delay)

    def ack_progress(self, sub_id: int, seq: int) -> bool:
        """The client is still working on `seq`: its AckWait starts again."""
        return self._core.pipeline.ack_progress(sub_id, seq)

    async def acks_stored(self) -> bool:
        """Wait until the acks made so far are stored: True once they are; False when the store
        refuses writes (a full disk): they are kept and written later."""
        return await self._core.runtime.write_now()

    def set_window(self, sub_id: int, window: int) -> None:
        """Deliveries on demand: how many unacknowledged messages the subscription may hold. What a
        wider window lets through is delivered before this returns, or, called from the door's own
        `deliver`, right after the deliveries at hand."""
        self._core.pipeline.set_window(sub_id, window)

    def ack_target(self, ack_inbox: str) -> tuple[int, str] | None:
        """(subscription, its client ID) that acks sent to `ack_inbox` are for (None: no such)."""
        return self._core.engine.ack_target(ack_inbox)

    def subscription(self, sub_id: int) -> SubscriptionRecord | None:
        return self._core.engine.subscription(sub_id)

    def holds(self, sub_id: int, seq: int) -> bool:
        """Whether `seq` is pending on subscription `sub_id` (sent or waiting to be sent again)."""
        return self._core.engine.holds(sub_id, seq)

    def is_wildcard(self, sub_id: int) -> bool:
        """Whether `sub_id` subscribes to a pattern: its acks must name the channel (`part_for`)."""
        return self._core.engine.is_wildcard(sub_id)

    def part_for(self, sub_id: int, channel: str) -> int | None:
        """What acks of `channel`'s messages for `sub_id` go to: a wildcard subscription's part on that
        channel (None: it follows no such channel), else `sub_id` itself."""
        return self._core.engine.part_for(sub_id, channel)

    def online_subscription(self, channel: str, inbox: str) -> int | None:
        """The online subscription on `channel` delivering to `inbox` (rare requests: a scan)."""
        engine = self._core.engine
        for sub_id in engine.subscriptions():
            record = engine.subscription(sub_id)
            if record is not None and record.inbox == inbox and record.channel == channel and engine.is_online(sub_id):
                return sub_id
        return None

    def views(self) -> list[SubscriptionView]:
        """Every subscription as monitoring shows it (empty before recovery is done)."""
        return self._core.engine.views() if self.ready else []
