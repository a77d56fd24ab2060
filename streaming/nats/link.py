"""A link to an external NATS server or cluster: the STAN door's bus with `--nats_server`.

The server is then one more client of that cluster, as nats-streaming-server is with `-ns`: clients
connect to any node, and the cluster's subject routing brings their STAN requests here.

- It connects to the first URL that answers, learns the cluster's other nodes from INFO
  `connect_urls`, and after a drop reconnects to any node it knows (forever, `reconnect_wait_s`
  apart), sending CONNECT and every subscription again (the handshake and the server list are
  streaming.wire.handshake's, shared with the client library). Topology listeners hear each reconnect and
  each change in the nodes an INFO lists (the partition claims are checked again then).
- It authenticates as the cluster asks: user and password, a token (in the URL or the options), a
  user's nkey seed (signing the nonce of the INFO), a credentials file (a user JWT and its seed, as
  in operator mode), a TLS client certificate.
- Each chunk read from the socket is one input span, as on the embedded broker, so the acks of one
  read are applied together; handlers run in the reader, in order, and an awaitable one returns is
  awaited before reading on. A link cannot tell which client sent a message: handlers are given
  `UNKNOWN_ORIGIN`.
- Writes are coalesced: what a span sends leaves in one non-blocking write at its end, and a writer
  task sends what the socket did not take. While disconnected nothing can be sent, and nothing is
  buffered: a delivery comes back after its AckWait, a publisher re-sends a publish whose PubAck it
  did not get, a heartbeat is tried again (`dropped` counts them).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterator
from functools import partial

import attrs
import trio

from streaming.nats.bus import UNKNOWN_ORIGIN, BusStatistics, Handler, RunHandler, SpanListener, handle_read
from streaming.security.auth import Authenticator, NkeySeed
from streaming.wire import nats as p
from streaming.wire.handshake import Handshake, HandshakeError, HandshakeOptions, ServerList, resubscribe
from streaming.wire.sockets import write_now
from streaming.wire.urls import ServerUrl

log = logging.getLogger(__name__)
_EVENTS_PER_STEP = 128  # as the embedded broker: events of one read handled before a checkpoint
_READ_SIZE = 65536
_CLOSED_BY_SERVER = "it closed the connection: it stopped, or found this server a slow consumer"
_NO_WAITS: list[Awaitable[None]] = []  # shared and never appended to
_MAX_PENDING_BYTES = 64 * 1024 * 1024  # unsent bytes past this are dropped: the cluster is not reading


class LinkError(Exception):
    """No node of the cluster could be reached, or the cluster refused the connection."""


@attrs.define
class LinkOptions:
    urls: list[ServerUrl]
    name: str = "streaming-server"
    user: str = ""
    password: str = ""
    token: str = ""
    nkey_seed: NkeySeed | None = None
    jwt: str = ""  # a user JWT (from a credentials file), signed for with `nkey_seed`
    tls: ssl.SSLContext | None = None  # client certificate and CAs; None: the system's CAs if TLS is asked for
    reconnect_wait_s: float = 1.0
    connect_timeout_s: float = 2.0
    ping_interval_s: float = 20.0
    max_pings_out: int = 3


class NatsLink:
    """The bus (streaming.nats.bus) over one client connection to an external NATS cluster."""

    def __init__(self, options: LinkOptions) -> None:
        if not options.urls:
            raise ValueError("no NATS server URL")
        self.options = options
        self.server_id = ""  # the node connected to, from its INFO
        self.auth = Authenticator()  # the cluster checks who connects, not this process
        self.slow_consumers = 0
        self.protocol_errors: collections.Counter[str] = collections.Counter()
        self.connected = False
        self.reconnects = 0
        self._lost_why = ""  # why the last connection ended, for the log
        self.dropped = 0  # messages not sent: disconnected, too large for the cluster, or it stopped reading
        self.max_payload = p.MAX_PAYLOAD  # the cluster's, from INFO
        self.in_msgs = self.out_msgs = self.in_bytes = self.out_bytes = 0
        self.holding = 0
        self._servers = ServerList(options.urls)  # configured first, then what INFO told
        self._current: ServerUrl | None = None
        self._subs: dict[str, tuple[str, str, Handler, RunHandler | None]] = {}
        self._sids = itertools.count(1)
        self._span_listeners: list[SpanListener] = []
        self._topology_listeners: list[Callable[[], None]] = []
        self._stream: trio.abc.Stream | None = None
        self._parser = p.ClientConnection()
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._held = False
        self._writing = False
        self._has_data = trio.Event()
        self._pings_out = 0
        self._pongs: list[trio.Event] = []
        self._up = trio.Event()  # set while connected

    # -- the bus ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return str(self._current) if self._current is not None and self.connected else ""

    def subscribe(self, subject: str, handler: Handler, queue: str = "", *, runs: RunHandler | None = None) -> object:
        sid = str(next(self._sids))
        self._subs[sid] = (subject, queue, handler, runs)
        if self.connected:
            self._queue(p.encode_sub(subject, sid, queue))
        return sid

    def unsubscribe(self, token: object) -> None:
        assert isinstance(token, str)
        if self._subs.pop(token, None) is not None and self.connected:
            self._queue(p.encode_unsub(token))

    def publish(self, subject: str, payload: bytes, reply: str = "", *, to: int = 0) -> list[Awaitable[None]]:
        """Send one message (`to` is meaningless here: the cluster routes it by subject)."""
        if len(payload) > self.max_payload:
            self._too_large(subject, len(payload))
        elif self._send(p.encode_pub(subject, reply, payload)):
            self.out_msgs += 1
            self.out_bytes += len(payload)
        return _NO_WAITS

    def publish_many(self, subject: str, payloads: list[bytes]) -> None:
        limit = self.max_payload
        frames = []
        for payload in payloads:
            if len(payload) > limit:
                self._too_large(subject, len(payload))
            else:
                frames.append(p.encode_pub(subject, "", payload))
        if frames and self._send(b"".join(frames)):
            self.out_msgs += len(frames)
            self.out_bytes += sum(map(len, payloads))

    @contextlib.contextmanager
    def holding_writes(self) -> Iterator[None]:
        """What is sent inside leaves in one write at the end (only around code that does not await)."""
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1
            if not self.holding and self._held:
                self._held = False
                self._write_now()

    def add_span_listener(self, listener: SpanListener) -> None:
        self._span_listeners.append(listener)

    def add_topology_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` runs after each reconnect and when the cluster's nodes change."""
        self._topology_listeners.append(listener)

    def add_close_hook(self, hook: Callable[[list[str]], None]) -> None:
        """Client connections are the cluster's: a link never hears of one closing."""

    def add_disconnect_hook(self, hook: Callable[[int], None]) -> None:
        """As `add_close_hook`."""

    def protect(self, prefix: str) -> None:
        """The cluster's permissions keep clients off the server's subjects (docs/security.md)."""

    def reserve(self, subject: str, owner: int) -> None:
        """As `protect`: a client's inboxes are kept to it by the cluster's permissions."""

    def release(self, subject: str) -> None:
        """As `reserve`."""

    def client_connected(self, cid: int) -> bool:
        return False

    def has_interest(self, subject: str) -> bool:
        """Unknown on a link: somebody may listen (a heartbeat then waits for its answer)."""
        return True

    async def wait_interest(self, subjects: list[str]) -> None:
        """Whether anybody listens is unknown; but nothing reaches anybody before the link is up (a
        restart's recovered messages wait for it, rather than being dropped)."""
        await self._up.wait()

    def statistics(self) -> BusStatistics:
        return BusStatistics(
            int(self.connected),
            self.reconnects + int(self.connected),
            len(self._subs),
            self.in_msgs,
            self.out_msgs,
            self.in_bytes,
            self.out_bytes,
            self.slow_consumers,
        )

    async def flush(self) -> None:
        """A round trip: what was sent before has been taken by the node (raises LinkError when the
        connection goes meanwhile)."""
        if not self.connected:
            raise LinkError("not connected to the NATS server")
        pong = trio.Event()
        self._pongs.append(pong)
        self._queue(p.PING_BYTES)
        await pong.wait()
        if not self.connected:
            raise LinkError("the connection to the NATS server was lost")

    # -- writing ---------------------------------------------------------------------------------

    def _send(self, data: bytes) -> bool:
        if not self.connected:
            self.dropped += 1
            return False
        if self._out_bytes + len(data) > _MAX_PENDING_BYTES:
            self.dropped += 1
            self.slow_consumers += 1
            log.error("the NATS server is not taking what this server sends: %d bytes wait; dropped", self._out_bytes)
            return False
        self._queue(data)
        return True

    def _queue(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        if self.holding:
            self._held = True
        else:
            self._has_data.set()

    def _write_now(self) -> None:
        """Write what is queued straight to the socket if the writer is idle; the writer gets the rest."""
        stream = self._stream
        if not self._out:
            return
        if self._writing or not isinstance(stream, trio.SocketStream):  # TLS: through the writer
            self._has_data.set()
            return
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        sent = write_now(stream, data)
        if sent == len(data):
            self._out.clear()
            self._out_bytes = 0
            return
        self._out[:] = [data[sent:]]
        self._out_bytes = len(data) - sent
        self._has_data.set()

    def _too_large(self, subject: str, size: int) -> None:
        self.dropped += 1
        log.error(
            "not sent to %s: %d bytes, over the NATS cluster's max_payload of %d (set max_payload no higher)",
            subject,
            size,
            self.max_payload,
        )

    # -- connecting ------------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect (LinkError when no node answers), then serve the link, reconnecting, until cancelled.
        Reports port 0 through `task_status`: clients connect to the cluster, not to this process."""
        await self._connect_any()
        task_status.started(0)
        while True:
            await self._session()
            self.connected = False
            self._up = trio.Event()
            for pong in self._pongs:
                pong.set()  # flush() waiters: what they waited for is gone with the connection
            self._pongs.clear()
            log.warning(
                "lost the connection to the NATS server at %s (%s): reconnecting; what it held for this server "
                "is lost, so a client whose publish or PubAck was in it gets a PubAck timeout",
                self._current,
                self._lost_why or "it failed",
            )
            failures = 0
            while True:
                await trio.sleep(self.options.reconnect_wait_s)
                try:
                    await self._connect_any()
                    break
                except LinkError as exc:
                    failures += 1
                    if failures == 1 or failures % 60 == 0:
                        log.warning("%s (attempt %d); trying again", exc, failures)
            self.reconnects += 1
            log.info("reconnected to the NATS server at %s", self._current)
            self._topology_changed()

    async def _connect_any(self) -> None:
        """Try every known node, starting after the one in use."""
        why: list[str] = []
        for url in self._servers.after(self._current):
            try:
                await self._connect(url)
                return
            except (OSError, trio.TooSlowError, trio.BrokenResourceError, p.RemoteProtocolError) as exc:
                why.append(f"{url}: {exc or type(exc).__name__}")
            except LinkError as exc:
                why.append(f"{url}: {exc}")
        raise LinkError("cannot connect to the NATS server (" + "; ".join(why) + ")")

    async def _connect(self, url: ServerUrl) -> None:
        options = self.options
        with trio.fail_after(options.connect_timeout_s):
            stream: trio.abc.Stream = await trio.open_tcp_stream(url.host, url.port)
            try:
                parser = p.ClientConnection()
                info = await _next_event(stream, parser)
                if not isinstance(info, p.Info):
                    raise LinkError(f"expected INFO, got {info!r}")
                handshake = Handshake(url, self._handshake_options())
                try:
                    tls = handshake.tls_for(info)
                    if tls is not None:
                        stream = trio.SSLStream(stream, tls, server_hostname=url.host)
                        await stream.do_handshake()
                    await stream.send_all(handshake.connect())
                    while not handshake.done(await _next_event(stream, parser)):
                        pass
                except HandshakeError as exc:
                    raise LinkError(str(exc)) from None
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
        self._stream, self._parser, self._current = stream, parser, url
        self._on_info(info.options, connecting=True)
        self.server_id = str(info.options.get("server_id", ""))
        self._out = resubscribe((sid, subject, queue) for sid, (subject, queue, _, _) in self._subs.items())
        self._out_bytes = sum(map(len, self._out))
        self._has_data = trio.Event()
        self._writing = self._held = False
        self._pings_out = 0
        self.connected = True
        self._up.set()
        if self._out:
            self._has_data.set()
        log.info("attached to the NATS server at %s (server %s)", url, self.server_id)

    def _handshake_options(self) -> HandshakeOptions:
        options = self.options
        seed, jwt = options.nkey_seed, options.jwt
        signer = None
        if seed is not None:
            key, public = ("jwt", jwt) if jwt else ("nkey", seed.public)

            def signer(nonce: str) -> dict[str, str]:  # a user JWT, or a bare nkey, and its signature
                return {key: public, "sig": seed.sign(nonce)}

        return HandshakeOptions(
            name=options.name,
            lang="python-streaming-server",
            echo=False,  # its own messages never come back to it (announcements included)
            user=options.user,
            password=options.password,
            token=options.token,
            signer=signer,
            tls=options.tls,
            tls_when_asked=True,
        )

    def _on_info(self, info: dict[str, object], *, connecting: bool = False) -> None:
        payload = info.get("max_payload")
        if isinstance(payload, int) and payload > 0:
            self.max_payload = payload
        assert self._current is not None
        if not self._servers.learn(info, self._current):
            return
        if not connecting:  # a (re)connect is a change of its own, told by `serve`
            log.info("the NATS cluster changed: %s", ", ".join(self._servers.cluster) or "one node")
            self._topology_changed()

    def _topology_changed(self) -> None:
        for listener in self._topology_listeners:
            listener()

    # -- serving ---------------------------------------------------------------------------------

    async def _session(self) -> None:
        self._lost_why = ""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._reader, nursery.cancel_scope)
            nursery.start_soon(self._writer, nursery.cancel_scope)
            nursery.start_soon(self._pinger, nursery.cancel_scope)
        if self._stream is not None:
            with trio.move_on_after(1, shield=True):
                await trio.aclose_forcefully(self._stream)
            self._stream = None

    async def _reader(self, lost: trio.CancelScope) -> None:
        assert self._stream is not None
        stream, parser, listeners = self._stream, self._parser, self._span_listeners
        handle_span = partial(self._handle_span, parser)
        try:
            while True:
                data = await stream.receive_some(_READ_SIZE)
                if not data:
                    # nats-server closes a member that falls behind by more than its `max_pending`
                    # (a slow consumer) without a word to it; its own log says so.
                    self._lost_why = self._lost_why or _CLOSED_BY_SERVER
                    break
                parser.receive_data(data if type(data) is bytes else bytes(data))
                await handle_read(self.holding_writes, listeners, handle_span, full=len(data) == _READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._lost_why = self._lost_why or str(exc.__cause__ or exc) or type(exc).__name__
        except p.RemoteProtocolError as exc:
            self._lost_why = "it sent what this server cannot parse"
            log.error("the NATS server sent what this server cannot parse (%s): reconnecting", exc)
        lost.cancel()

    def _handle_span(self, parser: p.ClientConnection) -> tuple[list[Awaitable[None]], bool]:
        subs = self._subs
        budget = _EVENTS_PER_STEP
        while budget > 0:
            budget -= 1
            event = parser.next_event()
            if event is p.NEED_DATA:
                return _NO_WAITS, False
            if type(event) is p.Msg:
                self.in_msgs += 1
                self.in_bytes += len(event.payload)
                sub = subs.get(event.sid)
                if sub is None:
                    continue
                runs = sub[3]
                if runs is not None and budget:
                    # The same sid, subject and reply (the line repeats byte for byte): one call.
                    payloads = [event.payload]
                    more = parser.repeats(budget)
                    budget -= len(more)
                    self.in_msgs += len(more)
                    self.in_bytes += len(event.payload) * len(more)
                    payloads += more
                    try:
                        result = runs(event.subject, event.reply, payloads, UNKNOWN_ORIGIN)
                    except Exception:
                        log.exception("handling messages on %s failed", event.subject)
                        continue
                    if result is not None:
                        return [_logging_failure(result, event.subject)], True
                    continue
                try:
                    result = sub[2](event.subject, event.reply, event.payload, UNKNOWN_ORIGIN)
                except Exception:
                    log.exception("handling a message on %s failed", event.subject)
                    continue
                if result is not None:
                    return [_logging_failure(result, event.subject)], True
            else:
                assert isinstance(event, p.Event)
                self._on_control(event)
        return _NO_WAITS, True

    def _on_control(self, event: p.Event) -> None:
        if isinstance(event, p.Ping):
            self._queue(p.PONG_BYTES)
        elif isinstance(event, p.Pong):
            self._pings_out = 0
            if self._pongs:
                self._pongs.pop(0).set()
        elif isinstance(event, p.Info):
            self._on_info(event.options)
        elif isinstance(event, p.Err):
            kind = "permissions" if event.text.startswith(p.PERMISSIONS_VIOLATION) else "other"
            self.protocol_errors[kind] += 1
            log.error("the NATS server refused: %s", event.text)

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
                    self._out_bytes = 0
                    self._writing = True
                    await stream.send_all(data)
                    self._writing = False
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._lost_why = self._lost_why or str(exc.__cause__ or exc) or type(exc).__name__
            lost.cancel()

    async def _pinger(self, lost: trio.CancelScope) -> None:
        while True:
            await trio.sleep(self.options.ping_interval_s)
            if self._pings_out >= self.options.max_pings_out:
                self._lost_why = f"no answer to {self._pings_out} pings"
                lost.cancel()
                return
            self._pings_out += 1
            self._queue(p.PING_BYTES)


async def _logging_failure(wait: Awaitable[None], subject: str) -> None:
    """A handler's awaitable whose failure is logged: one bad request must not cost the link."""
    try:
        await wait
    except Exception:
        log.exception("handling a message on %s failed", subject)


async def _next_event(stream: trio.abc.Stream, parser: p.ClientConnection) -> p.Event:
    while True:
        event = parser.next_event()
        if not isinstance(event, p._NeedData):
            return event
        data = await stream.receive_some(_READ_SIZE)
        if not data:
            raise LinkError("connection closed by the server")
        parser.receive_data(bytes(data))
