"""The real CometD JavaScript client (cometd 9 + cometd-nodejs-client 2 under Node, AckExtension
registered) against the Bayeux door, through a loopback proxy that drops connections and swallows
chosen responses: the acknowledged, ordered delivery the ack extension promises, on the durable log."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from streaming.bayeux import protocol as bx
from streaming.running import Running
from tests.bayeux.harness import (
    MAX_INTERVAL_S,
    NODE_DIR,
    TIMEOUT_S,
    Cometd,
    Message,
    Proxy,
    bayeux_config,
    is_message,
    node,
    publish_over_http,
    raw_client,
)
from tests.support.servers import eventually, running

pytestmark = [node, pytest.mark.slow]


@attrs.define
class Rig:
    server: Running
    proxy: Proxy

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}/cometd"

    @property
    def direct_port(self) -> int:
        return self.server.http_api_port


@pytest.fixture
async def rig(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    overrides: dict[str, Any] = getattr(request, "param", {})
    async with running(bayeux_config(tmp_path / "data", **overrides)) as server, trio.open_nursery() as nursery:
        proxy = Proxy(server.http_api_port)
        await nursery.start(proxy.run)
        yield Rig(server, proxy)
        nursery.cancel_scope.cancel()


def seq_of(event: Message) -> int:
    """The engine sequence of a delivery, from the id the door gives it (`<sub>x<seq>`)."""
    return int(str(event["id"]).rsplit("x", 1)[1])


def connect_replies(client: Cometd) -> list[Message]:
    return [m for m in client.wire("in", "/meta/connect") if m.get("successful")]


async def publish_direct(rig: Rig, channel: str, datas: list[Any]) -> None:
    """Publish from a second Bayeux client that does not go through the proxy."""
    await publish_over_http(rig.direct_port, channel, datas)


async def test_the_handshake_negotiates_acks_and_the_first_connect_is_answered_at_once(rig: Rig) -> None:
    async with Cometd.start(rig.url) as client:
        reply = await client.handshaken()
        (request,) = client.wire("out", "/meta/handshake")
        assert request["ext"]["ack"] is True
        assert reply["clientId"].isalnum() and len(reply["clientId"]) >= 32
        assert reply["version"] == "1.0" and "long-polling" in reply["supportedConnectionTypes"]
        assert reply["advice"] == {"reconnect": "retry", "interval": 0, "timeout": int(TIMEOUT_S * 1000)}
        assert reply["ext"] == {"ack": True}
        first = await client.wait_for(lambda e: e["ev"] == "connect")
        connect_out = client.wire("out", "/meta/connect")[0]
        assert connect_out["advice"]["timeout"] == 0 and connect_out["ext"]["ack"] == 0
        assert first["message"]["successful"] and first["message"]["ext"] == {"ack": 1}
        handshake_at = next(e["_t"] for e in client.events if e["ev"] == "handshake")
        assert first["_t"] - handshake_at < 0.5 * TIMEOUT_S


async def test_a_client_without_acks_gets_no_batch_numbers(rig: Rig) -> None:
    async with Cometd.start(rig.url, ack=False, subscribe=["/plain/a"]) as client:
        reply = await client.handshaken()
        assert "ack" not in reply.get("ext", {})
        await client.subscribed("/plain/a")
        await publish_direct(rig, "/plain/a", [1, 2])
        await client.wait_count(is_message, 2)
        await client.wait_count(lambda e: e["ev"] == "connect", 3)
        assert client.received() == [1, 2]
        assert all("ack" not in m.get("ext", {}) for m in client.wire("in", "/meta/connect"))
        for body in rig.proxy.responses():
            if any(m.get("data") in (1, 2) for m in body):
                assert body[-1]["channel"] == "/meta/connect", "deliveries come only in connect replies"


async def test_long_polls_are_held_and_batch_numbers_count_up_by_one(rig: Rig) -> None:
    async with Cometd.start(rig.url) as client:
        await client.handshaken()
        events = await client.wait_count(lambda e: e["ev"] == "connect", 3, within=3 * TIMEOUT_S + 5)
        held = events[2]["_t"] - events[1]["_t"]
        assert 0.8 * TIMEOUT_S <= held <= 1.2 * TIMEOUT_S + 0.3
        batches = [m["ext"]["ack"] for m in connect_replies(client)]
        assert batches == list(range(1, len(batches) + 1))
        requests = [m["ext"]["ack"] for m in client.wire("out", "/meta/connect")]
        assert requests[: len(batches)] == [0, *batches[:-1]], "each connect acknowledges the reply before it"


async def test_subscribers_get_messages_in_connect_replies_deliveries_first(rig: Rig) -> None:
    async with Cometd.start(rig.url, subscribe=["/chat/a"]) as sub, Cometd.start(rig.url) as pub:
        await sub.subscribed("/chat/a")
        await pub.handshaken()
        await pub.send("publish", channel="/chat/a", data={"n": 1})
        published = await pub.wait_for(lambda e: e["ev"] == "published")
        assert published["successful"]
        await sub.wait_for(is_message)
        assert sub.received("/chat/a") == [{"n": 1}]
        (reply,) = [m for m in pub.wire("in", "/chat/a") if "successful" in m]
        assert set(reply) == {"id", "channel", "successful"}
        carrying = [body for body in rig.proxy.responses() if any(m.get("data") == {"n": 1} for m in body)]
        assert len(carrying) == 1
        (body,) = carrying
        assert [m["channel"] for m in body] == ["/chat/a", "/meta/connect"]
        assert "clientId" not in body[0], "deliveries never carry the publisher's clientId"


async def test_a_nak_extension_gives_a_message_back_for_its_delay_and_the_rest_flows(rig: Rig) -> None:
    """The page-side extension docs/bayeux.md shows, used from the message listener: the nak rides on the
    connect that acknowledges its batch, the rest of the batch is acknowledged, and the message comes
    again once its delay is over."""
    async with Cometd.start(rig.url, subscribe=["/retry/a"], nak={"data": "first", "delay": 1.0}) as sub:
        await sub.subscribed("/retry/a")
        await publish_direct(rig, "/retry/a", ["first", "second"])
        got = await sub.wait_count(is_message, 2)
        carrying = await sub.wait_for(lambda e: e["ev"] == "out" and "nak" in e["message"].get("ext", {}))
        assert carrying["message"]["ext"]["nak"] == [{"id": got[0]["id"], "delay": 1.0}]
        assert isinstance(carrying["message"]["ext"]["ack"], int), "the ack extension still acknowledges"
        taken = await sub.wait_for(lambda e: e["ev"] == "connect" and "nak" in e["message"].get("ext", {}))
        assert taken["message"]["ext"]["nak"] == 1
        await publish_direct(rig, "/retry/a", ["third"])
        again = await sub.wait_count(is_message, 4)
        assert again[-1]["data"] == "first" and seq_of(again[-1]) == seq_of(got[0])
        assert again[-1]["_t"] - carrying["_t"] >= 1.0 - 0.05, "not back before its delay"
        assert sub.received("/retry/a") == ["first", "second", "third", "first"]
        await eventually(lambda: sum(v.pending_count for v in rig.server.core.engine.views()) == 0)


async def test_a_publisher_that_subscribes_gets_its_own_messages(rig: Rig) -> None:
    async with Cometd.start(rig.url, subscribe=["/chat/own"]) as client:
        await client.subscribed("/chat/own")
        await client.send("publish", channel="/chat/own", data="mine")
        await client.wait_for(is_message)
        assert client.received() == ["mine"]


async def test_two_publishers_interleaved_arrive_in_the_engines_order(rig: Rig) -> None:
    async with (
        Cometd.start(rig.url, subscribe=["/order/x"]) as sub,
        Cometd.start(rig.url) as a,
        Cometd.start(rig.url) as b,
    ):
        await sub.subscribed("/order/x")
        await a.handshaken()
        await b.handshaken()
        for i in range(50):
            await a.send("publish", channel="/order/x", data={"from": "a", "i": i})
            await b.send("publish", channel="/order/x", data={"from": "b", "i": i})
        await a.wait_count(lambda e: e["ev"] == "published", 50)
        await b.wait_count(lambda e: e["ev"] == "published", 50)
        got = await sub.wait_count(is_message, 100)
        assert [seq_of(e) for e in got] == list(range(1, 101)), "gaps, duplicates or out of order"
        stored = rig.server.store.read("order.x", 1, 100)
        assert [e["data"] for e in got] == [json.loads(m.data) for m in stored]
        for who in ("a", "b"):
            assert [d["i"] for d in (e["data"] for e in got) if d["from"] == who] == list(range(50))


async def test_acknowledged_batches_are_never_sent_again_and_the_engine_has_them_acked(rig: Rig) -> None:
    async with Cometd.start(rig.url, subscribe=["/trim/a"]) as sub:
        await sub.subscribed("/trim/a")
        for round_ in range(3):
            await publish_direct(rig, "/trim/a", [f"r{round_}-{i}" for i in range(5)])
            await sub.wait_count(is_message, 5 * (round_ + 1))
        await sub.wait_count(lambda e: e["ev"] == "out" and e["message"]["channel"] == "/meta/connect", 5)
        bodies = rig.proxy.responses()
        sent_in: dict[str, int] = {}  # message id -> the batch of the reply that carried it first
        for body in bodies:
            if body[-1].get("channel") == "/meta/connect" and "ext" in body[-1]:
                for m in body[:-1]:
                    sent_in.setdefault(m["id"], body[-1]["ext"]["ack"])
        acks = [m["ext"]["ack"] for m in sub.wire("out", "/meta/connect")]
        for index, body in enumerate(bodies):
            batch = body[-1].get("ext", {}).get("ack") if body[-1].get("channel") == "/meta/connect" else None
            if batch is None:
                continue
            acked_before = max([a for a in acks if a < batch], default=0)
            for m in body[:-1]:
                assert sent_in[m["id"]] > acked_before, f"response {index} resent a message of an acknowledged batch"
        assert len(sub.received()) == 15
        views = rig.server.core.engine.views
        await eventually(lambda: not sum(v.pending_count for v in views() if v.record.channel == "trim.a"))


async def test_a_lost_connect_response_is_sent_again_first_and_seen_once(rig: Rig) -> None:
    async with Cometd.start(rig.url, subscribe=["/lost/a"]) as sub:
        await sub.subscribed("/lost/a")
        await publish_direct(rig, "/lost/a", [{"n": 1}])
        await sub.wait_for(is_message)
        rig.proxy.swallow(b'"data":{"n":2}')
        await publish_direct(rig, "/lost/a", [{"n": 2}])
        await eventually(lambda: rig.proxy.swallowed, within=10)
        swallowed_batch = json.loads(rig.proxy.swallowed[0].rsplit(b"\r\n\r\n", 1)[-1])[-1]["ext"]["ack"]
        await publish_direct(rig, "/lost/a", [{"n": 3}])
        got = await sub.wait_count(is_message, 3)
        assert [e["data"] for e in got] == [{"n": 1}, {"n": 2}, {"n": 3}], "lost, duplicated or reordered"
        retry = [m for m in sub.wire("out", "/meta/connect") if m.get("advice", {}).get("timeout") == 0][-1]
        assert retry["ext"]["ack"] == swallowed_batch - 1
        resent = [b for b in rig.proxy.responses() if any(m.get("data") == {"n": 2} for m in b)]
        assert resent and resent[0][0]["data"] == {"n": 2}, "the swallowed message goes first"
        assert resent[0][-1]["ext"]["ack"] > swallowed_batch
        await trio.sleep(0.5)
        assert len(sub.received()) == 3


async def test_a_drop_shorter_than_max_interval_keeps_the_session_and_loses_nothing(rig: Rig) -> None:
    async with Cometd.start(rig.url, subscribe=["/drop/short"]) as sub:
        first = await sub.handshaken()
        await sub.subscribed("/drop/short")
        rig.proxy.drop_for(MAX_INTERVAL_S / 2)
        await publish_direct(rig, "/drop/short", list(range(20)))
        got = await sub.wait_count(is_message, 20, within=MAX_INTERVAL_S + 10)
        assert [e["data"] for e in got] == list(range(20))
        handshakes = [e for e in sub.events if e["ev"] == "handshake" and e["message"]["successful"]]
        assert [h["message"]["clientId"] for h in handshakes] == [first["clientId"]], "no new handshake"


async def test_a_drop_longer_than_max_interval_expires_the_session_and_the_client_starts_again(rig: Rig) -> None:
    async with Cometd.start(rig.url, subscribe=["/drop/long"]) as sub:
        first = await sub.handshaken()
        await sub.subscribed("/drop/long")
        await publish_direct(rig, "/drop/long", ["before"])
        await sub.wait_for(is_message)
        rig.proxy.drop_for(MAX_INTERVAL_S + 2.5)
        await trio.sleep(0.2)
        await publish_direct(rig, "/drop/long", ["during"])
        index = len(sub.events)
        unknown = await sub.wait_for(
            lambda e: e["ev"] == "connect" and e["message"].get("error") == bx.SESSION_UNKNOWN,
            within=MAX_INTERVAL_S + 15,
            after=index,
        )
        assert unknown["message"]["advice"] == {"reconnect": "handshake", "interval": 0}
        second = await sub.handshaken(after=index)
        assert second["clientId"] != first["clientId"]
        await sub.wait_for(
            lambda e: e["ev"] == "subscribed" and e["message"]["successful"],
            after=sub.events.index(next(e for e in sub.events[index:] if e["ev"] == "handshake")),
        )
        first_connect = next(m for m in sub.wire("out", "/meta/connect") if m.get("clientId") == second["clientId"])
        assert first_connect["ext"]["ack"] == 0
        await publish_direct(rig, "/drop/long", ["after"])
        await sub.wait_count(is_message, 2)
        assert sub.received() == ["before", "after"], "what was published in the gap is not delivered"


async def test_disconnect_ends_the_session(rig: Rig) -> None:
    async with Cometd.start(rig.url, subscribe=["/bye/a"]) as client:
        hello = await client.handshaken()
        await client.subscribed("/bye/a")
        await client.wait_count(lambda e: e["ev"] == "connect", 1)
        await trio.sleep(0.3)  # a connect is held now
        await client.send("disconnect")
        done = await client.wait_for(lambda e: e["ev"] == "disconnected")
        assert done["message"]["successful"]
        released = await client.wait_for(
            lambda e: (
                e["ev"] == "in"
                and e["message"].get("channel") == "/meta/connect"
                and e["message"].get("advice", {}).get("reconnect") == "none"
            )
        )
        assert released["_t"] - done["_t"] < 0.5
    async with raw_client(rig.direct_port) as raw:
        raw.client_id = hello["clientId"]
        (reply,) = await raw.post([{"id": "1", "channel": "/bye/a", "data": 1, "clientId": hello["clientId"]}])
        assert reply["error"] == bx.SESSION_UNKNOWN


async def test_unsubscribe_stops_one_channel_and_not_the_others(rig: Rig) -> None:
    async with Cometd.start(rig.url, subscribe=["/un/a", "/un/b"]) as client:
        await client.subscribed("/un/a")
        await client.subscribed("/un/b")
        await client.send("unsubscribe", channel="/un/a")
        done = await client.wait_for(lambda e: e["ev"] == "unsubscribed")
        assert done["message"]["successful"]
        await publish_direct(rig, "/un/a", ["gone"])
        await publish_direct(rig, "/un/b", ["kept"])
        await client.wait_for(is_message)
        await trio.sleep(0.3)
        assert client.received() == ["kept"]


async def test_a_client_with_websocket_on_uses_the_socket_with_acks_and_loses_nothing_when_it_drops(rig: Rig) -> None:
    async with Cometd.start(rig.url, websocket=True, subscribe=["/ws/a"]) as client:
        first = await client.handshaken()
        await client.subscribed("/ws/a")
        await publish_direct(rig, "/ws/a", [{"n": 1}])
        await client.wait_for(is_message)
        # The frame carrying {"n": 2} is held back, then its socket drops: it never arrives.
        rig.proxy.hold()
        await publish_direct(rig, "/ws/a", [{"n": 2}])
        await trio.sleep(0.3)
        rig.proxy.drop_for(0.5)
        rig.proxy.release()
        await publish_direct(rig, "/ws/a", [{"n": 3}])
        got = await client.wait_count(is_message, 3, within=MAX_INTERVAL_S + 10)
        assert [e["data"] for e in got] == [{"n": 1}, {"n": 2}, {"n": 3}], "lost, duplicated or reordered"
        connects = client.wire("out", "/meta/connect")
        assert connects and all(m["connectionType"] == "websocket" for m in connects)
        handshakes = [e for e in client.events if e["ev"] == "handshake" and e["message"]["successful"]]
        assert [h["message"]["clientId"] for h in handshakes] == [first["clientId"]], "the session is kept"
        batches = [m["ext"]["ack"] for m in connect_replies(client)]
        assert batches == sorted(batches) and len(set(batches)) == len(batches)
        views = rig.server.core.engine.views
        await eventually(lambda: not sum(v.pending_count for v in views() if v.record.channel == "ws.a"))
        await trio.sleep(0.3)
        assert len(client.received()) == 3
        assert rig.server.bayeux is not None and rig.server.bayeux.statistics().resent_messages >= 1, "it was lost"


@pytest.mark.parametrize("rig", [{"bayeux_max_unacked": 10}], indirect=True)
@pytest.mark.parametrize("websocket", [False, True])
async def test_at_most_max_unacked_messages_wait_outside_the_log(rig: Rig, websocket: bool) -> None:
    async with Cometd.start(rig.url, subscribe=["/flow/a"], websocket=websocket) as sub:
        await sub.subscribed("/flow/a")
        await sub.wait_count(lambda e: e["ev"] == "connect", 1)
        await trio.sleep(0.2)
        rig.proxy.hold()  # replies stop reaching the client, so it acknowledges nothing
        await publish_direct(rig, "/flow/a", list(range(100)))
        await trio.sleep(0.5)
        views = [v for v in rig.server.core.engine.views() if v.record.channel == "flow.a"]
        assert len(views) == 1 and views[0].pending_count == 10 and views[0].stalled
        assert rig.server.bayeux is not None
        assert rig.server.bayeux.statistics().queued_messages <= 10
        rig.proxy.release()
        got = await sub.wait_count(is_message, 100, within=30)
        assert [e["data"] for e in got] == list(range(100))


@pytest.mark.skipif(not (NODE_DIR / "node_modules" / "node-nats-streaming").is_dir(), reason="npm ci tests/node")
async def test_a_stan_client_and_a_cometd_client_see_each_others_messages_in_order(rig: Rig) -> None:
    async with Cometd.start(rig.url, subscribe=["/mixed/chan"]) as client:
        await client.subscribed("/mixed/chan")
        for i in range(10):
            await client.send("publish", channel="/mixed/chan", data={"from": "bayeux", "i": i})
        await client.wait_count(lambda e: e["ev"] == "published", 10)
        done = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                ["node", str(NODE_DIR / "driver.js"), "exchange", str(rig.server.port), "mixed.chan"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["ok"], result
        stan_view = [(m["seq"], m["data"]) for m in result["got"]]
        assert [s for s, _ in stan_view] == list(range(1, 21))
        assert [json.loads(d) for _, d in stan_view[:10]] == [{"from": "bayeux", "i": i} for i in range(10)]
        assert [d for _, d in stan_view[10:]] == [f"stan-{i}" for i in range(10)]
        got = await client.wait_count(is_message, 20)
        assert [seq_of(e) for e in got] == list(range(1, 21))
        assert [e["data"] for e in got[10:]] == [f"stan-{i}" for i in range(10)]


@pytest.mark.parametrize("websocket", [False, True])
async def test_wildcard_channels_follow_every_channel_below_with_acks(rig: Rig, websocket: bool) -> None:
    """The CometD client on `/wild/*` (one segment below) and `/wild/**` (any depth): each message on
    its own channel, channels made after the subscription included, acknowledged by batch as on a
    plain channel (the engine holds nothing afterwards), and a STAN subscriber of `wild.>` sees the
    same messages."""
    async with Cometd.start(rig.url, subscribe=["/wild/*", "/wild/**"], websocket=websocket) as client:
        await client.subscribed("/wild/*")
        await client.subscribed("/wild/**")
        await publish_direct(rig, "/wild/a", [1])
        await publish_direct(rig, "/wild/b", [2])  # made after the subscription
        await publish_direct(rig, "/wild/b/deep", [3])  # only `**` reaches this deep
        await publish_direct(rig, "/other/a", [4])
        got = await client.wait_count(is_message, 5)
        assert sorted((e["channel"], e["data"]) for e in got) == [
            ("/wild/a", 1),
            ("/wild/a", 1),
            ("/wild/b", 2),
            ("/wild/b", 2),
            ("/wild/b/deep", 3),
        ], "each wildcard subscription delivers on the message's own channel"
        views = rig.server.core.engine.views
        await eventually(lambda: not sum(v.pending_count for v in views() if v.record.channel.startswith("wild.")))
        await trio.sleep(0.3)
        assert len(client.received()) == 5
