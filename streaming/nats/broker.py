"""The embedded NATS core broker under Trio: accepts connections, routes messages by subject.

Each connection (streaming.nats.connection) is a nursery with a reader (this connection's handler
task, here), a writer and a pinger (there); what each request is answered is decided by its session
(streaming.nats.session, sans-IO) and carried out here. What a reader's chunk of input (or a
`holding_writes` block) queues is written at the end of it, straight to each socket whose writer is
idle: a non-blocking write, no task switch, which is most of a delivery's latency on the server.
This module keeps one job, routing by subject under the server's rules for its own subjects, which
is why it runs past 500 lines.

In-process subscribers (the STAN layer) register handlers with `subscribe()`. A handler runs in the
publishing connection's reader task, in arrival order; it may return an awaitable, which the reader
awaits before reading on (that is how one connection's requests stay ordered). Each chunk read from
a socket is one input span: listeners registered with `add_span_listener` (the delivery core) hear
when one starts and ends, so work can be batched per read rather than per message. A large read is
handled in slices (`_EVENTS_PER_STEP`), each its own span, with a checkpoint after each, so other
connections' writers are not starved meanwhile.

The broker also keeps the server's own subjects to the server (see docs/security.md):
- *internal* subjects (`_STAN.` but for `_STAN.acks.`, where clients take their PubAcks; and any
  prefix given to `protect`) reach in-process subscribers only: a client's SUB to one is refused with
  nats-server's `Permissions Violation`, and a wildcard such as `>` never matches one;
- *reserved* subjects (a STAN client's inboxes: `reserve`) belong to one connection: what the server
  sends there reaches that connection only (or, while its owner is away, only literal subscriptions
  of the subject, as a reconnecting client makes), and a client's PUB to one is refused;
- `publish(..., to=cid)` answers a request to the connection that sent it only, and every handler is
  given the sending connection's `Origin` (its id, user and permissions), for the STAN layer's checks.
"""

from __future__ import annotations

import collections
import errno
import itertools
import logging
import os
import secrets
import ssl
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import attrs
import trio

from streaming.nats.bus import UNKNOWN_ORIGIN, BusStatistics, Handler, Origin, RunHandler, SpanListener, handle_read
from streaming.nats.connection import Connection, Sub
from streaming.nats.memory import release_freed_memory
from streaming.nats.session import INVALID_PUBLISH_SUBJECT, Refusal, violation
from streaming.security.auth import Authenticator
from streaming.wire import nats as p
from streaming.wire.subjects import Sublist, valid_literal, valid_subject

log = logging.getLogger(__name__)
_EVENTS_PER_STEP = 128  # events handled from one read before the reader lets other tasks run
_READ_SIZE = 65536
# accept() failing for want of descriptors or memory: retry after this, doubled up to the maximum.
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_RETRY_FIRST_S = 0.1
_ACCEPT_RETRY_MAX_S = 1.0

_NO_WAITS: list[Awaitable[None]] = []  # shared and never appended to
_INTERNAL = "_STAN."
_CLIENT_SPACE = "_STAN.acks."  # clients' own PubAck inboxes (stan.go, node-nats-streaming, ours)
# Who may receive a message (`Broker._receivers`): anyone, nobody remote, literal subscriptions only,
# or (a positive number) that connection only.
_ANYONE, _NOBODY, _LITERAL = 0, -1, -2
VERSION = "2.10.0"  # the NATS server version we behave like (clients only read it for features)


@attrs.frozen
class BrokerConfig:
    host: str = "0.0.0.0"
    port: int = 4222
    max_payload: int = p.MAX_PAYLOAD
    max_control_line: int = p.MAX_CONTROL_LINE
    max_pending_bytes: int = 64 * 1024 * 1024
    write_deadline_s: float = 10.0
    ping_interval_s: float = 120.0
    max_pings_out: int = 2
    connect_timeout_s: float = 2.0  # a connection must send CONNECT this soon (0: no limit)
    server_name: str = "streaming-server"


