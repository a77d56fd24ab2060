"""STAN clients: who is registered (by client ID and connID), the duplicate-client-ID probe, server
heartbeats and client pings.

A STAN session is not tied to a TCP connection: a client is known by its client ID and connID, and it
is alive while it answers the heartbeats sent to its heartbeat inbox (one task per client, never one
per message). A client that misses more than `hb_fail_count` is closed; while its heartbeats fail its
subscriptions get nothing new, and what its queue members hold goes to the other members.

A client is bound to the NATS connection that registered it (`Client.conn`): requests naming its
client ID are honoured from that connection only, and its inboxes are reserved for it in the broker
(what the server sends there reaches that connection only; nobody may publish there). When that
connection goes, the client is unbound until a connection shows it is the client: a request carrying
its connID (known only to the client and the server), or, for a client without one, its next
request. See docs/security.md.
"""

from __future__ import annotations

import contextlib
import logging
import random
import secrets
from collections.abc import Callable

import attrs
import trio

from streaming.core import errors
from streaming.core.door_api import DoorApi
from streaming.core.outbound import ClientRecord
from streaming.nats.bus import Bus, Origin
from streaming.stan.config import StanConfig
from streaming.wire.stan_pb import protocol_pb2 as pb

log = logging.getLogger(__name__)


def nuid() -> str:
    """A unique token for subjects the server makes up (ack inboxes, reply subjects)."""
    return secrets.token_urlsafe(16).replace("-", "A").replace("_", "B")


@attrs.define
class Client:
    record: ClientRecord
    conn: int = 0  # the NATS connection it is bound to (0: none yet, or it went away)
    subjects: set[str] = attrs.Factory(set)  # its inboxes, reserved for that connection
    failures: int = 0
    checking: bool = False  # a duplicate-ID probe is running
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    poke: trio.Event = attrs.Factory(trio.Event)


