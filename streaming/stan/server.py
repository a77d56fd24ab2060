"""The STAN layer on the embedded broker: answers NATS Streaming clients.

It subscribes in-process to the STAN subjects of its cluster ID and turns requests into calls on the
delivery engine (streaming.engine), the publish group commit (streaming.stan.publisher) and the store:

- connect / close, with client-ID validation and the duplicate-client-ID probe;
- publish: validated when it arrives, so a connection's publishes before its Close count;
  acknowledged after the group commit;
- subscribe / unsubscribe / subscription close; the SubscriptionResponse is sent before
  any message of the subscription;
- acks, on one wildcard subscription for every ack inbox; client pings; server heartbeats with one
  task per client (not per message) that closes clients whose heartbeats fail;
- after a restart, commits and deliveries wait (up to `recovery_hold`) for recovered clients to
  reconnect, so their pending messages are redelivered before anything new.

A STAN session is not tied to a TCP connection: clients are known by client ID and connID.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TypeVar

import attrs
import trio

from storage import (
    ChannelError,
    ClientRecord,
    DamagedStoreError,
    DeleteClient,
    RecoveredState,
    SaveClient,
    Store,
    StoreError,
    StoreFullError,
)
from storage.integrity import beyond_channels
from streaming.engine import Delivery, Engine, Observer, RequestError
from streaming.nats.broker import Broker
from streaming.observers import ServerObserver
from streaming.runtime import EngineRuntime, call_store, tune_gc
from streaming.stan import errors
from streaming.stan.pb import protocol_pb2 as pb
from streaming.stan.publisher import Publish, Publisher
from streaming.stan.requests import (
    InvalidRequest,
    parse_close,
    parse_connect,
    parse_publish,
    parse_subscribe,
    parse_unsubscribe,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
# Subscription-state writes (acks, positions) gather this long into one fsynced transaction; a
# machine crash loses at most that much of them, which only causes redeliveries.
_STATE_FLUSH_LINGER_S = 0.01
# ... and then start at the end of a publish commit, if one ends within this: its fsync is then done
# before the next publish's, which otherwise queued behind it on the disk (p99 -50 us in
# bench/latency.py, six alternating runs of each).
_STATE_WRITE_ALIGN_S = 0.003


@attrs.frozen
class StanConfig:
    cluster_id: str = "test-cluster"
    discover_prefix: str = "_STAN.discover"
    hb_interval_s: float = 30.0
    hb_timeout_s: float = 10.0
    hb_fail_count: int = 10
    dup_check_timeout_s: float = 0.5
    recovery_hold_s: float = 5.0
    ack_wait_ms: bool = False  # test-only: negative ackWaitInSecs = milliseconds


@attrs.define
class _Client:
    record: ClientRecord
    failures: int = 0
    checking: bool = False  # a duplicate-ID probe is running
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    poke: trio.Event = attrs.Factory(trio.Event)


# Labels for refused requests, by the response that carries the error (a fixed set).
_REFUSAL_KINDS: dict[type, str] = {
    pb.ConnectResponse: "stan_connect",
    pb.SubscriptionResponse: "stan_subscription",  # subscribe, unsubscribe, close
    pb.CloseResponse: "stan_close",
    pb.PingResponse: "stan_ping",
    pb.PubAck: "stan_publish",
}
REFUSAL_KINDS = tuple(_REFUSAL_KINDS.values())  # every key of StanServer.refused


def _nuid() -> str:
    return secrets.token_urlsafe(16).replace("-", "A").replace("_", "B")


class StanServer:
    def __init__(
        self,
        config: StanConfig,
        broker: Broker,
        store: Store,
        *,
        store_in_thread: bool,
        engine_observers: Sequence[Observer] = (),
        observer: ServerObserver | None = None,
    ) -> None:
        self.config = config
        self._engine_observers = list(engine_observers)
        self._observer = observer
        self.broker = broker
        self.store = store
        self._in_thread = store_in_thread
        cid = config.cluster_id
        self.discover_subject = f"{config.discover_prefix}.{cid}"
        self.pub_prefix = f"_STAN.pub.{cid}"
        self.sub_subject = f"_STAN.sub.{cid}"
        self.unsub_subject = f"_STAN.unsub.{cid}"
        self.subclose_subject = f"_STAN.subclose.{cid}"
        self.close_subject = f"_STAN.close.{cid}"
        self.ping_subject = f"{self.discover_subject}.pings"
        self.ack_prefix = f"_STAN.ack.{cid}"
        self._reply_prefix = f"_STAN.srv.{cid}.{_nuid()}"
        self._replies: dict[str, trio.MemorySendChannel[bytes]] = {}
        self._clients: dict[str, _Client] = {}
        self._conn_ids: dict[bytes, str] = {}
        self._by_hb_inbox: dict[str, _Client] = {}
        self._jitter = random.Random()
        self.refused: collections.Counter[str] = collections.Counter()  # refused requests by kind
        self._dirty = False
        self._nursery: trio.Nursery | None = None
        self.engine: Engine
        self.runtime: EngineRuntime
        self.publisher: Publisher
        self.ready = trio.Event()  # recovery finished: commits and deliveries flow

    # -- life cycle ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        state: RecoveredState = await self._call(self.store.recover)
        state = self._check_positions(state)
        self.engine = Engine.recover(self.store, state)
        for engine_observer in self._engine_observers:
            self.engine.add_observer(engine_observer)
        self.runtime = EngineRuntime(
            self.engine,
            self._deliver,
            store_in_thread=self._in_thread,
            flush_linger=_STATE_FLUSH_LINGER_S if self._in_thread else 0.0,
            before_state_write=self._after_next_commit if self._in_thread else None,
            observer=self._observer,
        )
        self.publisher = Publisher(
            self.store,
            self.engine,
            self.runtime,
            self._send,
            self.broker.publish_many,
            store_in_thread=self._in_thread,
            observer=self._observer,
            hold=self.broker.holding_writes,
        )
        for record in state.clients:
            self._clients[record.client_id] = self._by_hb_inbox[record.hb_inbox] = _Client(record)
            if record.conn_id:
                self._conn_ids[record.conn_id] = record.client_id
        held = [s for s in state.subscriptions if s.pending and s.record.client_id in self._clients]
        if held:
            self.publisher.pause()
        self._subscribe_internal()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.runtime.run)
            await nursery.start(self.publisher.run)
            for client in self._clients.values():
                nursery.start_soon(self._heartbeat, client)
            if self._expiry_configured():
                nursery.start_soon(self._age_sweeper)
            nursery.start_soon(self._start_after_recovery, [s.record.inbox for s in held])
            tune_gc()
            log.info(
                "STAN cluster %r ready: %d channels, %d clients, %d subscriptions recovered",
                self.config.cluster_id,
                len(state.channels),
                len(state.clients),
                len(state.subscriptions),
            )
            task_status.started()

    def _check_positions(self, state: RecoveredState) -> RecoveredState:
        """Refuse a store whose subscribers were sent messages it no longer holds (see
        `beyond_channels`); without file sync that is what a machine crash may do: say so, go on."""
        state, problems = beyond_channels(state)
        if problems and self.store.synced:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise DamagedStoreError(
                f"{problems[0]}{more}: acknowledged messages are missing from the store's journal "
                "(its last record is damaged, or a journal file was replaced)"
            )
        for problem in problems:
            log.warning("%s (file_sync is off: a machine crash loses what was written since the last flush)", problem)
        return state

    async def _start_after_recovery(self, inboxes: list[str]) -> None:
        """Recovered pending messages go out before new ones: wait (bounded) until the clients that
        have some are back on the broker, then redeliver, then let commits through."""
        if inboxes:
            with trio.move_on_after(self.config.recovery_hold_s):
                await self.broker.wait_interest(inboxes)
        self.engine.start(trio.current_time())
        self.runtime.sync()
        self.publisher.resume()
        self.ready.set()

    def _expiry_configured(self) -> bool:
        limits = self.store.limits
        return limits.channel.max_age_s > 0 or any(c.max_age_s > 0 for c in limits.per_channel.values())

    def _subscribe_internal(self) -> None:
        b = self.broker
        b.subscribe(self.discover_subject, self._on_connect)
        b.subscribe(self.ping_subject, self._on_ping)
        b.subscribe(f"{self.pub_prefix}.>", self._on_publish)
        b.subscribe(self.sub_subject, self._on_subscribe)
        b.subscribe(self.unsub_subject, partial(self._on_unsubscribe, close=False))
        b.subscribe(self.subclose_subject, partial(self._on_unsubscribe, close=True))
        b.subscribe(self.close_subject, self._on_close)
        b.subscribe(f"{self.ack_prefix}.*", self._on_ack)
        b.subscribe(f"{self._reply_prefix}.*", self._on_reply)
        b.add_batch_hook(self._after_batch)
        b.add_close_hook(self._on_connection_closed)

    def store_refusing_writes(self) -> bool:
        """The store refused the last write it was given (a full disk): the server serves from memory."""
        return self.store_write_error() is not None

    def store_write_error(self) -> StoreError | None:
        """Why the store refuses writes, while it does (publishes, or subscription state)."""
        return self.runtime.write_error

    def clients(self) -> list[ClientRecord]:
        """The registered clients (for monitoring)."""
        return [client.record for client in self._clients.values()]

    # -- plumbing --------------------------------------------------------------------------------

    def _send(self, subject: str, payload: bytes) -> None:
        for wait in self.broker.publish(subject, payload):
            # An in-process handler wanting to be awaited on a server-sent message: not expected.
            self._spawn(wait)

    def _spawn(self, wait: Awaitable[None]) -> None:
        async def run() -> None:
            await wait

        if self._nursery is not None:
            self._nursery.start_soon(run)

    def _respond(self, reply: str, message: object) -> None:
        kind = _REFUSAL_KINDS.get(type(message))
        error: str = getattr(message, "error", "")
        if kind is not None and error:
            self.refused[kind] += 1
        if reply:
            assert hasattr(message, "SerializeToString")
            self._send(reply, message.SerializeToString())

    def _deliver(self, deliveries: list[Delivery]) -> None:
        # A pass of the engine mostly sends runs of messages to one inbox (a backlog, a redelivery
        # chunk): each run is framed and written in one broker call.
        publish_many = self.broker.publish_many
        msg = pb.MsgProto
        inbox = ""
        run: list[bytes] = []
        for d in deliveries:
            if d.inbox != inbox:
                if run:
                    publish_many(inbox, run)
                    run = []
                inbox = d.inbox
            m = d.message
            run.append(
                msg(
                    sequence=m.seq,
                    subject=m.subject,
                    reply=m.reply,
                    data=m.data,
                    timestamp=m.timestamp_unix_ns,
                    redelivered=d.attempt > 1,
                    redeliveryCount=d.attempt - 1,
                ).SerializeToString()
            )
        if run:
            publish_many(inbox, run)

    async def _after_next_commit(self) -> None:
        await self.publisher.wait_commit(_STATE_WRITE_ALIGN_S)

    def _after_batch(self) -> None:
        if self._dirty:
            self._dirty = False
            self.runtime.sync()
        self.publisher.after_span(more_input=self.broker.more_input)

    async def _call(self, fn: Callable[[], T]) -> T:
        return await call_store(fn, in_thread=self._in_thread)

    async def _request(self, subject: str, payload: bytes, wait: float) -> bytes | None:
        """Request/reply from the server to a client (heartbeats); None after `wait` s or with no interest."""
        if not self.broker.has_interest(subject):
            return None  # no responders: answered at once (the embedded broker knows)
        token = _nuid()
        send, receive = trio.open_memory_channel[bytes](1)
        self._replies[token] = send
        try:
            for pending in self.broker.publish(subject, payload, reply=f"{self._reply_prefix}.{token}"):
                await pending
            with trio.move_on_after(wait):
                return await receive.receive()
            return None
        finally:
            del self._replies[token]

    def _on_reply(self, subject: str, reply: str, payload: bytes) -> None:
        channel = self._replies.get(subject.rsplit(".", 1)[-1])
        if channel is not None:
            with contextlib.suppress(trio.WouldBlock):  # a second answer to one heartbeat
                channel.send_nowait(payload)

    # -- connect, close, heartbeats --------------------------------------------------------------

    def _on_connect(self, subject: str, reply: str, payload: bytes) -> None:
        # Connects run beside the connection's other traffic: a duplicate-ID probe waits up to 0.5 s.
        if self._nursery is not None:
            self._nursery.start_soon(self._connect, reply, payload)

    async def _connect(self, reply: str, payload: bytes) -> None:
        try:
            request = parse_connect(payload)
        except InvalidRequest as exc:
            self._respond(reply, pb.ConnectResponse(error=str(exc)))
            return
        client_id = request.clientID
        existing = self._clients.get(client_id)
        if existing is not None:
            if existing.checking:
                self._respond(reply, pb.ConnectResponse(error=errors.CLIENT_ALREADY_REGISTERED))
                return
            existing.checking = True
            try:
                alive = await self._request(existing.record.hb_inbox, b"", self.config.dup_check_timeout_s)
            finally:
                existing.checking = False
            if alive is not None or self._clients.get(client_id) is not existing:
                self._respond(reply, pb.ConnectResponse(error=errors.CLIENT_ALREADY_REGISTERED))
                return
            log.info("client %r replaced by a new connection (the old one did not answer)", client_id)
            await self._close_client(existing)
            if client_id in self._clients:
                self._respond(reply, pb.ConnectResponse(error=errors.CLIENT_ALREADY_REGISTERED))
                return
        record = ClientRecord(
            client_id,
            request.heartbeatInbox,
            bytes(request.connID),
            request.protocol,
            request.pingInterval,
            request.pingMaxOut,
        )
        client = self._clients[client_id] = self._by_hb_inbox[record.hb_inbox] = _Client(record)
        if record.conn_id:
            self._conn_ids[record.conn_id] = client_id
        self.engine.add_client(client_id)
        # Stored before the answer, unless the store refuses writes (a full disk): the client is
        # served from memory then, and its record is written with the rest of the state once it can.
        self.runtime.queue_updates([SaveClient(record)])
        if not await self.runtime.write_now():
            log.warning("client %r is served, but its registration waits for the store to take writes", client_id)
        if self._nursery is not None:
            self._nursery.start_soon(self._heartbeat, client)
        response = pb.ConnectResponse(
            pubPrefix=self.pub_prefix,
            subRequests=self.sub_subject,
            unsubRequests=self.unsub_subject,
            closeRequests=self.close_subject,
            subCloseRequests=self.subclose_subject,
            protocol=1,
        )
        if request.protocol >= 1:
            response.pingRequests = self.ping_subject
            response.pingInterval = request.pingInterval
            response.pingMaxOut = request.pingMaxOut
        log.debug("client %r connected", client_id)
        self._respond(reply, response)

    async def _close_client(self, client: _Client) -> None:
        client_id = client.record.client_id
        if self._clients.get(client_id) is not client:
            return
        del self._clients[client_id]
        self._conn_ids.pop(client.record.conn_id, None)
        if self._by_hb_inbox.get(client.record.hb_inbox) is client:
            del self._by_hb_inbox[client.record.hb_inbox]
        client.scope.cancel()
        self.engine.client_closed(client_id, trio.current_time())
        self.runtime.queue_updates([DeleteClient(client_id)])
        await trio.lowlevel.checkpoint()

    def _on_close(self, subject: str, reply: str, payload: bytes) -> Awaitable[None]:
        return self._close(reply, payload)

    async def _close(self, reply: str, payload: bytes) -> None:
        try:
            request = parse_close(payload)
        except InvalidRequest as exc:
            self._respond(reply, pb.CloseResponse(error=str(exc)))
            return
        client = self._clients.get(request.clientID)
        if client is None:
            self._respond(reply, pb.CloseResponse(error=errors.UNKNOWN_CLIENT))
            return
        await self.publisher.flush()  # its publishes before the Close are stored first
        await self._close_client(client)
        log.debug("client %r closed", request.clientID)
        self._respond(reply, pb.CloseResponse())

    async def _heartbeat(self, client: _Client) -> None:
        """One task per client: probe its heartbeat inbox, close it after too many failures."""
        cfg = self.config
        client_id = client.record.client_id
        with client.scope:
            while True:
                # +-10%: clients that connected together (a restart, a deploy) would otherwise be
                # checked together every interval, a thousand requests in one scheduler batch: a
                # 30-50 ms stall of the loop every 30 s in bench/soak.py; jittered, ~10 ms.
                with trio.move_on_after(cfg.hb_interval_s * self._jitter.uniform(0.9, 1.1)):
                    await client.poke.wait()
                client.poke = trio.Event()
                hb_inbox = client.record.hb_inbox
                if not self.broker.has_interest(hb_inbox):
                    # Gone with its connection, or reconnecting: it has as long to come back as a
                    # heartbeat has to be answered.
                    with trio.move_on_after(cfg.hb_timeout_s):
                        await self.broker.wait_interest([hb_inbox])
                answer = await self._request(hb_inbox, b"", cfg.hb_timeout_s)
                now = trio.current_time()
                if answer is not None:
                    if client.failures:
                        client.failures = 0
                        self.engine.set_heartbeat_failed(client_id, False, now)
                        self.runtime.sync()
                    continue
                client.failures += 1
                if client.failures == 1:
                    self.engine.set_heartbeat_failed(client_id, True, now)
                    self.runtime.sync()
                if client.failures > cfg.hb_fail_count:
                    log.info("client %r missed %d heartbeats: closing it", client_id, client.failures)
                    break
        await self._close_client(client)

    def _on_connection_closed(self, subjects: list[str]) -> None:
        """A client whose heartbeat inbox went with a connection is checked now, not at its next
        heartbeat: when it does not answer, its subscriptions stop receiving at once, and what its
        queue members hold goes to the other members when its AckWait ends (a slow consumer cut off by
        the broker, a crashed process). It is closed after its heartbeats keep failing, as any client."""
        for subject in subjects:
            client = self._by_hb_inbox.get(subject)
            if client is not None and not self.broker.has_interest(subject):
                client.poke.set()

    def _on_ping(self, subject: str, reply: str, payload: bytes) -> None:
        if not payload or not reply:
            return
        try:
            ping = pb.Ping.FromString(payload)
        except Exception:
            self._respond(reply, pb.PingResponse(error=errors.CLIENT_REPLACED))
            return
        client_id = self._conn_ids.get(bytes(ping.connID))
        client = self._clients.get(client_id) if client_id is not None else None
        if client is None:
            self._respond(reply, pb.PingResponse(error=errors.CLIENT_REPLACED))
            return
        if client.failures:
            client.poke.set()  # check its heartbeat now, so the failed mark clears quickly
        self._send(reply, b"")

    # -- publish and ack (hot paths: no awaits unless the commit queue is full) -------------------

    def _on_publish(self, subject: str, reply: str, payload: bytes) -> Awaitable[None] | None:
        try:
            message = parse_publish(payload)
        except InvalidRequest as exc:
            self._respond(reply, pb.PubAck(guid=exc.guid, error=str(exc)))
            return None
        error = ""
        if message.connID:
            client_id = self._conn_ids.get(message.connID)
            if client_id is None:
                error = errors.INVALID_PUBLISH
        elif message.clientID not in self._clients:
            error = errors.INVALID_PUBLISH
        if not error and message.subject in self.runtime.deleting:
            error = errors.CHANNEL_BEING_DELETED
        if error:
            self._respond(reply, pb.PubAck(guid=message.guid, error=error))
            return None
        publisher = self.publisher
        # From a reader, its `after_span` hook commits or wakes the publisher task.
        publisher.submit(
            Publish(message.subject, message.data, message.reply, message.guid, reply), wake=not self.broker.reading
        )
        return None if publisher.has_room() else publisher.wait_room()

    def _on_ack(self, subject: str, reply: str, payload: bytes) -> None:
        sub_id = self.engine.sub_for_ack_inbox(subject)
        if sub_id is None:
            return
        try:
            ack = pb.Ack.FromString(payload)
        except Exception:
            log.info("ignored an undecodable ack on %s", subject)
            return
        now = trio.current_time()
        if ack.inProgress:
            self.engine.ack_progress(sub_id, ack.sequence, now)
        else:
            self.engine.ack(sub_id, ack.sequence, now)
        self._dirty = True

    # -- subscriptions ---------------------------------------------------------------------------

    def _on_subscribe(self, subject: str, reply: str, payload: bytes) -> Awaitable[None]:
        return self._subscribe(reply, payload)

    async def _subscribe(self, reply: str, payload: bytes) -> None:
        ack_inbox = f"{self.ack_prefix}.{_nuid()}"
        try:
            request = parse_subscribe(payload, ack_inbox, ms_mode=self.config.ack_wait_ms)
            if request.client_id not in self._clients:
                raise RequestError(errors.UNKNOWN_CLIENT)
            if request.channel in self.runtime.deleting:
                raise RequestError(errors.CHANNEL_BEING_DELETED)
            try:
                if self.store.channel_info(request.channel) is None:
                    # Created off the event loop (an fsynced write), before the engine needs it.
                    await self._call(partial(self.store.ensure_channel, request.channel))
            except ChannelError as exc:  # too many channels, a name clashing in case
                raise RequestError(str(exc)) from exc
            if self.store_refusing_writes() and self.engine.creates_durable(request):
                # It could not be made durable: a crash would lose it, and with it its position.
                raise RequestError(errors.store_error(StoreFullError("new durable subscription")))
            sub_id = self.engine.subscribe(request, trio.current_time(), time.time_ns())
        except (InvalidRequest, RequestError) as exc:
            self._respond(reply, pb.SubscriptionResponse(error=str(exc)))
            return
        except StoreError as exc:
            log.error("subscribe failed: %s", exc)
            self._respond(reply, pb.SubscriptionResponse(error=errors.store_error(exc)))
            return
        # The response goes out before any message of this subscription: sync() comes after.
        self._respond(reply, pb.SubscriptionResponse(ackInbox=ack_inbox))
        self.runtime.sync()
        log.debug("subscription %d on %r for %r", sub_id, request.channel, request.client_id)

    def _on_unsubscribe(self, subject: str, reply: str, payload: bytes, *, close: bool) -> None:
        # Synchronous, so acks that arrived before it on this connection were applied first.
        try:
            request = parse_unsubscribe(payload)
            try:
                known = self.store.channel_info(request.subject) is not None
            except ChannelError:
                known = False
            if not known:
                raise RequestError(errors.UNKNOWN_CHANNEL_TEXT)
            sub_id = self.engine.sub_for_ack_inbox(request.inbox)
            if sub_id is None:
                sub_id = self._by_delivery_inbox(request.clientID, request.subject, request.inbox)
            record = self.engine.subscription(sub_id) if sub_id is not None else None
            if sub_id is None or record is None or record.channel != request.subject:
                raise RequestError(errors.INVALID_SUBSCRIPTION_TEXT)
            if record.client_id != request.clientID or request.clientID not in self._clients:
                raise RequestError(errors.UNKNOWN_CLIENT)
        except (InvalidRequest, RequestError) as exc:
            self._respond(reply, pb.SubscriptionResponse(error=str(exc)))
            return
        now = trio.current_time()
        if close:
            self.engine.close_subscription(sub_id, now)
        else:
            self.engine.unsubscribe(sub_id, now)
        self.runtime.sync()
        self._respond(reply, pb.SubscriptionResponse())

    def _by_delivery_inbox(self, client_id: str, channel: str, inbox: str) -> int | None:
        # After a subscribe timeout stan.go closes by delivery inbox; rare, so a scan is fine.
        for sub_id in self.engine.subscriptions():
            record = self.engine.subscription(sub_id)
            if (
                record is not None
                and record.inbox == inbox
                and record.channel == channel
                and self.engine.is_online(sub_id)
            ):
                return sub_id
        return None

    # -- limits ----------------------------------------------------------------------------------

    async def _age_sweeper(self) -> None:
        """Removes messages past MaxAge; the store says when the next one expires."""
        while True:
            try:
                result = await self._call(self.store.expire)
            except StoreError:
                log.exception("MaxAge sweep failed")
                await trio.sleep(1)
                continue
            for channel, dropped in result.dropped.items():
                self.engine.on_dropped(channel, dropped)
            self.runtime.sync()
            delay = 1.0
            if result.next_expiry_unix_ns is not None:
                delay = (result.next_expiry_unix_ns - time.time_ns()) / 1e9
            await trio.sleep(min(max(delay, 0.005), 1.0) if not math.isnan(delay) else 1.0)