# Labels for the protocol-error counter (a fixed set, whatever a client sends).
_ERROR_KINDS: dict[str, str] = {
    p.UNKNOWN_OP: "unknown_operation",
    p.MAX_CONTROL_EXCEEDED: "max_control_line",
    p.MAX_PAYLOAD_VIOLATION: "max_payload",
    p.INVALID_SUBJECT: "invalid_subject",
    p.INVALID_PUBLISH_SUBJECT: "invalid_publish_subject",
}
# Every key of Broker.protocol_errors.
PROTOCOL_ERROR_KINDS = (*_ERROR_KINDS.values(), "permissions", "authorization", "tls", "other")


class Broker:
    def __init__(
        self,
        config: BrokerConfig | None = None,
        auth: Authenticator | None = None,
        tls: ssl.SSLContext | None = None,
        tls_verify: bool = False,
    ) -> None:
        self.config = config or BrokerConfig()
        self.auth = auth or Authenticator()
        self.tls = tls  # every connection: a plain INFO, then the TLS handshake (nats-server's way)
        self.tls_verify = tls_verify  # client certificates are required (INFO says so)
        self.server_id = secrets.token_hex(11).upper()
        self._sublist: Sublist[Sub] = Sublist()
        self._sub_added = trio.Event()
        self._conns: dict[int, Connection] = {}
        self._cids = itertools.count(1)
        self._span_listeners: list[SpanListener] = []
        self._close_hooks: list[Callable[[list[str]], None]] = []
        self._disconnect_hooks: list[Callable[[int], None]] = []
        self._internal: tuple[str, ...] = (_INTERNAL,)
        self._reserved: dict[str, int] = {}  # subject -> owning connection (0: away)
        self._run_rest = 0  # how many PUBs after the one `_on_pub` handled went with it, as a run
        self.holding = 0  # depth of `holding_writes` blocks
        self.held: list[Connection] = []  # connections with bytes queued inside them
        self.port = 0
        self.total_connections = 0
        self.in_msgs = self.out_msgs = self.in_bytes = self.out_bytes = 0
        self.slow_consumers = 0
        self.protocol_errors: collections.Counter[str] = collections.Counter()  # kind -> count

    # -- in-process API --------------------------------------------------------------------------

    def subscribe(self, subject: str, handler: Handler, queue: str = "", *, runs: RunHandler | None = None) -> object:
        """Register an in-process subscriber; returns a token for `unsubscribe`. `runs`: see `Bus`."""
        if not valid_subject(subject):
            raise ValueError(f"invalid subject {subject!r}")
        sub = Sub(None, "", subject, queue, handler, runs)
        self._sublist.add(sub, subject, queue)
        return sub

    def unsubscribe(self, token: object) -> None:
        assert isinstance(token, Sub)
        self._sublist.remove(token)

    def add_span_listener(self, listener: SpanListener) -> None:
        """`listener` hears when a reader starts and ends handling a span of a connection's input."""
        self._span_listeners.append(listener)

    def add_close_hook(self, hook: Callable[[list[str]], None]) -> None:
        """`hook(subjects)` runs when a connection is gone, with the subjects it had subscribed to."""
        self._close_hooks.append(hook)

    def add_disconnect_hook(self, hook: Callable[[int], None]) -> None:
        """`hook(cid)` runs when connection `cid` is gone (after its reserved subjects lost their owner)."""
        self._disconnect_hooks.append(hook)

    # -- the server's own subjects ---------------------------------------------------------------

    def protect(self, prefix: str) -> None:
        """Make subjects starting with `prefix` internal too (a discover prefix outside `_STAN.`)."""
        if prefix not in self._internal:
            self._internal = (*self._internal, prefix)

    def client_connected(self, cid: int) -> bool:
        """Whether connection `cid` is open."""
        return cid in self._conns

    def internal(self, subject: str) -> bool:
        """Whether `subject` is for in-process subscribers only (clients may not subscribe to it)."""
        return subject.startswith(self._internal) and not subject.startswith(_CLIENT_SPACE)

    def reserve(self, subject: str, owner: int) -> None:
        """What the server sends to `subject` goes to connection `owner` only (0: the owner is away:
        to literal subscriptions of it only), and no client may publish to it."""
        previous = self._reserved.get(subject)
        if previous == owner:
            return
        if previous:
            conn = self._conns.get(previous)
            if conn is not None:
                conn.reserved.discard(subject)
        conn = self._conns.get(owner) if owner else None
        if conn is None:
            owner = 0
        else:
            conn.reserved.add(subject)
        self._reserved[subject] = owner

    def release(self, subject: str) -> None:
        owner = self._reserved.pop(subject, 0)
        conn = self._conns.get(owner) if owner else None
        if conn is not None:
            conn.reserved.discard(subject)

    def _receivers(self, subject: str, origin: Connection | None) -> int:
        """Which remote subscriptions a message to `subject` may reach (see `_ANYONE`)."""
        if self.internal(subject):
            return _NOBODY
        owner = self._reserved.get(subject)
        if owner is None:
            return _ANYONE
        if origin is not None:  # a client writing into another's inbox: forging its messages
            self._refuse(origin, violation("Publish", subject))
            return _NOBODY
        return owner or _LITERAL

    @contextmanager
    def holding_writes(self) -> Iterator[None]:
        """What is sent inside goes out at the end, one write per connection, straight to its socket
        when it can. Only around code that does not await: a send from another task meanwhile would
        wait for this block to end too."""
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1
            if not self.holding and self.held:
                held, self.held = self.held, []
                for conn in held:
                    conn.write_now()

    def has_interest(self, subject: str) -> bool:
        """Whether a message the server sends to `subject` would reach a subscriber."""
        if subject not in self._reserved:
            return self._sublist.has_interest(subject)
        allowed = self._receivers(subject, None)
        return any(
            sub.conn is None or (sub.literal if allowed == _LITERAL else sub.conn.cid == allowed)
            for sub in self._sublist.match(subject)
        )

    async def wait_interest(self, subjects: list[str]) -> None:
        """Return once every subject has a subscriber."""
        while not all(self.has_interest(s) for s in subjects):
            await self._sub_added.wait()

    def publish(self, subject: str, payload: bytes, reply: str = "", *, to: int = 0) -> list[Awaitable[None]]:
        """Route one message; returns the awaitables in-process handlers asked to be awaited. `to`:
        only to that connection (an answer to the request it sent)."""
        if to:
            conn = self._conns.get(to)
            if conn is not None and not self.internal(subject):
                for sub in self._sublist.match(subject):
                    if sub.conn is conn:
                        self._send(sub, conn, subject, reply, payload)
            return _NO_WAITS
        return self._route(subject, reply, payload, None)

    def publish_many(self, subject: str, payloads: list[bytes]) -> None:
        """Several messages to one subject with one lookup and one write per receiver: the PubAcks of
        a commit, a run of deliveries to one inbox. A subject an in-process handler or an
        auto-unsubscribing subscription listens on takes the general path, one message at a time."""
        receivers = self._sublist.match(subject)
        if any(sub.conn is None or sub.max_msgs is not None for sub in receivers):
            for payload in payloads:  # the general path keeps handlers and auto-unsubscribe exact
                self._route(subject, "", payload, None)
            return
        allowed = self._receivers(subject, None) if receivers else _ANYONE
        for sub in receivers:
            assert sub.conn is not None
            if allowed and not (sub.conn.cid == allowed or (allowed == _LITERAL and sub.literal)):
                continue
            if sub.denied is not None and not sub.denied.may_receive(subject):
                continue
            sub.conn.send(p.encode_msgs(subject, sub.sid, payloads))
            self.out_msgs += len(payloads)
            self.out_bytes += sum(map(len, payloads))
            sub.delivered += len(payloads)

    def _route(
        self, subject: str, reply: str, payload: bytes, origin: Connection | None, subs: list[Sub] | None = None
    ) -> list[Awaitable[None]]:
        """Hand a message to everyone it reaches (`subs`: `subject`'s match, if the caller has it)."""
        waits: list[Awaitable[None]] = _NO_WAITS  # allocated only when a handler returns something
        allowed: int | None = None  # looked up at the first remote receiver: acks have none
        for sub in self._sublist.match(subject) if subs is None else subs:
            conn = sub.conn
            if conn is None:
                assert sub.handler is not None
                result = sub.handler(subject, reply, payload, UNKNOWN_ORIGIN if origin is None else origin.origin)
                if result is not None:
                    if waits is _NO_WAITS:
                        waits = []
                    waits.append(result)
                continue
            if allowed is None:
                allowed = self._receivers(subject, origin)
            if allowed and not (conn.cid == allowed or (allowed == _LITERAL and sub.literal)):
                continue
            if (conn is origin and not conn.session.echo) or (
                sub.denied is not None and not sub.denied.may_receive(subject)
            ):
                continue
            self._send(sub, conn, subject, reply, payload)
        return waits

    def _send(self, sub: Sub, conn: Connection, subject: str, reply: str, payload: bytes) -> None:
        """One message to one remote subscription (which it may end, at its UNSUB maximum)."""
        conn.send(p.encode_msg(subject, sub.sid, reply, payload))
        self.out_msgs += 1
        self.out_bytes += len(payload)
        sub.delivered += 1
        if sub.max_msgs is not None and sub.delivered >= sub.max_msgs:
            self._remove(conn, sub.sid)

    @property
    def url(self) -> str:
        return f"nats://{self.config.host}:{self.port}" if self.port else ""

    def statistics(self) -> BusStatistics:
        return BusStatistics(
            len(self._conns),
            self.total_connections,
            len(self._sublist),
            self.in_msgs,
            self.out_msgs,
            self.in_bytes,
            self.out_bytes,
            self.slow_consumers,
        )

    # -- serving ---------------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled; reports the bound port through `task_status`."""
        host = None if self.config.host in ("", "0.0.0.0") else self.config.host
        listeners = await trio.open_tcp_listeners(self.config.port, host=host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("listening for NATS clients on %s:%d", self.config.host, self.port)
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept, listener, nursery)
            task_status.started(self.port)

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        """Accept connections; when the process is out of file descriptors (or memory for sockets),
        say so once, keep serving the connections there are, and try again, less often each time."""
        delay, refused = _ACCEPT_RETRY_FIRST_S, 0
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    if not refused:
                        log.error(
                            "cannot accept connections: %s (the process's file-descriptor limit?); serving the "
                            "connections there are, retrying",
                            os.strerror(exc.errno or 0),
                        )
                    refused += 1
                    await trio.sleep(delay)
                    delay = min(delay * 2, _ACCEPT_RETRY_MAX_S)
                    continue
                if refused:
                    log.info("accepting connections again (after %d refused attempts)", refused)
                    delay, refused = _ACCEPT_RETRY_FIRST_S, 0
                nursery.start_soon(self._handle, stream)

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            await self._serve_connection(stream)
        except Exception:
            # A bug while serving one connection must not take the listener (and everyone else) down.
            log.exception("connection handler failed")

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        conn = Connection(self, stream, next(self._cids))
        self.total_connections += 1
        self._conns[conn.cid] = conn
        info = p.encode_info(self._info(conn))
        try:
            if self.tls is None:
                conn.send(info)
            elif not await self._start_tls(conn, info, self.tls):
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.write_out)
                nursery.start_soon(conn.ping_out)
                with trio.CancelScope() as scope:
                    conn.reader_scope = scope
                    await self._reader(conn)
                conn.closing = True
                conn.has_data.set()
                if not conn.abort:
                    # The writer sends what is queued (an -ERR, say); give it a moment.
                    with trio.move_on_after(1):
                        await conn.flushed.wait()
                nursery.cancel_scope.cancel()
        finally:
            del self._conns[conn.cid]
            subjects = [sub.subject for sub in conn.subs.values()]
            for sub in list(conn.subs.values()):
                self._sublist.remove(sub)
            conn.subs.clear()
            conn.out.clear()
            for subject in conn.reserved:  # kept for the owner's return, on another connection
                self._reserved[subject] = 0
            conn.reserved.clear()
            with trio.move_on_after(1, shield=True):
                await trio.aclose_forcefully(conn.stream)
            for hook in self._close_hooks:
                hook(subjects)
            for disconnected in self._disconnect_hooks:
                disconnected(conn.cid)
            release_freed_memory()

    async def _start_tls(self, conn: Connection, info: bytes, context: ssl.SSLContext) -> bool:
        """Send INFO in the clear, then take the client's TLS handshake; False (logged, counted, and
        the connection closed by the caller) when it does not come or fails: a client without TLS."""
        tls = trio.SSLStream(conn.socket_stream, context, server_side=True)
        try:
            with trio.fail_after(self.config.connect_timeout_s or 10.0):
                await conn.socket_stream.send_all(info)
                await tls.do_handshake()
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            why = exc.__cause__ or ("timed out" if isinstance(exc, trio.TooSlowError) else "closed")
            log.info("connection %d (%s): no TLS handshake: %s", conn.cid, conn.remote, why)
            self.protocol_errors["tls"] += 1
            return False
        conn.stream, conn.tls = tls, True
        return True

    def _info(self, conn: Connection) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "server_name": self.config.server_name,
            "version": VERSION,
            "proto": 1,
            "host": self.config.host,
            "port": self.port,
            "headers": False,
            "max_payload": self.config.max_payload,
            "client_id": conn.cid,
            **({"auth_required": True} if self.auth.required else {}),
            **({"nonce": conn.nonce} if conn.nonce else {}),
            **({"tls_required": True} if self.tls is not None else {}),
            **({"tls_verify": True} if self.tls_verify else {}),
        }

    async def _reader(self, conn: Connection) -> None:
        stream = conn.stream
        parser = conn.parser
        listeners = self._span_listeners
        handle_span = partial(self._handle_span, conn, parser)
        while not conn.closing:
            try:
                data = await stream.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            parser.receive_data(data if type(data) is bytes else bytes(data))  # TLS reads are bytearrays
            try:
                await handle_read(self.holding_writes, listeners, handle_span, full=len(data) == _READ_SIZE)
            except p.RemoteProtocolError as exc:
                log.info("connection %d (%s): protocol error: %s", conn.cid, conn.remote, exc)
                self.protocol_errors[_ERROR_KINDS.get(str(exc), "other")] += 1
                conn.fail(str(exc))
                return

    def _handle_span(self, conn: Connection, parser: p.ServerConnection) -> tuple[list[Awaitable[None]], bool]:
        """Handle events until the data runs out (returns `more` False), a handler asks to be awaited,
        or `_EVENTS_PER_STEP` were handled."""
        if not conn.authorized:
            return self._handle_unauthorized(conn, parser)
        budget = _EVENTS_PER_STEP
        while budget > 0:
            budget -= 1
            event = parser.next_event()
            if event is p.NEED_DATA:
                return _NO_WAITS, False
            if type(event) is p.Pub:
                waits = self._on_pub(conn, event, parser, budget)
                if waits:
                    return waits, True
                budget -= self._run_rest
            else:
                assert isinstance(event, p.Event)
                self._on_control(conn, event)
        return _NO_WAITS, True

    def _handle_unauthorized(self, conn: Connection, parser: p.ServerConnection) -> tuple[list[Awaitable[None]], bool]:
        """Before an authenticated CONNECT: the CONNECT is checked (in a worker thread when it needs a
        bcrypt check); anything else is an authorization violation, as nats-server answers it."""
        if conn.closing:  # refused while its CONNECT was checked: the rest of its input is not read
            return _NO_WAITS, False
        event = parser.next_event()
        if event is p.NEED_DATA:
            return _NO_WAITS, False
        if type(event) is not p.Connect:
            self._unauthorized(conn, "sent no CONNECT first")
            return _NO_WAITS, False
        if self.auth.needs_thread(event.options):
            return [self._admit_checked(conn, event)], True
        self._admit(conn, event, self.auth.check(event.options, conn.nonce))
        return _NO_WAITS, not conn.closing

    async def _admit_checked(self, conn: Connection, event: p.Connect) -> None:
        self._admit(conn, event, await trio.to_thread.run_sync(self.auth.check, event.options, conn.nonce))

    def _admit(self, conn: Connection, event: p.Connect, user: str | None) -> None:
        if user is None:
            self._unauthorized(conn, f"bad credentials (user {str(event.options.get('user', ''))[:64]!r})")
            return
        conn.authorized = True
        conn.origin = Origin(conn.cid, user, self.auth.permissions(user))
        conn.session.permissions = conn.origin.permissions
        self._on_control(conn, event)

    def _unauthorized(self, conn: Connection, why: str) -> None:
        log.info("connection %d (%s): authorization violation: %s", conn.cid, conn.remote, why)
        self.protocol_errors["authorization"] += 1
        conn.fail(p.AUTHORIZATION_VIOLATION)

    def _on_pub(self, conn: Connection, event: p.Pub, parser: p.ServerConnection, budget: int) -> list[Awaitable[None]]:
        """Route one PUB; or, when its subject goes to a run-taking handler alone, it and up to `budget`
        identical PUBs right after it (`_run_rest` says how many more were taken)."""
        self._run_rest = 0
        self.in_msgs += 1
        self.in_bytes += len(event.payload)
        session = conn.session  # its decisions, read inline on this hot path (see Session)
        if session.pedantic and not valid_literal(event.subject):
            self._refuse(conn, INVALID_PUBLISH_SUBJECT)
            return []
        if session.verbose:
            conn.send(p.OK_BYTES)
        origin = conn.origin
        if origin.permissions is not None:
            refusal = session.publish_refusal(event.subject, self.internal(event.subject))
            if refusal is not None:
                self._refuse(conn, refusal)
                return []
        subs = self._sublist.match(event.subject)
        if len(subs) == 1 and subs[0].runs is not None and budget and not session.verbose:
            payloads = [event.payload]
            more = parser.repeats(budget)
            if more:
                # The same subject, reply and connection: everything checked above holds for each.
                self._run_rest = len(more)
                self.in_msgs += len(more)
                self.in_bytes += len(event.payload) * len(more)
                payloads += more
            result = subs[0].runs(event.subject, event.reply, payloads, origin)
            return _NO_WAITS if result is None else [result]
        return self._route(event.subject, event.reply, event.payload, conn, subs)

    def _on_control(self, conn: Connection, event: p.Event) -> None:
        session = conn.session
        if isinstance(event, p.Ping):
            conn.send(p.PONG_BYTES)
        elif isinstance(event, p.Pong):
            session.pong()
        elif isinstance(event, p.Sub):
            refusal = session.subscription(event, self.internal(event.subject))
            if refusal is not None:
                self._refuse(conn, refusal)
                return
            if event.sid not in conn.subs:  # a duplicate sid is ignored, as nats-server does
                sub = conn.subs[event.sid] = Sub(conn, event.sid, event.subject, event.queue, None)
                sub.denied = session.filtered(event.subject)
                self._sublist.add(sub, event.subject, event.queue)
                self._sub_added.set()
                self._sub_added = trio.Event()
            self._ok(conn)
        elif isinstance(event, p.Unsub):
            existing = conn.subs.get(event.sid)
            if existing is not None:
                if session.unsubscribes_now(existing.delivered, event.max_msgs):
                    self._remove(conn, event.sid)
                else:
                    existing.max_msgs = event.max_msgs
            self._ok(conn)
        elif isinstance(event, p.Connect):
            conn.connected.set()
            reply = session.connect(event)
            if reply:
                conn.send(reply)

    def _ok(self, conn: Connection) -> None:
        reply = conn.session.ok()
        if reply:
            conn.send(reply)

    def _refuse(self, conn: Connection, refusal: Refusal) -> None:
        """Tell the client why its request is refused (it stays connected), and count it."""
        conn.send(refusal.error)
        self.protocol_errors[refusal.kind] += 1

    def _remove(self, conn: Connection, sid: str) -> None:
        gone = conn.subs.pop(sid, None)
        if gone is not None:
            self._sublist.remove(gone)
