"""A NATS core client connection under Trio, built on the sans-IO parser in streaming.wire.nats.

It reconnects by itself after a TCP drop (re-sending CONNECT, then every subscription with the same
sid) and tells its owner through `on_reconnect`, so a STAN session survives. While disconnected,
publishes are dropped, as stan.go does (its owner re-sends what matters: unacknowledged publishes).
Writes are coalesced: `publish` queues bytes; one writer task sends whatever accumulated. A publish
marked `at_once` (the STAN client's messages) after a quiet spell (nothing written for
`_STREAMING_GAP_S`) is written straight to the socket instead: a non-blocking write without the hop
to the writer task, a noticeable part of a lone publish's latency. Acks are not marked: sent at once,
each one woke the server by itself, and publish-to-delivery p99 grew (bench/README.md, **latency**).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
import ssl
import time
from collections.abc import Callable

import attrs
import trio

from streaming.wire import nats as p
from streaming.wire.sockets import write_now

log = logging.getLogger(__name__)
_STREAMING_GAP_S = 100e-6  # publishes closer together than this are left to the writer, to go together


class ConnectionClosedError(Exception):
    """The connection is closed for good (by the application, or after reconnecting failed)."""


class NatsError(Exception):
    """The server answered with -ERR."""


@attrs.define(slots=True)  # one per message: not frozen (see streaming.wire.nats.Pub); treat as immutable
class NatsMsg:
    subject: str
    reply: str
    data: bytes


class _Lost(Exception):
    pass


def new_inbox(prefix: str = "_INBOX") -> str:
    return f"{prefix}.{secrets.token_hex(11)}"


class NatsConnection:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        name: str = "",
        reconnect_wait_s: float = 0.5,
        max_reconnect_attempts: int = -1,
        connect_timeout_s: float = 2.0,
        ping_interval_s: float = 30.0,
        on_reconnect: Callable[[], None] | None = None,
        on_disconnect: Callable[[], None] | None = None,
        user: str = "",
        password: str = "",
        token: str = "",
        tls: ssl.SSLContext | None = None,
        inbox_prefix: str = "_INBOX",
    ) -> None:
        self.host, self.port, self.name = host, port, name
        # Where its inboxes live: a cluster whose permissions give each user its own prefix asks for it.
        self.inbox_prefix = inbox_prefix
        # Sent in CONNECT when given, as nats-server reads them (`user`/`pass`, `auth_token`).
        self._credentials = {k: v for k, v in (("user", user), ("pass", password), ("auth_token", token)) if v}
        self.tls = tls  # the TLS handshake follows the server's INFO, which must ask for it (tls_required)
        self.reconnect_wait_s = reconnect_wait_s
        self.max_reconnect_attempts = max_reconnect_attempts
        self.connect_timeout_s = connect_timeout_s
        self.ping_interval_s = ping_interval_s
        self.on_reconnect = on_reconnect
        self.on_disconnect = on_disconnect
        self.info: dict[str, object] = {}
        self.connected = False
        self.closed = False
        self.reconnects = 0
        self._stream: trio.abc.Stream | None = None
        self._parser = p.ClientConnection()
        self._out: list[bytes] = []
        self._has_data = trio.Event()
        self._writing = False  # the writer is inside a send_all: nothing may be written past it
        self._last_write = 0.0  # time.perf_counter() of the latest write
        self._subs: dict[str, tuple[str, str, Callable[[NatsMsg], None]]] = {}
        self._sids = itertools.count(1)
        self._pongs: list[trio.Event] = []
        self._mux_prefix = new_inbox(inbox_prefix)
        self._mux_sid: str | None = None
        self._requests: dict[str, trio.MemorySendChannel[bytes]] = {}
        self._tokens = itertools.count(1)
        self._closed_event = trio.Event()
        self._reconnected = trio.Event()
        self._lost_scope: trio.CancelScope | None = None
        self.last_error = ""

    # -- public API ------------------------------------------------------------------------------

    def publish(self, subject: str, payload: bytes, reply: str = "", *, at_once: bool = False) -> bool:
        """Queue a message; False (dropped) while disconnected. Never blocks. With `at_once`, a message
        after a quiet spell is written to the socket here and now (see the module docstring)."""
        if self.closed:
            raise ConnectionClosedError("connection closed")
        if not self.connected:
            return False
        self._out.append(p.encode_pub(subject, reply, payload))
        if (
            not at_once
            or len(self._out) > 1
            or self._writing
            or time.perf_counter() - self._last_write < _STREAMING_GAP_S
        ):
            self._has_data.set()
        else:
            self._write_now()
        return True

    def _write_now(self) -> None:
        """Write the one queued frame straight to the socket; the writer gets what the socket does not
        take, or the error to meet."""
        data = self._out[0]
        stream = self._stream
        sent = write_now(stream, data) if isinstance(stream, trio.SocketStream) else 0  # TLS: the writer
        self._last_write = time.perf_counter()
        if sent == len(data):
            self._out.clear()
        else:
            self._out[0] = data[sent:]
            self._has_data.set()

    def subscribe(self, subject: str, handler: Callable[[NatsMsg], None], queue: str = "") -> str:
        sid = str(next(self._sids))
        self._subs[sid] = (subject, queue, handler)
        if self.connected:
            self._out.append(p.encode_sub(subject, sid, queue))
            self._has_data.set()
        return sid

    def unsubscribe(self, sid: str) -> None:
        if self._subs.pop(sid, None) is not None and self.connected:
            self._out.append(p.encode_unsub(sid))
            self._has_data.set()

    async def request(self, subject: str, payload: bytes) -> bytes:
        """Request/reply through one wildcard inbox; bound it with `trio.fail_after`. While
        disconnected it waits for the reconnect."""
        if self._mux_sid is None:
            self._mux_sid = self.subscribe(self._mux_prefix + ".*", self._on_mux)
        token = str(next(self._tokens))
        send, receive = trio.open_memory_channel[bytes](1)
        self._requests[token] = send
        try:
            while not self.publish(subject, payload, reply=f"{self._mux_prefix}.{token}"):
                await self._reconnected.wait()
            try:
                return await receive.receive()
            except trio.EndOfChannel:
                raise ConnectionClosedError("connection closed") from None
        finally:
            del self._requests[token]

    async def flush(self) -> None:
        """Round trip to the server: everything queued before has been processed by it."""
        if not self.connected:
            raise ConnectionClosedError("not connected")
        pong = trio.Event()
        self._pongs.append(pong)
        self._out.append(p.PING_BYTES)
        self._has_data.set()
        await pong.wait()

    async def close(self) -> None:
        if self.closed:
            return
        if self.connected and self._out and self._stream is not None:
            with trio.move_on_after(1):
                data = b"".join(self._out)
                self._out.clear()
                await self._stream.send_all(data)
        self.closed = True
        self.connected = False
        if self._lost_scope is not None:
            self._lost_scope.cancel()
        await self._closed_event.wait()

    # -- running ---------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect (errors propagate), then serve the connection, reconnecting, until closed."""
        try:
            await self._connect()
            task_status.started()
            attempts = 0
            while not self.closed:
                await self._serve()
                if self.closed:
                    break
                self.connected = False
                if self.on_disconnect is not None:
                    self.on_disconnect()
                while not self.closed:
                    if 0 <= self.max_reconnect_attempts <= attempts:
                        log.warning("giving up reconnecting to %s:%d", self.host, self.port)
                        self.closed = True
                        break
                    attempts += 1
                    await trio.sleep(self.reconnect_wait_s)
                    try:
                        await self._connect()
                    except (OSError, trio.TooSlowError, _Lost, p.RemoteProtocolError, NatsError) as exc:
                        log.debug("reconnect to %s:%d failed: %s", self.host, self.port, exc)
                        continue
                    attempts = 0
                    self.reconnects += 1
                    if self.on_reconnect is not None:
                        self.on_reconnect()
                    break
        finally:
            self.closed = True
            self.connected = False
            if self._stream is not None:
                with trio.move_on_after(1, shield=True):
                    await trio.aclose_forcefully(self._stream)
            for send in self._requests.values():
                send.close()
            self._reconnected.set()
            self._closed_event.set()

    async def _connect(self) -> None:
        with trio.fail_after(self.connect_timeout_s):
            stream: trio.abc.Stream = await trio.open_tcp_stream(self.host, self.port)
            try:
                self._parser = p.ClientConnection()
                event = await self._next_event(stream)
                if not isinstance(event, p.Info):
                    raise _Lost(f"expected INFO, got {event!r}")
                self.info = event.options
                if bool(event.options.get("tls_required")) != (self.tls is not None):
                    raise NatsError(
                        "the server requires TLS: connect with tls="
                        if self.tls is None
                        else "TLS was asked for, but the server does not offer it (no tls_required in its INFO)"
                    )
                if self.tls is not None:
                    stream = trio.SSLStream(stream, self.tls, server_hostname=self.host)
                    await stream.do_handshake()
                options = {
                    "verbose": False,
                    "pedantic": False,
                    "lang": "python-trio",
                    "version": "0.1.0",
                    "protocol": 1,
                    "echo": True,
                    "name": self.name,
                    "headers": False,
                    **self._credentials,
                }
                await stream.send_all(p.encode_connect(options) + p.PING_BYTES)
                while True:
                    event = await self._next_event(stream)
                    if isinstance(event, p.Pong):
                        break
                    if isinstance(event, p.Err):
                        raise NatsError(event.text)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
        self._stream = stream
        self._out = [p.encode_sub(subject, sid, queue) for sid, (subject, queue, _) in self._subs.items()]
        self._has_data = trio.Event()
        self._writing = False  # the old connection's writer may have died inside a send_all
        if self._out:
            self._has_data.set()
        self.connected = True
        self._reconnected.set()
        self._reconnected = trio.Event()

    async def _next_event(self, stream: trio.abc.Stream) -> p.Event:
        while True:
            event = self._parser.next_event()
            if not isinstance(event, p._NeedData):
                return event
            data = await stream.receive_some(65536)
            if not data:
                raise _Lost("connection closed by the server")
            self._parser.receive_data(bytes(data))

    async def _serve(self) -> None:
        with trio.CancelScope() as scope:
            self._lost_scope = scope
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reader, nursery.cancel_scope)
                nursery.start_soon(self._writer, nursery.cancel_scope)
                nursery.start_soon(self._pinger, nursery.cancel_scope)
        self._lost_scope = None
        for pong in self._pongs:
            pong.set()  # flush() waiters: the connection they waited on is gone
        self._pongs.clear()
        if self._stream is not None:
            await trio.aclose_forcefully(self._stream)
            self._stream = None

    async def _reader(self, lost: trio.CancelScope) -> None:
        assert self._stream is not None
        stream, parser = self._stream, self._parser
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    break
                parser.receive_data(data if type(data) is bytes else bytes(data))
                while True:
                    event = parser.next_event()
                    if type(event) is p.Msg:
                        sub = self._subs.get(event.sid)
                        if sub is not None:
                            sub[2](NatsMsg(event.subject, event.reply, event.payload))
                    elif isinstance(event, p._NeedData):
                        break
                    else:
                        self._on_control(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError, p.RemoteProtocolError) as exc:
            log.debug("connection lost: %s", exc)
        lost.cancel()

    def _on_control(self, event: p.Event) -> None:
        if isinstance(event, p.Ping):
            self._out.append(p.PONG_BYTES)
            self._has_data.set()
        elif isinstance(event, p.Pong):
            if self._pongs:
                self._pongs.pop(0).set()
        elif isinstance(event, p.Err):
            self.last_error = event.text
            log.warning("server error: %s", event.text)

    async def _writer(self, lost: trio.CancelScope) -> None:
        assert self._stream is not None
        stream = self._stream
        try:
            while True:
                await self._has_data.wait()
                self._has_data = trio.Event()
                if self._out:
                    data = b"".join(self._out)
                    self._out.clear()
                    self._writing = True
                    await stream.send_all(data)
                    self._writing = False
                    self._last_write = time.perf_counter()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            lost.cancel()

    async def _pinger(self, lost: trio.CancelScope) -> None:
        outstanding: list[trio.Event] = []
        while True:
            await trio.sleep(self.ping_interval_s)
            outstanding = [e for e in outstanding if not e.is_set()]
            if len(outstanding) >= 2:
                log.info("no PONG for two pings: reconnecting")
                lost.cancel()
                return
            pong = trio.Event()
            outstanding.append(pong)
            self._pongs.append(pong)
            self._out.append(p.PING_BYTES)
            self._has_data.set()

    def _on_mux(self, msg: NatsMsg) -> None:
        send = self._requests.get(msg.subject.rsplit(".", 1)[-1])
        if send is not None:
            with contextlib.suppress(trio.WouldBlock):  # a duplicate reply
                send.send_nowait(msg.data)
