"""The STAN front door: answers NATS Streaming clients on the embedded broker.

Protocol translation only. It subscribes in-process to the STAN subjects of its cluster ID, decodes
each request (streaming.stan.requests), and turns it into a call on the delivery core's door API
(streaming.core.door_api): the registry of clients, heartbeats and pings live in
streaming.stan.clients; deliveries and PubAcks leave through its outbound port
(streaming.stan.outbound). It never runs the commit sequence itself.

- connect / close, with client-ID validation and the duplicate-client-ID probe;
- publish: validated when it arrives, so a connection's publishes before its Close count;
  acknowledged after the group commit;
- subscribe / unsubscribe / subscription close; the SubscriptionResponse is sent before any message
  of the subscription;
- acks, on one wildcard subscription for every ack inbox.

Each read of a client connection is one input span of the core (the broker says when one starts and
ends): its acks' effects are carried out once, and its publishes committed, at its end.

Requests naming a client are honoured from the connection the client is bound to only
(streaming.stan.clients), answers go to the connection that asked only, and a client's inboxes are
reserved for its connection (docs/security.md).

Partitioned (streaming.stan.partitions), it takes publishes for its own channels only, ignores
subscription requests for other channels, and gives its subscriptions ack inboxes under a prefix of
its own, so that acks reach the server that owns the subscription only. A publish or subscription
from a client whose connect this server has not finished (another server answered it first) waits
for it briefly, in order behind that client's earlier ones.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from functools import partial

import attrs
import trio

from streaming.core import errors
from streaming.core.door_api import DoorApi
from streaming.core.errors import RequestError, StoreError, StoreFullError
from streaming.core.outbound import ClientRecord, Publish
from streaming.nats.bus import Bus, Origin
from streaming.stan.clients import Client, Clients, nuid
from streaming.stan.config import StanConfig
from streaming.stan.outbound import StanOutbound
from streaming.stan.partitions import Partition, decode_client, encode_client
from streaming.stan.requests import (
    InvalidRequest,
    parse_close,
    parse_connect,
    parse_publish,
    parse_subscribe,
    parse_unsubscribe,
)
from streaming.wire.stan_pb import protocol_pb2 as pb
from streaming.wire.subjects import has_wildcard

log = logging.getLogger(__name__)

# Labels for refused requests, by the response that carries the error (a fixed set).
_REFUSAL_KINDS: dict[type, str] = {
    pb.ConnectResponse: "stan_connect",
    pb.SubscriptionResponse: "stan_subscription",  # subscribe, unsubscribe, close
    pb.CloseResponse: "stan_close",
    pb.PingResponse: "stan_ping",
    pb.PubAck: "stan_publish",
}
REFUSAL_KINDS = tuple(_REFUSAL_KINDS.values())  # every key of StanDoor.refused
LATE_CLIENT_WAIT_S = 2.0  # partitioned: how long a request waits for its client's connect here
LOOKUP_AFTER_S = 0.2  # partitioned: then the other servers are asked whether they know the client
# Negative acks (our extension) go to a subscription's ack inbox with this appended; the connect
# response says so (nakSuffix), and a client seeing none there knows the server takes no naks.
NAK_SUFFIX = ".nak"


class StanDoor:
    def __init__(self, config: StanConfig, broker: Bus, core: DoorApi, partition: Partition | None = None) -> None:
        self.config = config
        self.partition = partition
        # Wildcard subscriptions follow every matching channel of this server's engine: partitioned,
        # the channels are spread over servers, so a pattern is refused there as an invalid subject.
        self._wildcards = config.wildcard_subscriptions and partition is None
        self.broker = broker
        self.core = core
        self.outbound = StanOutbound(broker)
        core.add_door(self.outbound)
        self.clients = Clients(config, broker, core)
        cid = config.cluster_id
        self.discover_subject = f"{config.discover_prefix}.{cid}"
        self.pub_prefix = f"_STAN.pub.{cid}"
        self.sub_subject = f"_STAN.sub.{cid}"
        self.unsub_subject = f"_STAN.unsub.{cid}"
        self.subclose_subject = f"_STAN.subclose.{cid}"
        self.close_subject = f"_STAN.close.{cid}"
        self.ping_subject = f"{self.discover_subject}.pings"
        # Partitioned, acks go to the server that owns the subscription only.
        self.ack_prefix = f"_STAN.ack.{cid}" if partition is None else f"_STAN.ack.{cid}.{nuid()}"
        self._late: dict[str | bytes, list[tuple[pb.PubMsg, str, Origin]]] = {}  # see _publish_late
        self.peers_subject = f"_STAN.partitions.{cid}.clients"  # partitioned: who knows this client?
        self._found_prefix = f"_STAN.partitions.{cid}.found.{nuid()}"
        self._lookups: dict[str, trio.MemorySendChannel[bytes]] = {}
        self.refused: collections.Counter[str] = collections.Counter()  # refused requests by kind
        self._restricts = broker.auth.restricts  # users have permissions: publishes are checked
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Answer STAN requests until cancelled (start it after the core's `run`)."""
        recovered = self.core.recovered_subscriptions()
        cid = self.config.cluster_id
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.clients.run)
            b = self.broker
            b.protect(f"{self.config.discover_prefix}.")  # internal already when under _STAN.
            for subscription in recovered:
                owner = self.clients.get(subscription.client_id)
                if owner is not None:
                    self.clients.own(owner, subscription.inbox)
            b.subscribe(self.discover_subject, self._on_connect)
            b.subscribe(self.ping_subject, self._on_ping)
            partition = self.partition
            for subject in [f"{self.pub_prefix}.>"] if partition is None else partition.publish_subjects(cid):
                b.subscribe(subject, self._on_publish, runs=self._on_publishes)
            b.subscribe(self.sub_subject, self._on_subscribe)
            b.subscribe(self.unsub_subject, partial(self._on_unsubscribe, close=False))
            b.subscribe(self.subclose_subject, partial(self._on_unsubscribe, close=True))
            b.subscribe(self.close_subject, self._on_close)
            if partition is not None:
                b.subscribe(self.peers_subject, self._on_client_lookup)
                b.subscribe(f"{self._found_prefix}.*", self._on_client_found)
            for subject in self._ack_subjects(r.ack_inbox for r in recovered):
                b.subscribe(subject, self._on_ack, runs=self._on_acks)
                b.subscribe(subject + NAK_SUFFIX, self._on_nak, runs=self._on_naks)
            b.add_span_listener(self.core)
            log.info(
                "STAN cluster %r ready: %d channels, %d clients, %d subscriptions recovered",
                self.config.cluster_id,
                self.core.recovered_channels(),
                len(self.core.recovered_clients()),
                len(recovered),
            )
            task_status.started()

    def _ack_subjects(self, recovered: Iterable[str]) -> list[str]:
        """What to listen on for acks: this process's ack-inbox prefix, those of recovered subscriptions
        made by an earlier one (`_STAN.ack.<cluster>[.<partition id>].<id>`), and each recovered ack inbox
        of another scheme as it is (nats-streaming-server's are `_INBOX.<id>`, and a wildcard there would
        catch every client's inboxes)."""
        subjects = {f"{self.ack_prefix}.*"}
        ours = f"_STAN.ack.{self.config.cluster_id}."
        for inbox in recovered:
            subjects.add(f"{inbox.rsplit('.', 1)[0]}.*" if inbox.startswith(ours) else inbox)
        return sorted(subjects)

    def _respond(self, reply: str, message: object, to: Origin) -> None:
        """Answer a request, to the connection that sent it only."""
        kind = _REFUSAL_KINDS.get(type(message))
        error: str = getattr(message, "error", "")
        if kind is not None and error:
            self.refused[kind] += 1
        if reply:
            assert hasattr(message, "SerializeToString")
            self.broker.publish(reply, message.SerializeToString(), to=to.conn)

    # -- connect and close -----------------------------------------------------------------------

    def _on_connect(self, subject: str, reply: str, payload: bytes, origin: Origin) -> None:
        # Connects run beside the connection's other traffic: a duplicate-ID probe waits up to 0.5 s.
        if self._nursery is not None:
            self._nursery.start_soon(self._connect, reply, payload, origin)

    async def _connect(self, reply: str, payload: bytes, origin: Origin) -> None:
        try:
            request = parse_connect(payload)
        except InvalidRequest as exc:
            self._respond(reply, pb.ConnectResponse(error=str(exc)), origin)
            return
        record = ClientRecord(
            request.clientID,
            request.heartbeatInbox,
            bytes(request.connID),
            request.protocol,
            request.pingInterval,
            request.pingMaxOut,
        )
        error = await self.clients.register(record, origin.conn)
        if error:
            self._respond(reply, pb.ConnectResponse(error=error), origin)
            return
        response = pb.ConnectResponse(
            pubPrefix=self.pub_prefix,
            subRequests=self.sub_subject,
            unsubRequests=self.unsub_subject,
            closeRequests=self.close_subject,
            subCloseRequests=self.subclose_subject,
            protocol=1,
            nakSuffix=NAK_SUFFIX,
        )
        if request.protocol >= 1:
            response.pingRequests = self.ping_subject
            response.pingInterval = request.pingInterval
            response.pingMaxOut = request.pingMaxOut
        log.debug("client %r connected", request.clientID)
        self._respond(reply, response, origin)

    def _on_close(self, subject: str, reply: str, payload: bytes, origin: Origin) -> Awaitable[None]:
        return self._close(reply, payload, origin)

    async def _close(self, reply: str, payload: bytes, origin: Origin) -> None:
        try:
            request = parse_close(payload)
        except InvalidRequest as exc:
            self._respond(reply, pb.CloseResponse(error=str(exc)), origin)
            return
        client = self.clients.acting_for(request.clientID, origin.conn)
        if client is None:
            if self.partition is None:  # partitioned, another server may know it (and answers)
                self._respond(reply, pb.CloseResponse(error=errors.UNKNOWN_CLIENT), origin)
            return
        await self.core.flush_publishes()  # its publishes before the Close are stored first
        await self.clients.close(client)
        log.debug("client %r closed", request.clientID)
        self._respond(reply, pb.CloseResponse(), origin)

    def _on_ping(self, subject: str, reply: str, payload: bytes, origin: Origin) -> None:
        if not payload or not reply:
            return
        error = self.clients.ping(payload, origin.conn)
        if error:
            # Partitioned, every server hears a client's pings, and one that has not finished its
            # connect (or took its client ID over) must not tell it that it is gone: the others answer.
            if self.partition is None:
                self._respond(reply, pb.PingResponse(error=error), origin)
        else:
            self.broker.publish(reply, b"", to=origin.conn)

    # -- publish and ack (hot paths: no awaits unless the commit queue is full) -------------------

    def _on_publish(self, subject: str, reply: str, payload: bytes, origin: Origin) -> Awaitable[None] | None:
        return self._on_publishes(subject, reply, [payload], origin)

    def _on_publishes(self, subject: str, reply: str, payloads: list[bytes], origin: Origin) -> Awaitable[None] | None:
        """Publishes from one connection with one PubAck inbox, one or a run of them: what passes the
        checks is queued for the group commit at once. When the commit queue fills meanwhile, the
        reader waits for room after the run."""
        partitioned = self.partition is not None
        wait = client = None
        last_conn_id = b""
        accepted: list[Publish] = []
        # Per message, a publish of a known client costs only its parse and its Publish, unless the
        # core may refuse it (permissions, a channel being deleted): then the general path (`_checked`).
        core, outbound, new = self.core, self.outbound, tuple.__new__
        checked = self._restricts or core.refusing
        for payload in payloads:
            try:
                message, channel, guid, stored_reply = parse_publish(payload)
            except InvalidRequest as exc:
                self._respond(reply, pb.PubAck(guid=exc.guid, error=str(exc)), origin)
                continue
            conn_id = message.connID
            if not conn_id or conn_id != last_conn_id:  # a run's publishes carry one: one lookup
                client, last_conn_id = self._publisher(message, conn_id, origin), conn_id
                if client is not None:
                    self._own_ack_inbox(client, reply)
            if partitioned and (client is None or self._late):
                if accepted:  # in order: what this run accepted so far goes first
                    wait = core.publish_many(accepted, reply) or wait
                    accepted = []
                wait = self._wait_for_publisher(message, reply, origin, client) or wait
                continue
            if client is None:
                self._respond(reply, pb.PubAck(guid=guid, error=errors.INVALID_PUBLISH), origin)
            elif checked:
                publish = self._checked(message, reply, origin)
                if publish is not None:
                    accepted.append(publish)
            else:
                # Built as the tuple it is: the named constructor costs about as much again (a
                # Python-level __new__), once per message here.
                accepted.append(new(Publish, (channel, message.data, stored_reply, guid, reply, outbound, "")))
        if accepted:
            wait = core.publish_many(accepted, reply) or wait
        return wait

    def _publisher(self, message: pb.PubMsg, conn_id: bytes, origin: Origin) -> Client | None:
        """Who sent `message` (`conn_id`: its connID), if a known client did."""
        clients = self.clients
        if conn_id:  # the connID proves who it is: a client that came back on a new connection moves
            return clients.proven(conn_id, origin.conn)
        # A client without a connID (protocol 0) is known by its client ID and connection.
        client = clients.acting_for(message.clientID, origin.conn)
        if client is not None and client.record.conn_id:
            return None  # it has a connID: a publish without one is not its own
        return client

    def _wait_for_publisher(
        self, message: pb.PubMsg, reply: str, origin: Origin, client: Client | None
    ) -> Awaitable[None] | None:
        """Partitioned: a publish from a client whose connect is not done here yet waits for it, and
        so do that client's later publishes, in order, while it waits."""
        key: str | bytes = message.connID or message.clientID
        waiting = self._late.get(key)
        if waiting is not None:
            waiting.append((message, reply, origin))
            return None
        if client is not None:  # known, and none of its publishes wait
            return self._accept_publish(message, reply, origin, client)
        self._late[key] = [(message, reply, origin)]
        assert self._nursery is not None
        self._nursery.start_soon(self._publish_late, key)
        return None

    async def _publish_late(self, key: str | bytes) -> None:
        waiting = self._late[key]
        message, _, origin = waiting[0]
        with trio.move_on_after(LATE_CLIENT_WAIT_S):
            await self._find_client(
                lambda: self._publisher(message, message.connID, origin), message.connID, message.clientID
            )
        del self._late[key]
        for message, reply, origin in waiting:
            client = self._publisher(message, message.connID, origin)
            if client is None:
                self._respond(reply, pb.PubAck(guid=message.guid, error=errors.INVALID_PUBLISH), origin)
                continue
            pending = self._accept_publish(message, reply, origin, client)
            if pending is not None:
                await pending

    def _accept_publish(self, message: pb.PubMsg, reply: str, origin: Origin, client: Client) -> Awaitable[None] | None:
        """Queue one publish of a known client, or answer why not (partitioned: one that waited)."""
        self._own_ack_inbox(client, reply)
        publish = self._checked(message, reply, origin)
        return None if publish is None else self.core.publish_many([publish], reply)

    def _own_ack_inbox(self, client: Client, reply: str) -> None:
        """A publisher's PubAck inbox is for its connection only."""
        if reply and reply not in client.subjects:
            self.clients.own(client, reply)

    def _checked(self, message: pb.PubMsg, reply: str, origin: Origin) -> Publish | None:
        """The publish to queue for a known client's `message`, or None once its refusal is answered
        (its channel is being deleted, or its user may not publish there)."""
        channel = message.subject
        refusal = self.core.refusal(channel, "publish", origin.permissions)
        if refusal is not None:
            self._respond(reply, pb.PubAck(guid=message.guid, error=str(refusal)), origin)
            return None
        return Publish(channel, message.data, message.reply, message.guid, reply, self.outbound)

    def _on_ack(self, subject: str, reply: str, payload: bytes, origin: Origin) -> None:
        self._on_acks(subject, reply, [payload], origin)

    def _on_acks(self, subject: str, reply: str, payloads: list[bytes], origin: Origin) -> None:
        """Acks sent to one subscription's ack inbox, one or a run of them from one connection: the
        sender is checked once, and the acks go to the engine together (one fill of the subscription).
        A wildcard subscription's acks each name their message's channel (STAN's `Ack.subject`), whose
        part of the subscription they settle; a run on one channel goes together."""
        sub_id = self._acker(subject, origin)
        if sub_id is None:
            return
        decode = pb.Ack.FromString
        core = self.core
        wild = core.is_wildcard(sub_id)
        part = sub_id
        seqs: list[int] = []
        for payload in payloads:
            try:
                ack = decode(payload)
            except Exception:
                log.info("ignored an undecodable ack on %s", subject)
                continue
            target = core.part_for(sub_id, ack.subject) if wild else sub_id
            if target is None:
                continue  # a channel the wildcard does not follow (any more): nothing to settle
            if target != part:
                if seqs:
                    core.ack_many(part, seqs)
                part, seqs = target, []
            if ack.inProgress:
                if seqs:  # in their order: acks before it settle first
                    core.ack_many(part, seqs)
                    seqs = []
                core.ack_progress(part, ack.sequence)
            else:
                seqs.append(ack.sequence)
        if seqs:
            core.ack_many(part, seqs)

    def _acker(self, ack_inbox: str, origin: Origin) -> int | None:
        """The subscription whose ack inbox is `ack_inbox`, when `origin` is its client's connection
        (None otherwise: acks and naks are never taken for another client)."""
        target = self.core.ack_target(ack_inbox)
        if target is None:
            return None
        sub_id, client_id = target
        client = self.clients.get(client_id)
        if client is None or (client.conn != origin.conn and self.clients.acting_for(client_id, origin.conn) is None):
            return None
        return sub_id

    def _on_nak(self, subject: str, reply: str, payload: bytes, origin: Origin) -> None:
        self._on_naks(subject, reply, [payload], origin)

    def _on_naks(self, subject: str, reply: str, payloads: list[bytes], origin: Origin) -> None:
        """Negative acks (our extension) on `<ack inbox>.nak`, one or a run of them from one connection:
        each message comes back after its delay. The sender is checked once, as for acks."""
        sub_id = self._acker(subject.removesuffix(NAK_SUFFIX), origin)
        if sub_id is None:
            return
        decode, nak, part_for = pb.Nak.FromString, self.core.nak, self.core.part_for
        for payload in payloads:
            try:
                given = decode(payload)
            except Exception:
                log.info("ignored an undecodable nak on %s", subject)
                continue
            target = part_for(sub_id, given.subject)  # a wildcard's part on the nak's channel
            if target is not None:
                nak(target, given.sequence, given.delayMs / 1000)

    # -- subscriptions ---------------------------------------------------------------------------

    def _on_subscribe(self, subject: str, reply: str, payload: bytes, origin: Origin) -> Awaitable[None] | None:
        if self.partition is None:
            return self._subscribe(reply, payload, origin)
        try:
            request = parse_subscribe(payload, "", ms_mode=self.config.allow_ms_ack_wait)
        except InvalidRequest as exc:
            self._respond(reply, pb.SubscriptionResponse(error=str(exc)), origin)
            return None
        if not self.partition.owns(request.channel):
            return None  # another server's channel: that server answers
        if self._settled(request.client_id) is None and self._nursery is not None:
            self._nursery.start_soon(self._subscribe_late, request.client_id, reply, payload, origin)
            return None
        return self._subscribe(reply, payload, origin)

    async def _subscribe_late(self, client_id: str, reply: str, payload: bytes, origin: Origin) -> None:
        """Partitioned: a subscription from a client whose connect is not done here yet waits for it."""
        with trio.move_on_after(LATE_CLIENT_WAIT_S):
            await self._find_client(lambda: self._settled(client_id), b"", client_id)
        await self._subscribe(reply, payload, origin)

    def _settled(self, client_id: str) -> Client | None:
        """The client, unless its client ID is being taken over (a new connect probes the old holder):
        partitioned, its requests can arrive before that is decided here."""
        client = self.clients.get(client_id)
        return None if client is None or client.checking else client

    async def _find_client(self, find: Callable[[], Client | None], conn_id: bytes, client_id: str) -> Client:
        """Partitioned: wait for a client's connect to be done here; meanwhile, after a moment, ask the
        other servers whether they registered it (it connected while this one was down), and adopt
        the registration one of them gives. Bound it with a timeout."""
        found: list[Client] = []
        async with trio.open_nursery() as nursery:

            async def arrive() -> None:
                found.append(await self.clients.arrival(find))
                nursery.cancel_scope.cancel()

            nursery.start_soon(arrive)
            await trio.sleep(LOOKUP_AFTER_S)
            token = nuid()
            send, receive = trio.open_memory_channel[bytes](1)
            self._lookups[token] = send
            try:
                question = json.dumps({"conn_id": conn_id.hex(), "client_id": client_id}).encode()
                self.broker.publish(self.peers_subject, question, f"{self._found_prefix}.{token}")
                record = decode_client(await receive.receive())
            finally:
                del self._lookups[token]
            if record is not None and (record.conn_id == conn_id if conn_id else record.client_id == client_id):
                await self.clients.adopt(record)
            await trio.sleep_forever()  # until `arrive` finds it, or the caller's timeout
        return found[0]

    def _on_client_lookup(self, subject: str, reply: str, payload: bytes, origin: Origin) -> None:
        """Another server of the partitioned cluster asks for a client it does not know."""
        try:
            question = json.loads(payload)
            conn_id = bytes.fromhex(str(question.get("conn_id", "")))
            client_id = str(question.get("client_id", ""))
        except (ValueError, AttributeError, RecursionError):
            return
        client = self.clients.by_conn_id.get(conn_id) if conn_id else self.clients.get(client_id)
        if client is not None and reply:
            self.broker.publish(reply, encode_client(client.record))

    def _on_client_found(self, subject: str, reply: str, payload: bytes, origin: Origin) -> None:
        send = self._lookups.get(subject.rsplit(".", 1)[-1])
        if send is not None:
            with contextlib.suppress(trio.WouldBlock):  # a second server answered too
                send.send_nowait(payload)

    async def _subscribe(self, reply: str, payload: bytes, origin: Origin) -> None:
        core = self.core
        ack_inbox = f"{self.ack_prefix}.{nuid()}"
        try:
            request = parse_subscribe(
                payload, ack_inbox, ms_mode=self.config.allow_ms_ack_wait, wildcards=self._wildcards
            )
            client = self.clients.acting_for(request.client_id, origin.conn)
            if client is None:
                raise RequestError(errors.UNKNOWN_CLIENT)
            refusal = core.refusal(request.channel, "subscribe", origin.permissions)
            if refusal is not None:
                raise refusal
            self.clients.own(client, request.inbox)
            if has_wildcard(request.channel):
                if origin.permissions is not None:  # the channels of it the user may not read are left out
                    request = attrs.evolve(request, exclude=origin.permissions.denied_within(request.channel))
            else:
                await core.ensure_channel(request.channel)
            if core.store_write_error() is not None and core.creates_durable(request):
                # It could not be made durable: a crash would lose it, and with it its position.
                raise RequestError(errors.store_error(StoreFullError("new durable subscription")))

            def answer(sub_id: int) -> None:  # the response goes out before any of its messages
                self._respond(reply, pb.SubscriptionResponse(ackInbox=ack_inbox), origin)
                log.debug("subscription %d on %r for %r", sub_id, request.channel, request.client_id)

            core.subscribe(request, answer)
        except (InvalidRequest, RequestError) as exc:
            self._respond(reply, pb.SubscriptionResponse(error=str(exc)), origin)
        except StoreError as exc:
            log.error("subscribe failed: %s", exc)
            self._respond(reply, pb.SubscriptionResponse(error=errors.store_error(exc)), origin)

    def _on_unsubscribe(self, subject: str, reply: str, payload: bytes, origin: Origin, *, close: bool) -> None:
        # Synchronous, so acks that arrived before it on this connection were applied first.
        core = self.core
        try:
            request = parse_unsubscribe(payload)
            if self.partition is not None and not self.partition.owns(request.subject):
                return  # another server's channel: that server answers
            if not has_wildcard(request.subject) and core.channel_info(request.subject) is None:
                raise RequestError(errors.UNKNOWN_CHANNEL)
            target = core.ack_target(request.inbox)
            # After a subscribe timeout stan.go closes by delivery inbox.
            sub_id = target[0] if target is not None else core.online_subscription(request.subject, request.inbox)
            record = core.subscription(sub_id) if sub_id is not None else None
            if sub_id is None or record is None or record.channel != request.subject:
                raise RequestError(errors.INVALID_SUBSCRIPTION)
            if record.client_id != request.clientID or self.clients.acting_for(request.clientID, origin.conn) is None:
                raise RequestError(errors.UNKNOWN_CLIENT)
        except (InvalidRequest, RequestError) as exc:
            self._respond(reply, pb.SubscriptionResponse(error=str(exc)), origin)
            return
        core.unsubscribe(sub_id, close=close)
        self._respond(reply, pb.SubscriptionResponse(), origin)
