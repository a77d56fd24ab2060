"""One client cannot act for, read for or answer for another, without any authentication configured.

The victim is our STAN client; the attacker is a bare NATS connection on the same server that knows
what it could have learnt elsewhere (the cluster ID, the victim's client ID and inboxes, which the
tests read from the server). Each attack fails for the attacker and the victim keeps working."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
import trio

from streaming.client import StanClient, StartPosition, connect
from streaming.running import Running
from streaming.wire import nats as p
from streaming.wire.stan_pb import protocol_pb2 as pb
from tests.support.node import node, run_node
from tests.support.servers import RawClient, config, running, server_process

CLUSTER = "test-cluster"


@pytest.fixture
async def server() -> AsyncIterator[Running]:
    async with running(config()) as srv:
        yield srv


async def drain(client: RawClient, wait: float = 0.3) -> list[p.Event]:
    """Everything the connection gets within `wait` seconds."""
    seen: list[p.Event] = []
    with trio.move_on_after(wait):
        while True:
            seen.append(await client.next())
    return seen


async def request(attacker: RawClient, subject: str, payload: bytes) -> bytes:
    """A STAN request by hand; the payload of its answer."""
    await attacker.send(b"SUB _INBOX.attacker 99\r\n" + p.encode_pub(subject, "_INBOX.attacker", payload))
    with trio.fail_after(5):
        while True:
            event = await attacker.next()
            if isinstance(event, p.Msg) and event.sid == "99":
                return event.payload


async def check_victim_works(victim: StanClient, channel: str = "orders") -> None:
    async with victim.subscribe(channel, start_at=StartPosition.FIRST, manual_ack=True) as sub:
        await victim.publish(channel, b"still works")
        with trio.fail_after(5):
            while (msg := await sub.next_msg()).data != b"still works":
                msg.ack()
        msg.ack()


async def test_a_wildcard_subscriber_sees_none_of_the_server_protocol_nor_anyone_elses_messages(
    server: Running,
) -> None:
    attacker = await RawClient.open(server.port)
    await attacker.send(b"SUB > 1\r\nSUB *.> 2\r\nPING\r\n")
    assert await attacker.next() == p.PONG
    async with connect(CLUSTER, "victim", port=server.port) as victim:
        async with victim.subscribe("orders", start_at=StartPosition.FIRST, manual_ack=True) as sub:
            await victim.publish("orders", b"secret payload")
            msg = await sub.next_msg()
            msg.ack()
        seen = await drain(attacker)
    leaked = [e for e in seen if isinstance(e, p.Msg)]
    assert not leaked, [(m.subject, m.payload[:40]) for m in leaked]


async def test_subscribing_to_the_servers_subjects_is_refused(server: Running) -> None:
    attacker = await RawClient.open(server.port)
    for subject in (f"_STAN.discover.{CLUSTER}", "_STAN.>", f"_STAN.pub.{CLUSTER}.>", f"_STAN.sub.{CLUSTER}"):
        await attacker.send(b"SUB %s 7\r\nPING\r\n" % subject.encode())
        err = await attacker.next()
        assert isinstance(err, p.Err) and err.text == f'Permissions Violation for Subscription to "{subject}"'
        assert await attacker.next() == p.PONG, "the connection stays open"
    await attacker.send(b"SUB _STAN.acks.mine 8\r\nPING\r\n")  # where clients take their PubAcks
    assert await attacker.next() == p.PONG
    # No fake server can answer a connect: the real one does.
    async with connect(CLUSTER, "victim", port=server.port) as victim:
        await check_victim_works(victim)


async def test_nobody_can_write_into_another_clients_inbox_or_read_from_it(server: Running) -> None:
    async with connect(CLUSTER, "victim", port=server.port) as victim:
        async with victim.subscribe("orders", start_at=StartPosition.FIRST, manual_ack=True) as sub:
            record = next(server.core.engine.subscription(s) for s in server.core.engine.subscriptions())
            assert record is not None
            hb_inbox = server.stan.clients.get("victim").record.hb_inbox  # type: ignore[union-attr]
            attacker = await RawClient.open(server.port)
            await attacker.send(b"SUB %s 1\r\nSUB %s 2\r\nPING\r\n" % (record.inbox.encode(), hb_inbox.encode()))
            assert await attacker.next() == p.PONG
            forged = pb.MsgProto(sequence=999999, subject="orders", data=b"forged")
            await attacker.send(p.encode_pub(record.inbox, "", forged.SerializeToString()) + b"PING\r\n")
            err = await attacker.next()
            assert isinstance(err, p.Err) and err.text.startswith("Permissions Violation for Publish")
            await victim.publish("orders", b"real")
            msg = await sub.next_msg()
            assert (msg.seq, msg.data) == (1, b"real")
            msg.ack()
            with trio.move_on_after(0.3):
                extra = await sub.next_msg()
                pytest.fail(f"the victim got {extra.data!r}")
            copies = [e for e in await drain(attacker) if isinstance(e, p.Msg)]
            assert not copies, "the attacker got the victim's deliveries or heartbeats"


async def test_requests_for_another_client_are_refused(server: Running) -> None:
    async with connect(CLUSTER, "victim", port=server.port) as victim:
        await victim.open_subscription("orders", durable="keep", manual_ack=True)
        record = next(server.core.engine.subscription(s) for s in server.core.engine.subscriptions())
        assert record is not None
        attacker = await RawClient.open(server.port)
        close = pb.CloseResponse.FromString(
            await request(attacker, f"_STAN.close.{CLUSTER}", pb.CloseRequest(clientID="victim").SerializeToString())
        )
        assert close.error == "stan: unknown clientID"
        unsub = pb.UnsubscribeRequest(clientID="victim", subject="orders", inbox=record.ack_inbox, durableName="keep")
        answer = pb.SubscriptionResponse.FromString(
            await request(attacker, f"_STAN.unsub.{CLUSTER}", unsub.SerializeToString())
        )
        assert answer.error
        sub = pb.SubscriptionRequest(
            clientID="victim", subject="orders", inbox="_INBOX.steal", maxInFlight=10, ackWaitInSecs=30
        )
        answer = pb.SubscriptionResponse.FromString(
            await request(attacker, f"_STAN.sub.{CLUSTER}", sub.SerializeToString())
        )
        assert answer.error == "stan: unknown clientID"
        publish = pb.PubMsg(clientID="victim", guid="g1", subject="orders", data=b"as the victim")
        ack = pb.PubAck.FromString(await request(attacker, f"_STAN.pub.{CLUSTER}.orders", publish.SerializeToString()))
        assert ack.error == "stan: invalid publish request"
        info = server.store.channel_info("orders")
        assert info is not None and info.msgs == 0, "a publish under the victim's client ID was stored"
        assert server.core.engine.subscription(record.sub_id) is not None, "the durable was unsubscribed"
        await check_victim_works(victim, "other")


async def test_a_client_that_reconnects_on_a_new_connection_is_itself_again(server: Running) -> None:
    """The binding follows the client: its old connection closing and a new one carrying its connID."""
    async with connect(CLUSTER, "mover", port=server.port, reconnect_wait_s=0.05) as mover:
        await mover.publish("moves", b"before")
        first = server.stan.clients.get("mover")
        assert first is not None and first.conn
        old_conn = first.conn
        await server.broker._conns[old_conn].stream.aclose()  # the network drops it
        with trio.fail_after(10):
            await mover.publish("moves", b"after")
        assert first.conn not in (0, old_conn)
        await check_victim_works(mover, "moves.check")


async def test_acks_from_another_connection_are_not_taken(server: Running) -> None:
    async with (
        connect(CLUSTER, "victim", port=server.port) as victim,
        victim.subscribe("orders", start_at=StartPosition.FIRST, manual_ack=True, ack_wait=0.4) as sub,
    ):
        await victim.publish("orders", b"m1")
        first = await sub.next_msg()
        attacker = await RawClient.open(server.port)
        forged = pb.Ack(subject="orders", sequence=first.seq).SerializeToString()
        await attacker.send(p.encode_pub(sub.ack_inbox, "", forged) * 3 + b"PING\r\n")  # a run, too
        assert await attacker.next() == p.PONG
        with trio.fail_after(3):
            again = await sub.next_msg()  # AckWait passed: the attacker's ack was not taken
        assert (again.seq, again.redelivered) == (first.seq, True)
        again.ack()


@node
def test_nats_py_subscribed_to_everything_sees_nothing_of_a_node_stan_client() -> None:
    """A real client as the attacker (nats-py: `>` and `_STAN.>`), a real STAN client as the victim."""

    async def scenario(port: int) -> None:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(f"nats://127.0.0.1:{port}", error_cb=on_error, allow_reconnect=False)
        try:
            everything = await nc.subscribe(">")
            await nc.subscribe("_STAN.>")
            await nc.flush()
            victim = await asyncio.to_thread(run_node, "publish", port, "victim.channel")
            assert victim["published"] == 20, "the victim's publishes were all acknowledged"
            await nc.flush()
            await asyncio.sleep(0.2)
            assert everything.pending_msgs == 0, "the attacker saw the victim's traffic"
            assert any("permissions violation for subscription" in e.lower() for e in errors), errors
        finally:
            await nc.close()

    with server_process("--store", "memory") as server:
        asyncio.run(scenario(server.port))