class Clients:
    def __init__(self, config: StanConfig, broker: Bus, core: DoorApi) -> None:
        self.config = config
        self._broker = broker
        self._core = core
        self._by_id: dict[str, Client] = {}
        self.by_conn_id: dict[bytes, Client] = {}
        self._by_hb_inbox: dict[str, Client] = {}
        self._reply_prefix = f"_STAN.srv.{config.cluster_id}.{nuid()}"
        self._replies: dict[str, tuple[trio.MemorySendChannel[bytes], Client]] = {}
        self._jitter = random.Random()
        self._nursery: trio.Nursery | None = None
        self._registered = trio.Event()  # set (and replaced) whenever a client is added

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take over the recovered clients and watch every client's heartbeats until cancelled."""
        for record in self._core.recovered_clients():
            self._add(record)
        self._broker.subscribe(f"{self._reply_prefix}.*", self._on_reply)
        self._broker.add_close_hook(self._on_connection_closed)
        self._broker.add_disconnect_hook(self._on_disconnect)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for client in self._by_id.values():
                nursery.start_soon(self._heartbeat, client)
            task_status.started()
            await trio.sleep_forever()

    # -- the registry ----------------------------------------------------------------------------

    def records(self) -> list[ClientRecord]:
        return [client.record for client in self._by_id.values()]

    def get(self, client_id: str) -> Client | None:
        return self._by_id.get(client_id)

    def __contains__(self, client_id: str) -> bool:
        return client_id in self._by_id

    def _add(self, record: ClientRecord, conn: int = 0) -> Client:
        client = self._by_id[record.client_id] = self._by_hb_inbox[record.hb_inbox] = Client(record, conn)
        if record.conn_id:
            self.by_conn_id[record.conn_id] = client
        self.own(client, record.hb_inbox)
        self._registered.set()
        self._registered = trio.Event()
        return client

    async def arrival(self, find: Callable[[], Client | None]) -> Client:
        """The client `find` finds, once it is registered (bound it with a timeout)."""
        while (client := find()) is None:
            await self._registered.wait()
        return client

    # -- which connection a client is --------------------------------------------------------------

    def own(self, client: Client, subject: str) -> None:
        """Reserve one of the client's inboxes for its connection."""
        if subject not in client.subjects:
            client.subjects.add(subject)
            self._broker.reserve(subject, client.conn)

    def bind(self, client: Client, conn: int) -> None:
        """The client is on connection `conn` from now on (it proved it, or it was unbound)."""
        if client.conn != conn:
            if client.conn:
                log.info("client %r moved to connection %d", client.record.client_id, conn)
            client.conn = conn
            for subject in client.subjects:
                self._broker.reserve(subject, conn)

    def acting_for(self, client_id: str, conn: int) -> Client | None:
        """The client, if connection `conn` may act for it (a client not bound to a connection binds
        to this one); None for an unknown client or one bound to another connection."""
        client = self._by_id.get(client_id)
        if client is None or conn == 0:
            return client
        if client.conn and client.conn != conn:
            log.info("refused a request for client %r from connection %d (it is on %d)", client_id, conn, client.conn)
            return None
        if not client.conn:
            self.bind(client, conn)
        return client

    def proven(self, conn_id: bytes, conn: int) -> Client | None:
        """The client whose connID a request carries, bound to the connection that sent it."""
        client = self.by_conn_id.get(conn_id)
        if client is not None and conn and client.conn != conn:
            self.bind(client, conn)
        return client

    def _on_disconnect(self, conn: int) -> None:
        for client in self._by_id.values():
            if client.conn == conn:
                client.conn = 0  # the broker already keeps its inboxes for its return

    async def register(self, record: ClientRecord, conn: int = 0) -> str:
        """Register a connecting client, bound to connection `conn`: "" once it is, else the error for
        its ConnectResponse. A client ID in use is given up by its holder only when the holder does not
        answer a heartbeat."""
        client_id = record.client_id
        existing = self._by_id.get(client_id)
        if existing is not None:
            if existing.checking:
                return errors.CLIENT_ALREADY_REGISTERED
            existing.checking = True
            try:
                alive = await self.probe(existing, self.config.dup_check_timeout_s)
            finally:
                existing.checking = False
            if alive is not None or self._by_id.get(client_id) is not existing:
                return errors.CLIENT_ALREADY_REGISTERED
            log.info("client %r replaced by a new connection (the old one did not answer)", client_id)
            await self.close(existing)
            if client_id in self._by_id:
                return errors.CLIENT_ALREADY_REGISTERED
        if not self._broker.client_connected(conn):
            conn = 0  # its connection closed while the old holder was probed
        await self._admit(record, conn)
        return ""

    async def adopt(self, record: ClientRecord) -> None:
        """Register a client another server of a partitioned cluster registered (its connect came
        while this server was down): no duplicate-ID probe, the other server made it."""
        if record.client_id not in self._by_id:
            await self._admit(record, 0)
            log.info("client %r adopted from another server of the cluster ID", record.client_id)

    async def _admit(self, record: ClientRecord, conn: int) -> None:
        """Add a client: to the registry and the core, to the store, and to the heartbeats."""
        client = self._add(record, conn)
        # Stored before the answer, unless the store refuses writes (a full disk): the client is
        # served from memory then, and its record is written with the rest of the state once it can.
        if not await self._core.register_client(record):
            log.warning(
                "client %r is served, but its registration waits for the store to take writes", record.client_id
            )
        if self._nursery is not None:
            self._nursery.start_soon(self._heartbeat, client)

    async def close(self, client: Client) -> None:
        client_id = client.record.client_id
        if self._by_id.get(client_id) is not client:
            return
        del self._by_id[client_id]
        if self.by_conn_id.get(client.record.conn_id) is client:
            del self.by_conn_id[client.record.conn_id]
        if self._by_hb_inbox.get(client.record.hb_inbox) is client:
            del self._by_hb_inbox[client.record.hb_inbox]
        for subject in client.subjects:
            self._broker.release(subject)
        client.subjects.clear()
        client.scope.cancel()
        self._core.unregister_client(client_id)
        await trio.lowlevel.checkpoint()

    # -- heartbeats and pings --------------------------------------------------------------------

    async def probe(self, client: Client, wait: float) -> bytes | None:
        """A heartbeat: request/reply to the client's heartbeat inbox; None after `wait` s or with no
        interest. Only an answer from the connection the client is bound to counts: while it is
        unbound (its connection went), whoever else subscribes to its inbox cannot keep it alive."""
        subject = client.record.hb_inbox
        if not self._broker.has_interest(subject):
            return None  # no responders: answered at once (the embedded broker knows)
        token = nuid()
        send, receive = trio.open_memory_channel[bytes](1)
        self._replies[token] = (send, client)
        try:
            for pending in self._broker.publish(subject, b"", reply=f"{self._reply_prefix}.{token}"):
                await pending
            with trio.move_on_after(wait):
                return await receive.receive()
            return None
        finally:
            del self._replies[token]

    def _on_reply(self, subject: str, reply: str, payload: bytes, origin: Origin) -> None:
        waiting = self._replies.get(subject.rsplit(".", 1)[-1])
        if waiting is None:
            return
        channel, client = waiting
        if origin.conn != client.conn:
            log.info("ignored a heartbeat answer for client %r from another connection", client.record.client_id)
            return
        with contextlib.suppress(trio.WouldBlock):  # a second answer to one heartbeat
            channel.send_nowait(payload)

    async def _heartbeat(self, client: Client) -> None:
        """One task per client: probe its heartbeat inbox, close it after too many failures."""
        cfg = self.config
        client_id = client.record.client_id
        core = self._core
        with client.scope:
            while True:
                # +-10%: clients that connected together (a restart, a deploy) would otherwise be
                # checked together every interval, a thousand requests in one scheduler batch (a
                # stall of the loop every interval in bench/soak.py).
                with trio.move_on_after(cfg.hb_interval_s * self._jitter.uniform(0.9, 1.1)):
                    await client.poke.wait()
                client.poke = trio.Event()
                hb_inbox = client.record.hb_inbox
                if not self._broker.has_interest(hb_inbox):
                    # Gone with its connection, or reconnecting: it has as long to come back as a
                    # heartbeat has to be answered.
                    with trio.move_on_after(cfg.hb_timeout_s):
                        await self._broker.wait_interest([hb_inbox])
                answer = await self.probe(client, cfg.hb_timeout_s)
                if answer is not None:
                    if client.failures:
                        client.failures = 0
                        core.set_heartbeat_failed(client_id, False)
                    continue
                client.failures += 1
                if client.failures == 1:
                    core.set_heartbeat_failed(client_id, True)
                if client.failures > cfg.hb_fail_count:
                    log.info("client %r missed %d heartbeats: closing it", client_id, client.failures)
                    break
        await self.close(client)

    def _on_connection_closed(self, subjects: list[str]) -> None:
        """A client whose heartbeat inbox went with a connection is checked now, not at its next
        heartbeat: when it does not answer, its subscriptions stop receiving at once, and what its
        queue members hold goes to the other members when its AckWait ends (a slow consumer cut off by
        the broker, a crashed process). It is closed after its heartbeats keep failing, as any client."""
        for subject in subjects:
            client = self._by_hb_inbox.get(subject)
            if client is not None and not self._broker.has_interest(subject):
                client.poke.set()

    def ping(self, payload: bytes, conn: int) -> str:
        """A client's ping, from connection `conn`: "" if its connID is registered, else the error for
        its PingResponse."""
        try:
            ping = pb.Ping.FromString(payload)
        except Exception:
            return errors.CLIENT_REPLACED
        client = self.proven(bytes(ping.connID), conn)
        if client is None:
            return errors.CLIENT_REPLACED
        if client.failures:
            client.poke.set()  # check its heartbeat now, so the failed mark clears quickly
        return ""
