"""Bayeux over a WebSocket with a hand-made client (trio-websocket): batches in connect replies as over
long-polling, frames reaching the log in the order sent, a session that outlives its socket (back over
a new socket or by long-polling), the Origin check of the upgrade, and bad frames."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected

from streaming.running import Running
from tests.bayeux.harness import bayeux_config, publish_over_http, raw_client, raw_socket
from tests.support.servers import eventually, running

pytestmark = pytest.mark.slow


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Running]:
    async with running(bayeux_config(tmp_path / "data", http_api_allow_origins=["https://app.example"])) as srv:
        yield srv


def pending(server: Running, channel: str) -> int:
    return sum(v.pending_count for v in server.core.engine.views() if v.record.channel == channel)


async def test_deliveries_come_in_connect_replies_that_close_batches_and_acks_reach_the_engine(server: Running) -> None:
    async with raw_socket(server.http_api_port) as sock:
        hello = await sock.handshake()
        assert hello["supportedConnectionTypes"][0] == "websocket" and hello["ext"] == {"ack": True}
        assert (await sock.connect(0, now=True))["ext"] == {"ack": 1}
        assert (await sock.subscribe("/ws/a"))["successful"]
        assert server.bayeux is not None and server.bayeux.statistics().websockets == 1
        await sock.send([{"id": "held", "channel": "/meta/connect", "clientId": sock.client_id, "ext": {"ack": 1}}])
        await publish_over_http(server.http_api_port, "/ws/a", [{"n": 1}, {"n": 2}])
        got: list[dict[str, object]] = []
        while len(got) < 2:
            frame = await sock.read()
            *deliveries, reply = frame
            assert reply["channel"] == "/meta/connect", "deliveries go only in connect replies"
            got += deliveries
            await sock.send(
                [{"id": sock.next_id(), "channel": "/meta/connect", "clientId": sock.client_id, "ext": reply["ext"]}]
            )
        assert [d["data"] for d in got] == [{"n": 1}, {"n": 2}]
        await eventually(lambda: pending(server, "ws.a") == 0)
    await eventually(lambda: server.bayeux is not None and server.bayeux.statistics().websockets == 0)
    assert server.bayeux.statistics().held_connects == 0


async def test_frames_sent_without_waiting_are_stored_in_the_order_sent(server: Running) -> None:
    async with raw_socket(server.http_api_port) as sock:
        await sock.handshake()
        ids = []
        for i in range(300):
            msg_id = sock.next_id()
            ids.append(msg_id)
            await sock.send([{"id": msg_id, "channel": "/ws/order", "data": i, "clientId": sock.client_id}])
        for msg_id in ids:
            assert (await sock.reply(msg_id))["successful"]
    stored = server.store.read("ws.order", 1, 300)
    assert [json.loads(m.data) for m in stored] == list(range(300))


async def test_a_session_outlives_its_socket_and_unacknowledged_messages_go_first_over_long_polling(
    server: Running,
) -> None:
    async with raw_socket(server.http_api_port) as sock:
        await sock.handshake()
        await sock.connect(0, now=True)
        await sock.subscribe("/ws/keep")
        await publish_over_http(server.http_api_port, "/ws/keep", ["one", "two"])
        await sock.connect(1)  # carries both; the socket closes before they are acknowledged
        assert [d["data"] for d in sock.deliveries] == ["one", "two"]
        client_id = sock.client_id
    await publish_over_http(server.http_api_port, "/ws/keep", ["three"])
    async with raw_client(server.http_api_port) as poll:
        poll.client_id = client_id
        deliveries, reply = await poll.connect(1)
        assert reply["successful"], "the session is kept within maxInterval"
        assert [d["data"] for d in deliveries] == ["one", "two", "three"], "unacknowledged first, then new"
        await poll.connect(reply["ext"]["ack"], now=True)
    await eventually(lambda: pending(server, "ws.keep") == 0)


async def test_a_client_back_over_a_new_socket_keeps_its_session(server: Running) -> None:
    async with raw_socket(server.http_api_port) as sock:
        await sock.handshake()
        await sock.connect(0, now=True)
        await sock.subscribe("/ws/back")
        client_id = sock.client_id
    await publish_over_http(server.http_api_port, "/ws/back", ["while away"])
    async with raw_socket(server.http_api_port) as again:
        again.client_id = client_id
        reply = await again.connect(1)
        assert reply["successful"] and [d["data"] for d in again.deliveries] == ["while away"]


@pytest.mark.parametrize(
    ("origins", "origin", "accepted"),
    [
        (["https://app.example"], "https://app.example", True),
        (["https://app.example"], "https://evil.example", False),
        (["https://app.example"], "null", False),
        (["https://app.example"], None, True),  # no Origin: not a browser
        ([], "https://app.example", False),
        ([], "http://127.0.0.1:{port}", True),  # the listener's own origin
        (["*"], "https://evil.example", True),
    ],
)
async def test_an_upgrade_from_an_origin_not_allowed_is_refused_with_403(
    tmp_path: Path, origins: list[str], origin: str | None, accepted: bool
) -> None:
    async with running(bayeux_config(tmp_path / "data", http_api_allow_origins=origins)) as server:
        port = server.http_api_port
        origin = origin.format(port=port) if origin else origin
        if accepted:
            async with raw_socket(port, origin=origin) as sock:
                assert (await sock.handshake())["successful"]
        else:
            with pytest.raises(ConnectionRejected) as refused:
                async with raw_socket(port, origin=origin):
                    pass
            assert refused.value.status_code == 403
            async with raw_socket(port) as sock:  # others keep working
                assert (await sock.handshake())["successful"]


async def test_a_frame_that_is_not_bayeux_closes_that_socket_with_a_reason_and_others_keep_working(
    server: Running,
) -> None:
    async with raw_socket(server.http_api_port) as good, raw_socket(server.http_api_port) as bad:
        await good.handshake()
        await bad.ws.send_message("{not json")
        with pytest.raises(ConnectionClosed) as closed:
            await bad.ws.get_message()
        assert closed.value.reason is not None
        assert closed.value.reason.code == 1007 and "not JSON" in (closed.value.reason.reason or "")
        assert (await good.call({"channel": "/ws/fine", "data": 1}))["successful"]


async def test_a_frame_over_the_size_limit_closes_that_socket(tmp_path: Path) -> None:
    async with running(bayeux_config(tmp_path / "data", http_api_max_body=4096)) as server:
        async with raw_socket(server.http_api_port) as sock:
            await sock.handshake()
            await sock.ws.send_message(json.dumps([{"channel": "/ws/big", "data": "x" * 8192}]))
            with pytest.raises(ConnectionClosed) as closed:
                await sock.ws.get_message()
            assert closed.value.reason is not None and closed.value.reason.code == 1009
        async with raw_socket(server.http_api_port) as other:
            assert (await other.handshake())["successful"]


async def test_a_held_connect_ends_with_its_socket_and_the_metrics_count_sockets(tmp_path: Path) -> None:
    async with (
        running(bayeux_config(tmp_path / "data", http_port=-1)) as server,
        raw_socket(server.http_api_port) as sock,
    ):
        await sock.handshake()
        await sock.connect(0, now=True)
        await sock.send([{"id": "h", "channel": "/meta/connect", "clientId": sock.client_id, "ext": {"ack": 1}}])
        assert server.bayeux is not None
        await eventually(lambda: server.bayeux is not None and server.bayeux.statistics().held_connects == 1)
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"http://127.0.0.1:{server.http_port}/metrics")).text
        assert "streaming_bayeux_websockets 1.0" in metrics
    await eventually(lambda: server.bayeux is not None and server.bayeux.statistics().held_connects == 0)
    assert server.bayeux.statistics().sessions == 1, "kept until maxInterval passes"


async def test_an_upgrade_needs_the_credentials_any_request_needs(tmp_path: Path) -> None:
    cfg = bayeux_config(tmp_path / "data", user="alice", password="s3cret")
    async with running(cfg) as server:
        with pytest.raises(ConnectionRejected) as refused:
            async with raw_socket(server.http_api_port):
                pass
        assert refused.value.status_code == 403
        basic = "Basic " + base64.b64encode(b"alice:s3cret").decode()
        async with raw_socket(server.http_api_port, headers=[("Authorization", basic)]) as sock:
            assert (await sock.handshake())["successful"]


@pytest.mark.parametrize("compression", [False, True])
async def test_permessage_deflate_is_accepted_only_when_configured(tmp_path: Path, compression: bool) -> None:
    cfg = bayeux_config(tmp_path / "data", http_api_ws_compression=compression)
    async with running(cfg) as server, trio.open_nursery():
        stream = await trio.open_tcp_stream("127.0.0.1", server.http_api_port)
        async with stream:
            await stream.send_all(
                b"GET /cometd HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n"
            )
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive_some(4096)
        assert head.startswith(b"HTTP/1.1 101")
        assert (b"permessage-deflate" in head.lower()) is compression
