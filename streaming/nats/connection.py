"""One client connection of the embedded broker: its state, its send queue, and the writer and pinger
tasks that serve it.

`send` never blocks: it queues bytes. Inside a `holding_writes` block of the broker they wait for the
block's end and go out in one non-blocking write (`write_now`), straight to the socket when its writer
is idle; whatever the socket does not take goes to the writer task, which sends what accumulated in
one `send_all`. The queue is bounded in bytes: a client that lets more than `max_pending_bytes` pile
up, or does not take a write within `write_deadline`, is a slow consumer: it gets `-ERR 'Slow
Consumer'` and is disconnected, and no publisher ever waits for it.
"""

from __future__ import annotations

import logging
import secrets
from typing import Protocol

import trio

from streaming.nats.bus import Handler, Origin, RunHandler
from streaming.nats.session import Session
from streaming.security.auth import Authenticator
from streaming.security.permissions import Compiled
from streaming.wire import nats as p
from streaming.wire.sockets import write_now

log = logging.getLogger(__name__)


class Limits(Protocol):
    """What a connection is held to (the broker's configuration)."""

    @property
    def max_payload(self) -> int: ...
    @property
    def max_control_line(self) -> int: ...
    @property
    def max_pending_bytes(self) -> int: ...
    @property
    def write_deadline_s(self) -> float: ...
    @property
    def connect_timeout_s(self) -> float: ...
    @property
    def ping_interval_s(self) -> float: ...
    @property
    def max_pings_out(self) -> int: ...


class Owner(Protocol):
    """The broker, as its connections see it: its limits, who it lets in, its slow-consumer count,
    and its write hold (streaming.nats.broker.Broker)."""

    @property
    def config(self) -> Limits: ...
    @property
    def auth(self) -> Authenticator: ...

    slow_consumers: int
    holding: int  # depth of the broker's `holding_writes` blocks
    held: list[Connection]  # connections with bytes queued inside them


class Sub:
    """One subscription: a remote connection's sid, or an in-process handler (conn is None)."""

    __slots__ = ("conn", "delivered", "denied", "handler", "literal", "max_msgs", "queue", "runs", "sid", "subject")

    def __init__(
        self,
        conn: Connection | None,
        sid: str,
        subject: str,
        queue: str,
        handler: Handler | None,
        runs: RunHandler | None = None,
    ) -> None:
        self.conn = conn
        self.sid = sid
        self.subject = subject
        self.queue = queue
        self.handler = handler
        self.runs = runs
        self.max_msgs: int | None = None
        self.delivered = 0
        self.literal = "*" not in subject and ">" not in subject
        self.denied: Compiled | None = None  # its user's permissions, when some subjects it matches are denied


