"""A NATS core client connection on AnyIO (so under Trio or asyncio), built on the sans-IO parser in
streaming.wire.nats.

It connects to the first server of its list that answers, learns the cluster's other nodes from INFO
`connect_urls`, and after a TCP drop reconnects to any of them, trying each in turn
(`reconnect_wait_s` apart), re-sending CONNECT and then every subscription with the same sid (the
handshake and the server list are streaming.wire.handshake's, shared with the server's link). Its
owner hears of it through `on_reconnect`, so a STAN session survives. While disconnected, publishes
are dropped, as stan.go does (its owner re-sends what matters: unacknowledged publishes).

Writes are coalesced: `publish` queues bytes; one writer task sends whatever accumulated. A publish
marked `at_once` (the STAN client's messages) after a quiet spell (nothing written for
`_STREAMING_GAP_S`) is written straight to the socket instead: a non-blocking write without the hop
to the writer task, a noticeable part of a lone publish's latency. That needs the socket's own file
descriptor, so it is done under Trio on a plain TCP connection only; under asyncio the socket belongs
to the event loop's transport, and everything goes through the writer. Acks are not marked: sent at
once, each one woke the server by itself, and publish-to-delivery p99 grew (bench/README.md,
**latency**).

It pings the server every `ping_interval_s` and reconnects after `max_pings_out` unanswered pings.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
import socket
import ssl
import sys
import time
from collections.abc import Callable, Sequence

import anyio
import anyio.abc
import attrs
from anyio.streams.memory import MemoryObjectSendStream
from anyio.streams.tls import TLSStream

from streaming.wire import nats as p
from streaming.wire.handshake import Handshake, HandshakeError, HandshakeOptions, ServerList, resubscribe
from streaming.wire.sockets import write_socket
from streaming.wire.urls import ServerUrl, parse_url

log = logging.getLogger(__name__)
_STREAMING_GAP_S = 100e-6  # publishes closer together than this are left to the writer, to go together
_READ_SIZE = 65536
_LOST = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError)


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


def _running_trio() -> bool:
    """Whether this runs under Trio (where the socket's descriptor is the connection's own)."""
    trio = sys.modules.get("trio")
    return trio is not None and bool(trio.lowlevel.in_trio_run())


def new_inbox(prefix: str = "_INBOX") -> str:
    return f"{prefix}.{secrets.token_hex(11)}"


class NatsConnection:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 4222,
        *,
        servers: Sequence[str] = (),
        name: str = "",
        reconnect_wait_s: float = 0.5,
        max_reconnect_attempts: int = -1,
        connect_timeout_s: float = 2.0,
        ping_interval_s: float = 30.0,
        max_pings_out: int = 2,
        on_reconnect: Callable[[], None] | None = None,
        on_disconnect: Callable[[], None] | None = None,
        user: str = "",
        password: str = "",
        token: str = "",
        tls: ssl.SSLContext | None = None,
        inbox_prefix: str = "_INBOX",
    ) -> None:
        # `servers` (URLs, credentials allowed in them) wins over host and port.
        self._servers = ServerList([parse_url(s) for s in servers] or [ServerUrl(host, port)])
        self.host, self.port, self.name = self.servers[0].host, self.servers[0].port, name
        # The TLS handshake follows the server's INFO, which must ask for it (tls_required).
        self._handshake = HandshakeOptions(
            name=name, lang="python-anyio", user=user, password=password, token=token, tls=tls
        )
        self.tls = tls
        # Where its inboxes live: a cluster whose permissions give each user its own prefix asks for it.
        self.inbox_prefix = inbox_prefix
        self.reconnect_wait_s = reconnect_wait_s
        self.max_reconnect_attempts = max_reconnect_attempts
        self.connect_timeout_s = connect_timeout_s
        self.ping_interval_s = ping_interval_s
        self.max_pings_out = max_pings_out
        self.on_reconnect = on_reconnect
        self.on_disconnect = on_disconnect
        self.info: dict[str, object] = {}
        self.connected = False
        self.closed = False
        self.reconnects = 0
        self._current = self.servers[0]
        self._stream: anyio.abc.ByteStream | None = None
        self._socket: socket.socket | None = None  # for direct writes (None: through the writer)
        self._parser = p.ClientConnection()
        self._out: list[bytes] = []
        self._has_data = anyio.Event()
        self._woken = False  # `_has_data` is set (for the writer's next round)
        self._writing = False  # the writer is inside a send: nothing may be written past it
        self._last_write = 0.0  # time.perf_counter() of the latest write
        self._subs: dict[str, tuple[str, str, Callable[[NatsMsg], None]]] = {}
        self._sids = itertools.count(1)
        self._pongs: list[anyio.Event] = []
        self._mux_prefix = new_inbox(inbox_prefix)
        self._mux_sid: str | None = None
        self._requests: dict[str, MemoryObjectSendStream[bytes]] = {}
        self._tokens = itertools.count(1)
        self._closed_event = anyio.Event()
        self._reconnected = anyio.Event()
        self._lost_scope: anyio.CancelScope | None = None
        self.last_error = ""

    # -- public API ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The server in use (without credentials)."""
        return str(self._current)

    @property
    def servers(self) -> list[ServerUrl]:
        """The servers it knows: those it was given, then those the cluster named."""
        return self._servers.known

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
            or self._socket is None
            or time.perf_counter() - self._last_write < _STREAMING_GAP_S
        ):
            if not self._woken:  # once per writer round: a wrapped Event.set per message costs
                self._woken = True
                self._has_data.set()
        else:
            self._write_now()
        return True

    def _write_now(self) -> None:
        """Write the one queued frame straight to the socket; the writer gets what the socket does not
        take, or the error to meet."""
        data = self._out[0]
        assert self._socket is not None
        sent = write_socket(self._socket, data)
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
        """Request/reply through one wildcard inbox; bound it with `anyio.fail_after`. While
        disconnected it waits for the reconnect."""
        if self._mux_sid is None:
            self._mux_sid = self.subscribe(self._mux_prefix + ".*", self._on_mux)
        token = str(next(self._tokens))
        send, receive = anyio.create_memory_object_stream[bytes](1)
        self._requests[token] = send
        try:
            while not self.publish(subject, payload, reply=f"{self._mux_prefix}.{token}"):
                await self._reconnected.wait()
            try:
                return await receive.receive()
            except anyio.EndOfStream:
                raise ConnectionClosedError("connection closed") from None
        finally:
            del self._requests[token]
            send.close()
            receive.close()

    async def flush(self) -> None:
        """Round trip to the server: everything queued before has been processed by it."""
        if not self.connected:
            raise ConnectionClosedError("not connected")
        pong = anyio.Event()
        self._pongs.append(pong)
        self._out.append(p.PING_BYTES)
        self._has_data.set()
        await pong.wait()

    async def close(self) -> None:
        if self.closed:
            return
        if self.connected and self._out and self._stream is not None:
            with anyio.move_on_after(1):
                data = b"".join(self._out)
                self._out.clear()
                await self._stream.send(data)
        self.closed = True
        self.connected = False
        if self._lost_scope is not None:
            self._lost_scope.cancel()
        await self._closed_event.wait()

    # -- running ---------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect to one of the servers (the last error propagates when none answers), then serve the
        connection, reconnecting, until closed."""
        try:
            await self._connect_any(self.servers)
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
                        log.warning("giving up reconnecting (last server %s)", self._current)
                        self.closed = True
                        break
                    attempts += 1
                    await anyio.sleep(self.reconnect_wait_s)
                    try:
                        await self._connect(self._servers.after(self._current)[0])
                    except (OSError, TimeoutError, _Lost, p.RemoteProtocolError, NatsError) as exc:
                        log.debug("reconnect to %s failed: %s", self._current, exc)
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
                with anyio.move_on_after(1, shield=True):
                    await anyio.aclose_forcefully(self._stream)
            for send in self._requests.values():
                send.close()
            self._reconnected.set()
            self._closed_event.set()

    async def _connect_any(self, servers: Sequence[ServerUrl]) -> None:
        error: BaseException | None = None
        for url in servers:
            try:
                await self._connect(url)
                return
            except (OSError, TimeoutError, _Lost, p.RemoteProtocolError) as exc:
                error = exc
                log.debug("connect to %s failed: %s", url, exc)
        assert error is not None
        raise error

    async def _connect(self, url: ServerUrl) -> None:
        self._current = url
        with anyio.fail_after(self.connect_timeout_s):
            stream: anyio.abc.ByteStream = await anyio.connect_tcp(url.host, url.port)
            try:
                self._parser = p.ClientConnection()
                event = await self._next_event(stream)
                if not isinstance(event, p.Info):
                    raise _Lost(f"expected INFO, got {event!r}")
                handshake = Handshake(url, self._handshake)
                raw: socket.socket | None = None
                try:
                    tls = handshake.tls_for(event)
                    self.info = event.options
                    if tls is not None:
                        stream = await TLSStream.wrap(
                            stream, hostname=url.host, ssl_context=tls, standard_compatible=False
                        )
                    elif _running_trio():
                        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
                    await stream.send(handshake.connect())
                    while not handshake.done(await self._next_event(stream)):
                        pass
                except HandshakeError as exc:
                    raise NatsError(str(exc)) from None
            except BaseException:
                await anyio.aclose_forcefully(stream)
                raise
        self._servers.learn(self.info, url)
        self._stream, self._socket = stream, raw
        self._out = resubscribe((sid, subject, queue) for sid, (subject, queue, _) in self._subs.items())
        self._has_data = anyio.Event()
        self._woken = False
        self._writing = False  # the old connection's writer may have died inside a send
        if self._out:
            self._has_data.set()
        self.connected = True
        self._reconnected.set()
        self._reconnected = anyio.Event()

    async def _next_event(self, stream: anyio.abc.ByteStream) -> p.Event:
        while True:
            event = self._parser.next_event()
            if not isinstance(event, p._NeedData):
                return event
            try:
                data = await stream.receive(_READ_SIZE)
            except anyio.EndOfStream:
                raise _Lost("connection closed by the server") from None
            self._parser.receive_data(bytes(data))

    async def _serve(self) -> None:
        with anyio.CancelScope() as scope:
            self._lost_scope = scope
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._reader, tasks.cancel_scope)
                tasks.start_soon(self._writer, tasks.cancel_scope)
                tasks.start_soon(self._pinger, tasks.cancel_scope)
        self._lost_scope = None
        for pong in self._pongs:
            pong.set()  # flush() waiters: the connection they waited on is gone
        self._pongs.clear()
        if self._stream is not None:
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(self._stream)
            self._stream, self._socket = None, None

    async def _reader(self, lost: anyio.CancelScope) -> None:
        assert self._stream is not None
        stream, parser = self._stream, self._parser
        try:
            while True:
                data = await stream.receive(_READ_SIZE)
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
        except (*_LOST, p.RemoteProtocolError) as exc:
            log.debug("connection lost: %r", exc)
        lost.cancel()

    def _on_control(self, event: p.Event) -> None:
        if isinstance(event, p.Ping):
            self._out.append(p.PONG_BYTES)
            self._has_data.set()
        elif isinstance(event, p.Pong):
            if self._pongs:
                self._pongs.pop(0).set()
        elif isinstance(event, p.Info):
            self._servers.learn(event.options, self._current)
        elif isinstance(event, p.Err):
            self.last_error = event.text
            log.warning("server error: %s", event.text)

    async def _writer(self, lost: anyio.CancelScope) -> None:
        assert self._stream is not None
        stream = self._stream
        try:
            while True:
                await self._has_data.wait()
                self._has_data = anyio.Event()
                self._woken = False
                if self._out:
                    data = b"".join(self._out)
                    self._out.clear()
                    self._writing = True
                    await stream.send(data)
                    self._writing = False
                    self._last_write = time.perf_counter()
        except _LOST:
            lost.cancel()

    async def _pinger(self, lost: anyio.CancelScope) -> None:
        outstanding: list[anyio.Event] = []
        while True:
            await anyio.sleep(self.ping_interval_s)
            outstanding = [e for e in outstanding if not e.is_set()]
            if len(outstanding) >= self.max_pings_out:
                log.info("no PONG for %d pings: reconnecting", len(outstanding))
                lost.cancel()
                return
            pong = anyio.Event()
            outstanding.append(pong)
            self._pongs.append(pong)
            self._out.append(p.PING_BYTES)
            self._has_data.set()

    def _on_mux(self, msg: NatsMsg) -> None:
        send = self._requests.get(msg.subject.rsplit(".", 1)[-1])
        if send is not None:
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError):  # a duplicate reply
                send.send_nowait(msg.data)
