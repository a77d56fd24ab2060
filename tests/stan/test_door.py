"""The STAN door without sockets or time: requests handed in as client connections send them (a bus
in memory), the real delivery core on a memory store, under the virtual clock. What each connection
is answered, in which order, and that no connection acts for another's client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio
import trio.testing

from storage import MemoryStore
from streaming.core.door_api import DoorApi
from streaming.core.service import Core
from streaming.nats.bus import Origin
from streaming.stan.config import StanConfig
from streaming.stan.door import StanDoor
from streaming.wire.stan_pb import protocol_pb2 as pb
from tests.stan.memory_bus import MemoryBus

CID = "test-cluster"


@attrs.define
class World:
    bus: MemoryBus
    door: StanDoor
    core: Core
    prefixes: pb.ConnectResponse = attrs.field(factory=pb.ConnectResponse)

    async def connect(
        self, client_id: str, conn: int, conn_id: bytes = b"", *, holder_answers: int = 0
    ) -> pb.ConnectResponse:
        """Connect `client_id` from connection `conn`; `holder_answers`: the connection that answers
        the heartbeat the server sends to the client ID's holder (0: nobody)."""
        self.bus.connections.add(conn)
        self.bus.listen(f"_HB.{client_id}")
        request = pb.ConnectRequest(
            clientID=client_id, heartbeatInbox=f"_HB.{client_id}", protocol=1, connID=conn_id or client_id.encode()
        )
        reply = f"_INBOX.{conn}.connect"
        await self.bus.send(f"_STAN.discover.{CID}", request.SerializeToString(), reply, origin=Origin(conn))
        for probe in self.bus.take(subject=f"_HB.{client_id}"):
            if holder_answers:
                await self.bus.send(probe.reply, b"", origin=Origin(holder_answers))
        await trio.sleep(1)  # past the duplicate-ID probe's wait
        (answer,) = self.bus.take(to=conn, subject=reply)
        response = pb.ConnectResponse.FromString(answer.payload)
        if not response.error:
            self.prefixes = response
        return response

    async def publish(
        self, client_id: str, conn: int, channel: str, data: bytes, guid: str, conn_id: bytes = b""
    ) -> None:
        message = pb.PubMsg(clientID=client_id, guid=guid, subject=channel, data=data, connID=conn_id)
        reply = f"_STAN.acks.{conn}"
        await self.bus.send(
            f"{self.prefixes.pubPrefix}.{channel}", message.SerializeToString(), reply, origin=Origin(conn)
        )
        await self.core.group_commit.flush()

    def pub_acks(self, conn: int) -> list[pb.PubAck]:
        return [pb.PubAck.FromString(s.payload) for s in self.bus.take(to=conn, subject=f"_STAN.acks.{conn}")]

    async def subscribe(self, client_id: str, conn: int, channel: str, inbox: str) -> pb.SubscriptionResponse:
        request = pb.SubscriptionRequest(
            clientID=client_id, subject=channel, inbox=inbox, maxInFlight=100, ackWaitInSecs=30
        )
        reply = f"_INBOX.{conn}.sub"
        await self.bus.send(self.prefixes.subRequests, request.SerializeToString(), reply, origin=Origin(conn))
        (answer,) = self.bus.take(to=conn, subject=reply)
        return pb.SubscriptionResponse.FromString(answer.payload)


@asynccontextmanager
async def world() -> AsyncIterator[World]:
    core = Core(MemoryStore(), store_in_thread=False)
    bus = MemoryBus()
    door = StanDoor(StanConfig(cluster_id=CID), bus, DoorApi(core))
    async with trio.open_nursery() as nursery:
        await nursery.start(core.run)
        await nursery.start(door.run)
        await core.ready.wait()
        yield World(bus, door, core)
        nursery.cancel_scope.cancel()