class Connection:
    """One client connection's state. `send` never blocks: it queues bytes for the writer."""

    def __init__(self, broker: Owner, stream: trio.SocketStream, cid: int) -> None:
        self.broker = broker
        self.socket_stream = stream
        self.stream: trio.abc.Stream = stream  # a TLS stream over the socket once the handshake is done
        self.tls = False  # writes go through the TLS stream: never straight to the socket
        self.cid = cid
        self.parser = p.ServerConnection(broker.config.max_payload, broker.config.max_control_line)
        self.out: list[bytes] = []
        self.pending_bytes = 0
        self.has_data = trio.Event()
        self.flushed = trio.Event()  # set by the writer once a closing connection's last bytes went out
        self.writing = False  # the writer is inside a send_all: nothing may be written past it
        self.partial = False  # the socket took part of a message: the writer still owes it the rest
        self.held = False  # queued bytes wait for the end of the broker's `holding_writes` block
        self.closing = False
        self.abort = False  # close at once, without waiting for queued bytes to go out (a slow consumer)
        self.connected = trio.Event()  # CONNECT received (and its credentials, when asked for, right)
        self.authorized = not broker.auth.required  # nothing but CONNECT is taken until it is
        self.origin = Origin(cid)  # who it is, as handlers are told (its user once its CONNECT proves it)
        self.nonce = secrets.token_urlsafe(11) if broker.auth.wants_nonce else ""  # for an nkey to sign
        self.session = Session()  # what its CONNECT set, and the answers to its requests
        self.subs: dict[str, Sub] = {}
        self.reserved: set[str] = set()  # subjects reserved for this connection
        self.reader_scope: trio.CancelScope | None = None
        try:
            self.remote = str(stream.socket.getpeername())
        except OSError:
            self.remote = "?"

    def send(self, data: bytes) -> None:
        if self.closing:
            return
        self.out.append(data)
        self.pending_bytes += len(data)
        if self.pending_bytes > self.broker.config.max_pending_bytes:
            self.broker.slow_consumers += 1
            log.warning(
                "connection %d (%s) is a slow consumer: %d bytes pending", self.cid, self.remote, self.pending_bytes
            )
            self.out.clear()
            self.pending_bytes = 0
            self.drop(p.SLOW_CONSUMER)
            return
        if self.broker.holding:
            if not self.held:
                self.held = True
                self.broker.held.append(self)
        else:
            self.has_data.set()

    def write_now(self) -> None:
        """Write what is queued straight to the socket if the writer is idle; the writer gets the rest
        (a full socket buffer, an error to meet)."""
        self.held = False
        if not self.out:
            return
        if self.writing or self.closing or self.tls:
            self.has_data.set()
            return
        data = b"".join(self.out) if len(self.out) > 1 else self.out[0]
        sent = write_now(self.socket_stream, data)
        if sent == len(data):
            self.out.clear()
            self.pending_bytes = 0
            return
        self.partial = sent > 0
        self.out[:] = [data[sent:]]
        self.pending_bytes = len(data) - sent
        self.has_data.set()

    def fail(self, text: str) -> None:
        """Send `-ERR 'text'` and close this connection (after what is already queued)."""
        if self.closing:
            return
        self.out.append(p.encode_err(text))
        self.closing = True
        self.has_data.set()
        if self.reader_scope is not None:
            self.reader_scope.cancel()

    def drop(self, text: str) -> None:
        """Close this connection now, with what is queued: its socket is not taking it. The `-ERR` is
        written only if the socket takes it at once and no write is under way (it would land in the
        middle of a message): best effort, as nats-server's."""
        if self.closing:
            return
        if not (self.writing or self.partial or self.tls):
            write_now(self.socket_stream, p.encode_err(text))
        self.closing = self.abort = True
        self.has_data.set()
        if self.reader_scope is not None:
            self.reader_scope.cancel()

    async def write_out(self) -> None:
        """The writer task: sends whatever queued up since its last send in one `send_all`; a write
        that takes longer than the write deadline makes it a slow consumer (closed)."""
        conn, config = self, self.broker.config
        stream = conn.stream
        try:
            while True:
                await conn.has_data.wait()
                conn.has_data = trio.Event()
                if conn.out:
                    data = b"".join(conn.out) if len(conn.out) > 1 else conn.out[0]
                    conn.out.clear()
                    conn.pending_bytes = 0
                    conn.writing = True
                    with trio.move_on_after(config.write_deadline_s) as deadline:
                        await stream.send_all(data)
                    conn.writing = conn.partial = False
                    if deadline.cancelled_caught:
                        self.broker.slow_consumers += 1
                        log.warning(
                            "connection %d (%s) is a slow consumer: a write took over %.1f s",
                            conn.cid,
                            conn.remote,
                            config.write_deadline_s,
                        )
                        break
                if conn.closing and not conn.out:
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away; the reader sees it too
        conn.closing = True
        conn.out.clear()
        conn.flushed.set()
        if conn.reader_scope is not None:
            conn.reader_scope.cancel()

    async def ping_out(self) -> None:
        """The pinger task: closes a connection that sends no CONNECT in time, then PINGs it every
        ping interval and closes it when too many go unanswered."""
        conn, config = self, self.broker.config
        if config.connect_timeout_s > 0:
            with trio.move_on_after(config.connect_timeout_s):
                await conn.connected.wait()
            if not conn.connected.is_set():
                log.info("connection %d (%s) sent no CONNECT: closing it", conn.cid, conn.remote)
                conn.fail(p.AUTHENTICATION_TIMEOUT)
                return
        while True:
            await trio.sleep(config.ping_interval_s)
            ping = conn.session.ping(config.max_pings_out)
            if ping is None:
                conn.fail(p.STALE_CONNECTION)
                return
            conn.send(ping)
