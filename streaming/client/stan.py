"""The STAN client, on AnyIO (so under asyncio or Trio alike): connect, publish (awaited or
pipelined), subscribe, ack, close.

    async with streaming.client.connect("test-cluster", "me", port=4222) as sc:
        await sc.publish("orders", b"...")
        async with sc.subscribe("orders", durable="worker", manual_ack=True) as sub:
            async for msg in sub:
                ...
                msg.ack()

The STAN session outlives TCP drops: the NATS connection reconnects, subscriptions are re-sent, and
publishes still waiting for their PubAck are published again with the same guid (at-least-once; a
PubAck lost with the connection can mean a duplicate). Redelivered copies of messages the
application already acknowledged, or that still wait in this client's queue, are dropped (and
re-acknowledged, so the server stops sending them) instead of reaching the application.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import ssl
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TypeVar, Unpack

import anyio
import anyio.lowlevel
from google.protobuf.message import Message as ProtoMessage

from streaming.client.nats_conn import ConnectionClosedError, NatsConnection, NatsError, NatsMsg, new_inbox
from streaming.client.subscription import SubscribeOptions, Subscription
from streaming.wire.positions import StartPosition
from streaming.wire.stan_pb import protocol_pb2 as pb

log = logging.getLogger(__name__)
R = TypeVar("R", bound=ProtoMessage)


class StanError(Exception):
    """The server refused a request; str() is its error text."""


PUB_ACK_TIMEOUT = "stan: publish ack timeout"  # the error of a publish whose PubAck did not come in time


class PubAckFuture:
    """The PubAck of one pipelined publish."""

    __slots__ = ("_done", "error", "guid", "payload", "subject")

    def __init__(self, guid: str, subject: str, payload: bytes) -> None:
        self.guid = guid
        self.subject = subject
        self.payload = payload
        self.error: str | None = None  # "" once stored
        self._done: anyio.Event | None = None

    def done(self) -> bool:
        return self.error is not None

    def _resolve(self, error: str) -> None:
        self.error = error
        if self._done is not None:
            self._done.set()

    async def wait(self) -> str:
        """The guid once the server stored the message; raises StanError if it refused it."""
        if self.error is None:
            if self._done is None:
                self._done = anyio.Event()  # made only for futures someone waits on before the PubAck
            await self._done.wait()
        else:
            await anyio.lowlevel.checkpoint()
        if self.error:
            raise StanError(self.error)
        return self.guid


class _Subjects:
    def __init__(self, response: pb.ConnectResponse) -> None:
        self.pub = response.pubPrefix
        self.sub = response.subRequests
        self.unsub = response.unsubRequests
        self.close = response.closeRequests
        self.subclose = response.subCloseRequests
        self.ping = response.pingRequests
        self.nak_suffix = response.nakSuffix  # our extension: "" from nats-streaming-server


class StanClient:
    def __init__(
        self,
        nats: NatsConnection,
        cluster_id: str,
        client_id: str,
        *,
        request_timeout_s: float,
        max_pub_acks_inflight: int,
        ping_interval_s: int,
        ping_max_out: int,
        pub_ack_timeout_s: float = 30.0,
    ) -> None:
        self.nats = nats
        self.cluster_id = cluster_id
        self.client_id = client_id
        self.conn_id = secrets.token_hex(11).encode()
        # Serialised protobuf messages concatenate into their merge, so the fields every PubMsg of this
        # session shares are serialised once.
        self._pub_prefix = pb.PubMsg(clientID=client_id, connID=self.conn_id).SerializeToString()
        self.request_timeout_s = request_timeout_s
        # A publish whose PubAck has not come this long after it was sent fails (STAN's PubAckWait).
        self.pub_ack_timeout_s = pub_ack_timeout_s
        self.ping_interval_s = ping_interval_s
        self.ping_max_out = ping_max_out
        self.closed = False
        self.lost_reason = ""
        self.config_subjects: _Subjects
        self._ack_subject = "_STAN.acks." + secrets.token_hex(11)
        self._guid_prefix = secrets.token_hex(8)  # guids: unique prefix + counter (no syscall per publish)
        self._published = 0  # the counter: publishes numbered so far
        self._pubs: dict[str, PubAckFuture] = {}  # guid -> waiting for its PubAck, in publish order
        self._max_pubs = max_pub_acks_inflight
        self._drained: anyio.Event | None = None
        self._room = anyio.Event()  # set when a PubAck frees room in a full window
        self._room_waiters = 0  # publishers waiting for it (no Event is made per PubAck for nobody)
        self._subs: set[Subscription] = set()
        self._hb_inbox = new_inbox(nats.inbox_prefix)
        self._ping_inbox = new_inbox(nats.inbox_prefix)
        self._pings_out = 0

    @property
    def nak_suffix(self) -> str:
        """Where negative acks go after a subscription's ack inbox ("": the server takes none)."""
        return self.config_subjects.nak_suffix

    # -- session -------------------------------------------------------------------------------

    async def _start(self) -> None:
        self.nats.subscribe(self._hb_inbox, self._on_heartbeat)
        self.nats.subscribe(self._ping_inbox, self._on_ping_response)
        self.nats.subscribe(self._ack_subject, self._on_pub_ack)
        request = pb.ConnectRequest(
            clientID=self.client_id,
            heartbeatInbox=self._hb_inbox,
            protocol=1,
            connID=self.conn_id,
            pingInterval=self.ping_interval_s,
            pingMaxOut=self.ping_max_out,
        )
        discover = f"_STAN.discover.{self.cluster_id}"
        try:
            with anyio.fail_after(self.request_timeout_s):
                raw = await self.nats.request(discover, request.SerializeToString())
        except TimeoutError:
            raise StanError("stan: connect request timeout (possibly wrong cluster ID?)") from None
        response = pb.ConnectResponse.FromString(raw)
        if response.error:
            raise StanError(response.error)
        self.config_subjects = _Subjects(response)

    def _on_heartbeat(self, msg: NatsMsg) -> None:
        if msg.reply:
            self.nats.publish(msg.reply, b"")

    def _on_ping_response(self, msg: NatsMsg) -> None:
        if msg.data:
            response = pb.PingResponse.FromString(msg.data)
            if response.error:
                self._lose(f"stan: connection lost: {response.error}")
                return
        self._pings_out = 0

    def _lose(self, reason: str) -> None:
        if not self.closed:
            log.warning("%s", reason)
            self.lost_reason = reason
            self.closed = True
            self._wake_all()

    def _wake_all(self) -> None:
        self._room.set()
        if self._drained is not None:
            self._drained.set()
        for sub in self._subs:
            sub._ready.set()
        for future in self._pubs.values():
            if not future.done():
                future._resolve(self.lost_reason or "stan: connection closed")

    async def _pinger(self) -> None:
        if not self.config_subjects.ping or self.ping_interval_s <= 0:
            return
        payload = pb.Ping(connID=self.conn_id).SerializeToString()
        while not self.closed:
            await anyio.sleep(self.ping_interval_s)
            self._pings_out += 1
            if self._pings_out > self.ping_max_out:
                self._lose("stan: connection lost due to PING failure")
                return
            if self.nats.connected:
                self.nats.publish(self.config_subjects.ping, payload, reply=self._ping_inbox)

    def _on_reconnect(self) -> None:
        """A new TCP connection: subscriptions were re-sent; publish again what was not acknowledged."""
        for future in list(self._pubs.values()):
            self._send_pub(future)

    async def close(self) -> None:
        """Close the STAN session (durables keep their state), then the connection."""
        if not self.closed:
            self.closed = True
            request = pb.CloseRequest(clientID=self.client_id)
            try:
                await self._request(self.config_subjects.close, request.SerializeToString(), pb.CloseResponse)
            except (StanError, ConnectionClosedError) as exc:
                log.info("close: %s", exc)
            finally:
                self._wake_all()
        await self.nats.close()

    async def end_subscription(self, sub: Subscription, *, close: bool) -> None:
        """Remove (or, `close`, close) a subscription at the server, and stop taking its messages."""
        subjects = self.config_subjects
        request = pb.UnsubscribeRequest(
            clientID=self.client_id, subject=sub.channel, inbox=sub.ack_inbox, durableName=sub.durable
        )
        try:
            if not self.closed:
                subject = subjects.subclose if close else subjects.unsub
                await self._request(subject, request.SerializeToString(), pb.SubscriptionResponse)
        finally:
            self.nats.unsubscribe(sub.sid)
            self._subs.discard(sub)

    async def _request(self, subject: str, payload: bytes, response_type: type[R]) -> R:
        try:
            with anyio.fail_after(self.request_timeout_s):
                raw = await self.nats.request(subject, payload)
        except TimeoutError:
            raise StanError(f"stan: request timeout ({subject})") from None
        response = response_type.FromString(raw)
        if getattr(response, "error", ""):
            raise StanError(getattr(response, "error", ""))
        return response

    # -- publishing ------------------------------------------------------------------------------

    def _send_pub(self, future: PubAckFuture) -> None:
        message = pb.PubMsg(guid=future.guid, subject=future.subject, data=future.payload)
        self.nats.publish(
            f"{self.config_subjects.pub}.{future.subject}",
            self._pub_prefix + message.SerializeToString(),
            reply=self._ack_subject,
            at_once=True,
        )

    async def publish_async(self, channel: str, data: bytes) -> PubAckFuture:
        """Publish without waiting for the PubAck (waits only while too many are unacknowledged)."""
        self._check_open()
        while len(self._pubs) >= self._max_pubs:
            self._room_waiters += 1
            try:
                await self._room.wait()
            finally:
                self._room_waiters -= 1
            self._check_open()
        await anyio.lowlevel.checkpoint()
        return self._publish_now(channel, data)

    def publish_nowait(self, channel: str, data: bytes) -> PubAckFuture:
        """`publish_async` that never blocks: raises anyio.WouldBlock when too many are unacknowledged.

        Loops that publish many messages go fastest with this and a checkpoint
        (`await anyio.lowlevel.checkpoint()`) every hundred or so: what was queued since the last one
        leaves in one write, and the server works on it while the loop queues more (without any, a
        full window of 16,384 is queued before the first byte is sent, which is slower).
        """
        self._check_open()
        if len(self._pubs) >= self._max_pubs:
            raise anyio.WouldBlock
        return self._publish_now(channel, data)

    async def wait_pub_acks(self) -> None:
        """Wait until every publish so far has its PubAck (or the session is lost); then check each
        future's `error` (or `await future.wait()`, which no longer blocks)."""
        while self._pubs and not self.closed:
            if self._drained is None:
                self._drained = anyio.Event()
            await self._drained.wait()
        await anyio.lowlevel.checkpoint()

    def _check_open(self) -> None:
        if self.closed:
            raise ConnectionClosedError(self.lost_reason or "connection closed")

    def _publish_now(self, channel: str, data: bytes) -> PubAckFuture:
        self._published += 1
        future = PubAckFuture(f"{self._guid_prefix}{self._published}", channel, data)
        self._pubs[future.guid] = future
        self._send_pub(future)
        return future

    async def publish(self, channel: str, data: bytes) -> str:
        """Publish and wait until the server has stored it; returns the guid."""
        if len(self._pubs) < self._max_pubs:
            # Waiting for the PubAck below is the checkpoint: publish_async's own would cost a pass of
            # the event loop per message, a tenth of a sequential publish's time.
            self._check_open()
            future = self._publish_now(channel, data)
        else:
            future = await self.publish_async(channel, data)
        try:
            with anyio.fail_after(self.pub_ack_timeout_s):
                return await future.wait()
        except TimeoutError:
            if self._pubs.pop(future.guid, None) is not None:
                future._resolve(PUB_ACK_TIMEOUT)
                self._freed()
            raise StanError(PUB_ACK_TIMEOUT) from None

    async def _expire_pub_acks(self) -> None:
        """Fail every publish whose PubAck has not come within `pub_ack_timeout_s` of it: its future's
        error says so and its room in the window is freed, so a PubAck lost on the way (a NATS
        cluster drops what a slow member cannot take) never holds a publisher for ever.

        One task for the session, waking a tenth of the timeout apart, and nothing done per publish:
        each wake-up notes how many publishes were made by then, and the publishes made by a
        note at least a timeout old are failed (they are the oldest of the window, in order). A
        publish thus fails between one and 1.1 timeouts after it was made."""
        marks: deque[tuple[float, int]] = deque()
        while not self.closed:
            await anyio.sleep(max(self.pub_ack_timeout_s, 0.01) / 10)
            now = anyio.current_time()
            marks.append((now, self._published))
            bound = 0
            while marks and now - marks[0][0] >= self.pub_ack_timeout_s:
                bound = marks.popleft()[1]
            if bound and self._pubs:
                self._expire(bound)

    def _expire(self, bound: int) -> None:
        """Fail the publishes waiting for their PubAck that are numbered `bound` or lower."""
        skip = len(self._guid_prefix)
        late: list[str] = []
        for guid in self._pubs:  # in publish order
            if int(guid[skip:]) > bound:
                break
            late.append(guid)
        if not late:
            return
        for guid in late:
            self._pubs.pop(guid)._resolve(PUB_ACK_TIMEOUT)
        log.warning("stan: %d publishes had no PubAck in %g s: failed", len(late), self.pub_ack_timeout_s)
        self._freed()

    def _on_pub_ack(self, msg: NatsMsg) -> None:
        try:
            ack = pb.PubAck.FromString(msg.data)
        except Exception:
            return
        future = self._pubs.pop(ack.guid, None)
        if future is not None:
            future._resolve(ack.error)
            self._freed()

    def _freed(self) -> None:
        """Publishes left the window: wake who waits for room or for none to be left."""
        # Room is announced at half the window, not per PubAck: a waiting publisher then queues
        # thousands of messages per wake-up (one write) instead of one.
        if self._room_waiters and len(self._pubs) <= self._max_pubs // 2 and not self._room.is_set():
            self._room.set()
            self._room = anyio.Event()
        if not self._pubs and self._drained is not None:
            self._drained.set()
            self._drained = None

    # -- subscribing -----------------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(
        self, channel: str, *, close_on_exit: bool = False, **options: Unpack[SubscribeOptions]
    ) -> AsyncIterator[Subscription]:
        """Subscribe with `open_subscription`'s options; leaving the block unsubscribes (or closes,
        with close_on_exit, keeping a durable)."""
        sub = await self.open_subscription(channel, **options)
        try:
            yield sub
        finally:
            if not self.closed and not sub._closed:
                # Best effort when the connection is already gone (the block was cancelled, say):
                # the server ends the subscription with the client then.
                with (
                    anyio.move_on_after(self.request_timeout_s, shield=True),
                    contextlib.suppress(ConnectionClosedError),
                ):
                    await (sub.close() if close_on_exit else sub.unsubscribe())

    async def open_subscription(
        self,
        channel: str,
        *,
        queue: str = "",
        durable: str = "",
        ack_wait: float = 30.0,
        max_inflight: int = 1024,
        start_at: StartPosition = StartPosition.NEW_ONLY,
        start_sequence: int = 0,
        start_time_delta_s: float = 0.0,
        manual_ack: bool = False,
        max_deliver: int = 0,
        dead_letter_channel: str = "",
        backoff_s: tuple[float, ...] = (),
        max_inflight_redeliveries: bool = False,
        ordered: bool = False,
        suppress_copies: bool = True,
    ) -> Subscription:
        """Subscribe without a context manager; call `unsubscribe()` or `close()` on the result.

        `ack_wait` is seconds; a fraction of a second is sent as negative milliseconds, which only a
        server started with the test-only `allow_ms_ack_wait` option accepts. `suppress_copies` (default)
        drops a redelivered copy of a message already acked here or still waiting to be handed out;
        False hands every delivery to the application, as the reference clients do. `ordered` (with
        `queue`; this server's extension): the group keeps each channel's order, giving a channel's
        next message to a member only once the last one is acked (with a pattern as `channel`, the
        channels are spread over the members).
        """
        if self.closed:
            raise ConnectionClosedError(self.lost_reason or "connection closed")
        sub = Subscription(self, channel, queue, durable, manual_ack, suppress_copies)
        sub.sid = self.nats.subscribe(sub.inbox, sub.on_msg)
        wait = int(ack_wait) if ack_wait == int(ack_wait) else -round(ack_wait * 1000)
        request = pb.SubscriptionRequest(
            clientID=self.client_id,
            subject=channel,
            qGroup=queue,
            inbox=sub.inbox,
            maxInFlight=max_inflight,
            ackWaitInSecs=wait,
            durableName=durable,
            startPosition=pb.StartPosition.Name(int(start_at)),
            startSequence=start_sequence,
            startTimeDelta=int(start_time_delta_s * 1e9),
            maxDeliver=max_deliver,
            deadLetterChannel=dead_letter_channel,
            backoffMs=[round(b * 1000) for b in backoff_s],
            maxInflightRedeliveries=max_inflight_redeliveries,
            ordered=ordered,
        )
        try:
            response = await self._request(
                self.config_subjects.sub, request.SerializeToString(), pb.SubscriptionResponse
            )
        except BaseException:
            self.nats.unsubscribe(sub.sid)
            raise
        sub.ack_inbox = response.ackInbox
        self._subs.add(sub)
        return sub