async def test_a_connect_is_answered_to_its_connection_with_the_clusters_subjects(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with world() as w:
        response = await w.connect("alice", conn=1)
        assert not response.error and response.pubPrefix == f"_STAN.pub.{CID}" and response.protocol == 1
        assert response.subRequests == f"_STAN.sub.{CID}" and response.closeRequests == f"_STAN.close.{CID}"
        assert w.bus.reserved["_HB.alice"] == 1, "its heartbeat inbox is its connection's alone"
        again = await w.connect("alice", conn=2, holder_answers=1)
        assert again.error == "stan: clientID already registered", "the holder answers its heartbeat"
        forged = await w.connect("alice", conn=2, holder_answers=3)
        assert not forged.error, "an answer from another connection does not keep a client alive"
        assert w.bus.reserved["_HB.alice"] == 2


async def test_a_publish_is_acknowledged_once_stored_and_an_unknown_clients_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with world() as w:
        await w.connect("alice", conn=1)
        await w.publish("alice", 1, "orders", b"one", "g1", conn_id=b"alice")
        assert [(a.guid, a.error) for a in w.pub_acks(1)] == [("g1", "")]
        assert [m.data for m in w.core.store.read("orders", 1, 10)] == [b"one"]
        await w.publish("mallory", 3, "orders", b"forged", "g2")
        assert [(a.guid, a.error) for a in w.pub_acks(3)] == [("g2", "stan: invalid publish request")]
        assert len(w.core.store.read("orders", 1, 10)) == 1


async def test_a_subscription_is_answered_before_any_of_its_messages(autojump_clock: trio.testing.MockClock) -> None:
    async with world() as w:
        await w.connect("alice", conn=1)
        for n in range(3):
            await w.publish("alice", 1, "orders", b"%d" % n, f"g{n}", conn_id=b"alice")
        w.bus.take()
        reply = "_INBOX.1.sub"
        request = pb.SubscriptionRequest(
            clientID="alice",
            subject="orders",
            inbox="_INBOX.1.msgs",
            maxInFlight=10,
            ackWaitInSecs=30,
            startPosition=pb.First,
        )
        await w.bus.send(f"_STAN.sub.{CID}", request.SerializeToString(), reply, origin=Origin(1))
        sent = w.bus.take(to=1)
        assert sent[0].subject == reply and pb.SubscriptionResponse.FromString(sent[0].payload).ackInbox
        assert [pb.MsgProto.FromString(s.payload).sequence for s in sent[1:]] == [1, 2, 3]


async def test_no_connection_acts_for_another_connections_client(autojump_clock: trio.testing.MockClock) -> None:
    async with world() as w:
        await w.connect("alice", conn=1)
        response = await w.subscribe("alice", 1, "orders", "_INBOX.1.msgs")
        await w.publish("alice", 1, "orders", b"x", "g1", conn_id=b"alice")
        (delivery,) = w.bus.take(to=1, subject="_INBOX.1.msgs")
        seq = pb.MsgProto.FromString(delivery.payload).sequence
        # Connection 2 acks alice's message: not taken; its AckWait ends and it comes again.
        ack = pb.Ack(subject="orders", sequence=seq).SerializeToString()
        await w.bus.send(response.ackInbox, ack, origin=Origin(2))
        stolen = await w.subscribe("alice", 2, "orders", "_INBOX.2.msgs")
        assert stolen.error == "stan: unknown clientID"
        unsub = pb.UnsubscribeRequest(clientID="alice", subject="orders", inbox=response.ackInbox)
        await w.bus.send(f"_STAN.unsub.{CID}", unsub.SerializeToString(), "_INBOX.2.unsub", origin=Origin(2))
        (refused,) = w.bus.take(to=2, subject="_INBOX.2.unsub")
        assert pb.SubscriptionResponse.FromString(refused.payload).error == "stan: unknown clientID"
        await trio.sleep(31)
        (again,) = w.bus.take(to=1, subject="_INBOX.1.msgs")
        assert pb.MsgProto.FromString(again.payload).redelivered
        # Its own connection's ack is taken: nothing comes again.
        await w.bus.send(response.ackInbox, ack, origin=Origin(1))
        await trio.sleep(31)
        assert w.bus.take(to=1, subject="_INBOX.1.msgs") == []


async def test_a_close_answers_after_the_clients_publishes_are_stored(autojump_clock: trio.testing.MockClock) -> None:
    async with world() as w:
        await w.connect("alice", conn=1)
        await w.publish("alice", 1, "orders", b"last", "g1", conn_id=b"alice")
        close = pb.CloseRequest(clientID="alice").SerializeToString()
        await w.bus.send(f"_STAN.close.{CID}", close, "_INBOX.1.close", origin=Origin(1))
        (answer,) = w.bus.take(to=1, subject="_INBOX.1.close")
        assert not pb.CloseResponse.FromString(answer.payload).error
        assert [m.data for m in w.core.store.read("orders", 1, 10)] == [b"last"]
        await w.publish("alice", 1, "orders", b"after", "g2", conn_id=b"alice")
        assert [a.error for a in w.pub_acks(1)][-1] == "stan: invalid publish request"
