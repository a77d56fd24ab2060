"""The one port through which the core reaches a front door, and the records that cross between a
door and the core: the publish a door hands in, the subscription request it makes, the delivery it
receives (sans-IO: a door's protocol code may import this).

A front door (STAN over the NATS broker; an HTTP gateway) implements `Outbound`: it receives the
deliveries for the subscriptions it made and the outcome of the publishes it submitted, and turns
them into its protocol's frames. The core never knows which protocol that is. `Doors` routes by
inbox: each door claims the inboxes it hands out by prefix; the first door added takes every inbox
no other door claims (STAN clients choose their inboxes freely).

A publish's outcome goes to its `origin` with the publish itself, in the order the publishes were
handed in: the channel sequence the store gave it, or the exception that refused it. Nothing is
matched by identity, so a `Publish` is an immutable record.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from operator import attrgetter
from typing import NamedTuple, Protocol

from storage import MAX_NAME_BYTES, ChannelInfo, ClientRecord
from storage.codec import MAX_REPLY_BYTES
from storage.records import Message, StartPosition, SubOptions, SubscriptionRecord
from streaming.core.engine import MAX_NAK_DELAY_S, Delivery, SubscribeRequest, SubscriptionView

__all__ = [
    "MAX_NAK_DELAY_S",
    "MAX_NAME_BYTES",
    "MAX_REPLY_BYTES",
    "ChannelInfo",
    "ClientRecord",
    "Delivery",
    "Doors",
    "Message",
    "Outbound",
    "Outcome",
    "Publish",
    "PublishOrigin",
    "ToDoors",
    "StartPosition",
    "SubOptions",
    "SubscribeRequest",
    "SubscriptionRecord",
    "SubscriptionView",
]

# What became of one publish: the channel sequence the store gave it, or why it was refused (a
# `StoreError`, a `ChannelError` or a `RequestError`).
Outcome = int | Exception


class Publish(NamedTuple):
    """One message a client publishes, as every front door hands it to the commit pipeline.

    A named tuple: immutable, and the cheapest record to build (one is built per message).
    """

    channel: str
    data: bytes
    reply: str = ""  # stored with the message and delivered with it (STAN's PubMsg.reply)
    guid: str = ""  # the publisher's ID of this message, echoed in its acknowledgement (STAN)
    ack_to: str = ""  # where the acknowledgement goes, in the door's own terms ("" = none wanted)
    origin: PublishOrigin | None = None  # who is told the outcome; None: nobody
    content_type: str = ""  # the publisher's media type (HTTP doors), stored with the message


class PublishOrigin(Protocol):
    """Whoever submitted publishes and wants their outcome (a front door; a ticket)."""

    def published(self, publishes: Sequence[Publish], outcomes: Sequence[Outcome]) -> None:
        """These publishes are done, in the order they were handed in: `outcomes[i]` is what became
        of `publishes[i]` (an int: stored with that sequence; an exception: refused). Never blocks."""


class Outbound(Protocol):
    """What a front door implements to receive what the core sends its clients (the outcomes of its
    publishes go to their origins: the door itself, or a ticket)."""

    def deliver(self, deliveries: Sequence[Delivery]) -> None:
        """Send these (in order) to the subscriptions' inboxes. Never blocks."""

    def holding(self) -> AbstractContextManager[None]:
        """What the door is sent inside leaves together at the end (one write per connection)."""

    async def wait_reachable(self, inboxes: list[str]) -> None:
        """Return once every inbox can be delivered to (its client is back after a restart)."""


class ToDoors(Outbound, PublishOrigin, Protocol):
    """Every door as the commit pipeline sees them (`Doors`; a test's recording door)."""


_origin = attrgetter("origin")


class Doors:
    """Every front door's port, as one `Outbound` for the core."""

    def __init__(self) -> None:
        self._default: Outbound | None = None
        self._prefixed: list[tuple[str, Outbound]] = []
        self._ports: list[Outbound] = []

    def add(self, port: Outbound, prefix: str = "") -> None:
        """Route deliveries to inboxes starting with `prefix` to `port` (no prefix: every other one)."""
        if prefix:
            self._prefixed.append((prefix, port))
        elif self._default is None:
            self._default = port
        else:
            raise ValueError("a second door without an inbox prefix")
        self._ports.append(port)

    def port_for(self, inbox: str) -> Outbound | None:
        for prefix, port in self._prefixed:
            if inbox.startswith(prefix):
                return port
        return self._default

    def deliver(self, deliveries: Sequence[Delivery]) -> None:
        if not self._prefixed:  # one door: no routing
            if self._default is not None:
                self._default.deliver(deliveries)
            return
        runs: dict[int, tuple[Outbound, list[Delivery]]] = {}
        inbox: str | None = None
        run: list[Delivery] | None = None
        for d in deliveries:
            if d.inbox != inbox:  # a subscription's deliveries come in runs: one routing each
                inbox = d.inbox
                port = self.port_for(inbox)
                run = None if port is None else runs.setdefault(id(port), (port, []))[1]
            if run is not None:
                run.append(d)
        for port, run in runs.values():
            port.deliver(run)

    def published(self, publishes: Sequence[Publish], outcomes: Sequence[Outcome]) -> None:
        origins = set(map(_origin, publishes))  # in C: a batch may hold thousands
        if len(origins) == 1:
            (only,) = origins
            if only is not None:
                only.published(publishes, outcomes)
            return
        by_origin: dict[int, tuple[PublishOrigin, list[Publish], list[Outcome]]] = {}
        for p, outcome in zip(publishes, outcomes, strict=True):
            if p.origin is not None:
                _, run, done = by_origin.setdefault(id(p.origin), (p.origin, [], []))
                run.append(p)
                done.append(outcome)
        for origin, run, done in by_origin.values():
            origin.published(run, done)

    def holding(self) -> AbstractContextManager[None]:
        if len(self._ports) == 1:  # one door: its own hold, with nothing wrapped around it
            return self._ports[0].holding()
        return self._holding_all()

    @contextmanager
    def _holding_all(self) -> Iterator[None]:
        with ExitStack() as stack:
            for port in self._ports:
                stack.enter_context(port.holding())
            yield

    async def wait_reachable(self, inboxes: list[str]) -> None:
        by_port: dict[int, tuple[Outbound, list[str]]] = {}
        for inbox in inboxes:
            port = self.port_for(inbox)
            if port is not None:
                by_port.setdefault(id(port), (port, []))[1].append(inbox)
        for port, some in by_port.values():
            await port.wait_reachable(some)
