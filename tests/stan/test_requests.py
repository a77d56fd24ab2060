"""STAN requests over the wire: exact error texts, validation order, client IDs, pings."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from google.protobuf.message import Message

from streaming.client import NatsConnection, StanError, StartPosition, connect
from streaming.client.nats_conn import NatsMsg, new_inbox
from streaming.running import Running
from streaming.wire.stan_pb import protocol_pb2 as pb
from tests.support.servers import config, eventually, running

CID = "test-cluster"


@asynccontextmanager
async def nats(server: Running) -> AsyncIterator[NatsConnection]:
    async with trio.open_nursery() as nursery:
        conn = NatsConnection("127.0.0.1", server.port)
        await nursery.start(conn.run)
        try:
            yield conn
        finally:
            await conn.close()


async def request(conn: NatsConnection, subject: str, payload: bytes) -> bytes:
    with trio.fail_after(5):
        return await conn.request(subject, payload)


async def stan_connect(conn: NatsConnection, client_id: str, hb_inbox: str = "", conn_id: bytes = b"c1") -> str:
    req = pb.ConnectRequest(
        clientID=client_id,
        heartbeatInbox=hb_inbox or new_inbox(),
        protocol=1,
        connID=conn_id,
        pingInterval=5,
        pingMaxOut=3,
    )
    return pb.ConnectResponse.FromString(await request(conn, f"_STAN.discover.{CID}", req.SerializeToString())).error


async def test_garbage_on_every_stan_subject_gets_the_request_specific_error() -> None:
    async with running(config()) as server, nats(server) as conn:
        assert await stan_connect(conn, "me") == ""
        cases: list[tuple[str, type[Message], str]] = [
            (f"_STAN.discover.{CID}", pb.ConnectResponse, "stan: invalid connection request"),
            (f"_STAN.sub.{CID}", pb.SubscriptionResponse, "stan: invalid subscription request"),
            (f"_STAN.unsub.{CID}", pb.SubscriptionResponse, "stan: invalid unsubscribe request"),
            (f"_STAN.subclose.{CID}", pb.SubscriptionResponse, "stan: invalid unsubscribe request"),
            (f"_STAN.close.{CID}", pb.CloseResponse, "stan: invalid close request"),
            (f"_STAN.pub.{CID}.foo", pb.PubAck, "stan: invalid publish request"),
        ]
        for subject, kind, error in cases:
            for garbage in (b"dummy", b"\xff\xff\xff\xff", b"\x0a\x05ab"):
                reply = await request(conn, subject, garbage)
                assert getattr(kind.FromString(reply), "error") == error, (subject, garbage)  # noqa: B009
        # Pings: an undecodable ping is answered as an unknown client; the empty ping is not answered.
        reply = await request(conn, f"_STAN.discover.{CID}.pings", b"dummy")
        assert pb.PingResponse.FromString(reply).error == "client has been replaced or is no longer registered"
        # The server still serves the same connection afterwards.
        assert await stan_connect(conn, "other") == ""


@pytest.mark.parametrize(
    ("client_id", "ok"),
    [
        ("", False),
        ("with spaces", False),
        ("a:b", False),
        ("a,b", False),
        ("a.b", False),
        ("a!", False),
        ("id", True),
        ("id_with_underscores", True),
        ("id-with-hypens", True),
    ],
)
async def test_client_ids(client_id: str, ok: bool) -> None:
    async with running(config()) as server, nats(server) as conn:
        error = await stan_connect(conn, client_id)
        expected = "" if ok else "stan: invalid clientID: only alphanumeric and `-` or `_` characters allowed"
        assert error == expected


async def test_duplicate_client_id_refused_while_alive_replaced_when_dead() -> None:
    async with running(config()) as server, nats(server) as alive:
        hb = new_inbox()

        def answer(m: NatsMsg) -> None:
            if m.reply:
                alive.publish(m.reply, b"")

        alive.subscribe(hb, answer)
        await alive.flush()
        assert await stan_connect(alive, "dup", hb) == ""
        async with nats(server) as other:
            assert await stan_connect(other, "dup", conn_id=b"c2") == "stan: clientID already registered"
            # A client whose heartbeat inbox has no subscriber any more is replaced at once.
            dead_hb = new_inbox()
            assert await stan_connect(other, "ghost", dead_hb, conn_id=b"g1") == ""
            with trio.fail_after(2):
                assert await stan_connect(other, "ghost", conn_id=b"g2") == ""
            # The replaced instance's connID is no longer valid for pings.
            reply = await request(other, f"_STAN.discover.{CID}.pings", pb.Ping(connID=b"g1").SerializeToString())
            assert pb.PingResponse.FromString(reply).error == "client has been replaced or is no longer registered"
            reply = await request(other, f"_STAN.discover.{CID}.pings", pb.Ping(connID=b"g2").SerializeToString())
            assert reply == b""


async def test_subscription_request_validation_order() -> None:
    async with running(config(allow_ms_ack_wait=False)) as server, nats(server) as conn:
        assert await stan_connect(conn, "me") == ""

        async def sub_error(**fields: object) -> str:
            base: dict[str, object] = dict(
                clientID="me", subject="foo", inbox=new_inbox(), maxInFlight=1, ackWaitInSecs=1
            )
            base.update(fields)
            req = pb.SubscriptionRequest(**base)  # type: ignore[arg-type]
            return pb.SubscriptionResponse.FromString(
                await request(conn, f"_STAN.sub.{CID}", req.SerializeToString())
            ).error

        assert await sub_error(clientID="") == "stan: clientID missing"
        for wait in (0, -1):
            assert await sub_error(ackWaitInSecs=wait) == "stan: invalid ack wait time, should be >= 1s"
        for inflight in (0, -1):
            assert await sub_error(maxInFlight=inflight) == "stan: invalid MaxInflight, should be >= 1"
        for subject in ("foo*.bar", "foo.bar*", "foo.>.*", "foo..bar", ""):
            assert await sub_error(subject=subject) == "stan: invalid subject"
        assert await sub_error(qGroup="g", durableName="dur:name") == (
            "stan: durable name of a durable queue subscriber can't contain the character ':'"
        )
        assert await sub_error(clientID="nobody") == "stan: unknown clientID"
        # The order: with several faults, the first in spec order wins.
        assert await sub_error(clientID="", ackWaitInSecs=0, maxInFlight=0) == "stan: clientID missing"
        assert await sub_error(ackWaitInSecs=0, maxInFlight=0, subject="a*") == (
            "stan: invalid ack wait time, should be >= 1s"
        )
        assert await sub_error() == ""


async def test_invalid_start_position_is_refused() -> None:
    # Enum values outside 0..4 can only be sent by writing the varint by hand (field 10).
    async with running(config()) as server, nats(server) as conn:
        assert await stan_connect(conn, "me") == ""
        good = pb.SubscriptionRequest(clientID="me", subject="foo", inbox=new_inbox(), maxInFlight=1, ackWaitInSecs=1)
        for value in (b"\x05", b"\xff\xff\xff\xff\x0f"):  # 5 and -1
            raw = good.SerializeToString() + b"\x50" + value
            reply = pb.SubscriptionResponse.FromString(await request(conn, f"_STAN.sub.{CID}", raw))
            assert reply.error == "stan: invalid start position"


async def test_unsubscribe_errors_and_close_by_delivery_inbox() -> None:
    async with running(config()) as server, connect(CID, "me", port=server.port) as sc:
        sub = await sc.open_subscription("foo")
        conn = sc.nats  # requests naming a client are honoured on its own connection only

        async def unsub(nats_subject: str, **fields: str) -> str:
            base = dict(clientID="me", subject="foo", inbox=sub.ack_inbox)
            base.update(fields)
            raw = pb.UnsubscribeRequest(**base).SerializeToString()
            return pb.SubscriptionResponse.FromString(await request(conn, nats_subject, raw)).error

        assert await unsub(f"_STAN.unsub.{CID}", subject="nochannel") == "stan: unknown channel"
        assert await unsub(f"_STAN.unsub.{CID}", inbox="_INBOX.wrong") == "stan: invalid subscription"
        assert await unsub(f"_STAN.unsub.{CID}", clientID="other") == "stan: unknown clientID"
        assert await unsub(f"_STAN.unsub.{CID}", inbox="") == "stan: invalid unsubscribe request"
        # stan.go after a subscribe timeout closes by the delivery inbox instead of the ack inbox.
        assert await unsub(f"_STAN.subclose.{CID}", inbox=sub.inbox) == ""
        assert await unsub(f"_STAN.unsub.{CID}") == "stan: invalid subscription"


async def test_publish_from_unknown_client_and_bad_channels() -> None:
    async with running(config()) as server, nats(server) as conn:
        assert await stan_connect(conn, "me", conn_id=b"known") == ""

        async def pub_error(**fields: object) -> str:
            base: dict[str, object] = dict(clientID="me", guid="g1", subject="foo", data=b"x")
            base.update(fields)
            raw = pb.PubMsg(**base).SerializeToString()  # type: ignore[arg-type]
            return pb.PubAck.FromString(await request(conn, f"_STAN.pub.{CID}.foo", raw)).error

        # It registered a connID: a publish under its client ID without it is not its own.
        assert await pub_error() == "stan: invalid publish request"
        assert await pub_error(connID=b"known") == ""
        assert await pub_error(clientID="stranger") == "stan: invalid publish request"
        assert await pub_error(connID=b"unknown-conn") == "stan: invalid publish request"
        assert await pub_error(guid="") == "stan: invalid publish request"
        for channel in ("", ".foo", "foo.", "foo..bar", "a/b", "foo.*", "foo.>"):
            assert await pub_error(subject=channel) == "stan: invalid publish request"


async def test_channel_limits_and_case_clash_reach_the_client() -> None:
    async with running(config(max_channels=2)) as server, connect(CID, "me", port=server.port) as sc:
        await sc.publish("Foo", b"1")
        with pytest.raises(StanError, match=re.escape('rejecting channel "foo" because channel "Foo" alreay exists')):
            await sc.publish("foo", b"1")
        with pytest.raises(StanError, match="alreay exists"):
            await sc.open_subscription("FOO")
        await sc.publish("bar", b"1")
        with pytest.raises(StanError, match=r"^too many channels$"):
            await sc.publish("baz", b"1")
        with pytest.raises(StanError, match=r"^too many channels$"):
            await sc.open_subscription("baz")
        assert sorted(c.name for c in server.store.channels()) == ["Foo", "bar"]


async def test_subscription_response_comes_before_any_message() -> None:
    async with running(config()) as server, connect(CID, "me", port=server.port) as sc:
        for _ in range(50):
            await sc.publish_async("foo", b"x")
        await sc.publish("foo", b"last")
        # Watch the raw order on the client's own connection: the response, then messages.
        order: list[str] = []
        inbox = new_inbox()
        sc.nats.subscribe(inbox, lambda m: order.append("msg"))
        mux = sc.nats._mux_prefix
        sc.nats.subscribe(mux + ".*", lambda m: order.append("response"))
        for kwargs in ({}, {"qGroup": "q"}, {"durableName": "d"}):
            order.clear()
            req = pb.SubscriptionRequest(
                clientID="me",
                subject="foo",
                inbox=inbox,
                maxInFlight=100,
                ackWaitInSecs=30,
                startPosition=pb.First,
            )
            for name, value in kwargs.items():
                setattr(req, name, value)
            with trio.fail_after(5):
                await sc.nats.request(f"_STAN.sub.{CID}", req.SerializeToString())
            await eventually(lambda: len(order) >= 52)
            assert order[0] == "response" and order.count("msg") == 51


async def test_oversized_publish_closes_only_that_connection_and_keeps_acked_data() -> None:
    async with running(config(max_payload=10_000)) as server, connect(CID, "keeper", port=server.port) as keeper:
        guids = [await keeper.publish("safe", b"%d" % i) for i in range(10)]
        async with nats(server) as raw:
            raw.publish(f"_STAN.pub.{CID}.safe", b"x" * 20_000)
            await eventually(lambda: not raw.connected or raw.last_error)
            assert raw.last_error == "Maximum Payload Violation"
        assert len(guids) == 10
        await keeper.publish("safe", b"after")
        async with keeper.subscribe("safe", start_at=StartPosition.FIRST) as sub:
            with trio.fail_after(5):
                got = [(await sub.next_msg()).data for _ in range(11)]
        assert got == [b"%d" % i for i in range(10)] + [b"after"]


async def test_heartbeats_remove_dead_clients_and_keep_live_ones() -> None:
    cfg = config(hb_interval=0.1, hb_timeout=0.1, hb_fail_count=2)
    async with running(cfg) as server, connect(CID, "alive", port=server.port) as alive, nats(server) as conn:
        silent = new_inbox()
        conn.subscribe(silent, lambda m: None)  # subscribed to its heartbeat inbox, never answers
        assert await stan_connect(conn, "mute", silent) == ""
        sub = await alive.open_subscription("foo")
        await eventually(lambda: "mute" not in server.stan.clients, within=5)
        # The dead client is gone for everything; the live one (our client answers) is untouched.
        reply = await request(
            conn,
            f"_STAN.pub.{CID}.foo",
            pb.PubMsg(clientID="mute", guid="g", subject="foo", data=b"x").SerializeToString(),
        )
        assert pb.PubAck.FromString(reply).error == "stan: invalid publish request"
        await trio.sleep(0.5)
        assert "alive" in server.stan.clients
        await alive.publish("foo", b"still here")
        with trio.fail_after(5):
            assert (await sub.next_msg()).data == b"still here"