@asynccontextmanager
async def connect(
    cluster_id: str,
    client_id: str,
    *,
    host: str = "127.0.0.1",
    port: int = 4222,
    request_timeout_s: float = 5.0,
    max_pub_acks_inflight: int = 16384,
    ping_interval_s: int = 5,
    ping_max_out: int = 88,
    pub_ack_timeout_s: float = 30.0,
    reconnect_wait_s: float = 0.5,
    max_reconnect_attempts: int = -1,
    servers: Sequence[str] = (),
    connect_timeout_s: float = 2.0,
    nats_ping_interval_s: float = 30.0,
    nats_max_pings_out: int = 2,
    user: str = "",
    password: str = "",
    token: str = "",
    tls: ssl.SSLContext | None = None,
    inbox_prefix: str = "_INBOX",
) -> AsyncIterator[StanClient]:
    """Open a STAN session; it is closed (STAN Close, then TCP) when the block ends. Runs under
    asyncio and Trio alike.

    - `servers`: NATS URLs (`nats://[user:password@]host:port`, `tls://...`) to try in turn, instead
      of `host` and `port`; the cluster's other nodes are learnt from the first one reached, and a
      dropped connection is made again to any of them, `reconnect_wait_s` apart
      (`max_reconnect_attempts`, -1: forever). `connect_timeout_s` bounds each TCP and NATS handshake.
    - `pub_ack_timeout_s`: how long a publish waits for its PubAck before it fails with `publish ack
      timeout` (its future's `error`, or StanError from `publish`), pipelined ones too.
    - `ping_interval_s` and `ping_max_out`: STAN pings (the server's answer says whether the session is
      still known); `nats_ping_interval_s` and `nats_max_pings_out`: NATS pings, after which the
      connection is made again.
    - `user` and `password`, or `token`: the credentials of a server that asks for them; `tls`: the
      client's TLS context for a server that requires TLS (with its certificate for one that verifies
      clients); `inbox_prefix`: where its inboxes live, for a NATS cluster that gives each user one.

    Connecting fails with OSError (nothing listening), NatsError (the server refused the connection:
    `Authorization Violation` for bad credentials) or StanError (refused, or no STAN server with that
    cluster ID answered), raised as such rather than inside an exception group.
    """
    if not pub_ack_timeout_s > 0:
        raise ValueError(f"pub_ack_timeout_s must be more than 0, not {pub_ack_timeout_s}")
    failure: BaseException | None = None
    async with anyio.create_task_group() as nursery:
        nats = NatsConnection(
            host,
            port,
            servers=servers,
            name=client_id,
            reconnect_wait_s=reconnect_wait_s,
            max_reconnect_attempts=max_reconnect_attempts,
            connect_timeout_s=connect_timeout_s,
            ping_interval_s=nats_ping_interval_s,
            max_pings_out=nats_max_pings_out,
            user=user,
            password=password,
            token=token,
            tls=tls,
            inbox_prefix=inbox_prefix,
        )
        client = StanClient(
            nats,
            cluster_id,
            client_id,
            request_timeout_s=request_timeout_s,
            max_pub_acks_inflight=max_pub_acks_inflight,
            ping_interval_s=ping_interval_s,
            ping_max_out=ping_max_out,
            pub_ack_timeout_s=pub_ack_timeout_s,
        )
        nats.on_reconnect = client._on_reconnect
        try:
            await nursery.start(nats.run)
            await client._start()
        except (OSError, StanError, NatsError, TimeoutError) as exc:
            failure = exc
            client.closed = True
            nursery.cancel_scope.cancel()
        if failure is None:
            nursery.start_soon(client._pinger)
            nursery.start_soon(client._expire_pub_acks)
            try:
                yield client
            finally:
                with anyio.move_on_after(client.request_timeout_s + 1, shield=True):
                    await client.close()
                nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
