"""What the STAN door needs from the NATS side: the `Bus` it subscribes to and publishes on.

Two buses serve it: the embedded broker (streaming.nats.broker, the default: clients connect to this
process) and a link to an external NATS server or cluster (streaming.nats.link: the server is
one more client of that cluster, as nats-streaming-server is with `-ns`). The STAN layer cannot tell
them apart but for what only the embedded broker can know: which client connection sent a message
(the `Origin` every handler is given: on a link, `UNKNOWN_ORIGIN`), which connections are open, and
whether anybody listens on a subject. On a link those questions have cautious answers (nobody known,
everybody might be listening), and what the embedded broker enforces itself (internal and reserved
subjects, permissions) is the cluster's job, through its own permissions (docs/security.md).
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Protocol

import attrs
import trio

from streaming.security.auth import Authenticator
from streaming.security.permissions import Compiled


@attrs.frozen
class Origin:
    """Who sent a message an in-process handler is given: one per client connection, made when its
    CONNECT is admitted, and handed to every handler with the message (nothing is read from the bus
    afterwards, so it stays right across a handler's awaits)."""

    conn: int = 0  # the client connection (0: unknown, as on a link, or the server itself)
    user: str = ""  # who its CONNECT proved to be ("" without authentication)
    permissions: Compiled | None = None  # what that user may publish and subscribe to (None: all)


UNKNOWN_ORIGIN = Origin()

# Takes (subject, reply, payload, origin).
Handler = Callable[[str, str, bytes, Origin], Awaitable[None] | None]
# Takes a run of messages on one subject with one reply from one origin, payloads in arrival order: a
# read's burst of acks to one ack inbox, or of publishes to one channel, in one call. It may return an
# awaitable, as a Handler may, which the reader awaits after the whole run (a bound it keeps, like
# back-pressure on the commit queue, is then exceeded by at most one run).
RunHandler = Callable[[str, str, list[bytes], Origin], Awaitable[None] | None]


class SpanListener(Protocol):
    def span_started(self) -> None:
        """A reader starts handling a span of input (it does not await until the span ends)."""

    def span_ended(self, *, more_input: bool) -> None:
        """The span is handled; `more_input`: that reader has more (unparsed, or after a full read)."""


async def handle_read(
    holding: Callable[[], AbstractContextManager[None]],
    listeners: list[SpanListener],
    handle_span: Callable[[], tuple[list[Awaitable[None]], bool]],
    *,
    full: bool,
) -> None:
    """Handle what one read of a socket brought, span by span; both buses read this way.

    Each span is synchronous: `handle_span()` handles events until the data runs out (`more` False),
    a handler asks to be awaited, or a slice of events is done. The span's replies and what its
    listeners set off (deliveries, PubAcks) leave in one write per connection as it ends (inside
    `holding()`). Awaitables a handler returned are awaited before the next span, so one
    connection's requests stay in order. `full`: the read filled the buffer, so the socket likely
    holds more input (listeners hear it as `more_input`)."""
    while True:
        with holding():
            for listener in listeners:
                listener.span_started()
            more_input = True
            try:
                waits, more = handle_span()
                more_input = more or full
            finally:
                for listener in listeners:
                    listener.span_ended(more_input=more_input)
        for wait in waits:
            await wait
        if not more:
            return
        if not waits:
            # A 64 KiB read of acks is ~900 events, several ms of work: in slices, the writers and
            # the expiry worker keep a slow reader's socket fed meanwhile.
            await trio.lowlevel.checkpoint()


@attrs.frozen
class BusStatistics:
    connections: int
    total_connections: int
    subscriptions: int
    in_msgs: int
    out_msgs: int
    in_bytes: int
    out_bytes: int
    slow_consumers: int


class Bus(Protocol):
    """Subjects in, subjects out. Handlers run in the bus's reader task, in arrival order, and may
    return an awaitable that the reader awaits before reading on."""

    server_id: str
    auth: Authenticator  # who the bus itself lets in (on a link: nobody is checked here)
    slow_consumers: int
    protocol_errors: collections.Counter[str]

    @property
    def url(self) -> str:
        """Where clients reach this bus ("" for the embedded broker before it listens)."""

    def subscribe(self, subject: str, handler: Handler, queue: str = "", *, runs: RunHandler | None = None) -> object:
        """Register an in-process subscriber. With `runs`, messages that arrive back to back on one
        connection with the same subject and reply may come to `runs` together instead of to
        `handler` one by one (where the bus sees them together and `subject` reaches nobody else)."""

    def unsubscribe(self, token: object) -> None: ...

    def publish(self, subject: str, payload: bytes, reply: str = "", *, to: int = 0) -> list[Awaitable[None]]:
        """Send one message; `to`: only to that client connection, where the bus knows connections."""

    def publish_many(self, subject: str, payloads: list[bytes]) -> None: ...

    def holding_writes(self) -> AbstractContextManager[None]: ...

    def add_span_listener(self, listener: SpanListener) -> None: ...

    def add_close_hook(self, hook: Callable[[list[str]], None]) -> None: ...

    def add_disconnect_hook(self, hook: Callable[[int], None]) -> None: ...

    def protect(self, prefix: str) -> None: ...

    def reserve(self, subject: str, owner: int) -> None: ...

    def release(self, subject: str) -> None: ...

    def client_connected(self, cid: int) -> bool: ...

    def has_interest(self, subject: str) -> bool: ...

    async def wait_interest(self, subjects: list[str]) -> None: ...

    def statistics(self) -> BusStatistics: ...
