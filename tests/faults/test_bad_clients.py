"""Clients that misbehave, from outside: one that never says CONNECT, one that stops reading, names the
store cannot take, a flood of connections past the descriptor limit, half-sent large messages. Each
gets a clear answer or is cut off; everyone else keeps working; nothing is left behind."""

from __future__ import annotations

import resource
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest
import trio

from streaming.client import StanError, connect
from streaming.wire import nats as p
from streaming.wire.stan_pb import protocol_pb2 as pb
from tests.support.servers import RawClient, ServerProcess, config, eventually, running

CID = "test-cluster"
ROOT = Path(__file__).resolve().parents[2]


async def test_a_connection_that_never_sends_connect_is_closed() -> None:
    async with running(config(connect_timeout=0.3)) as server:
        silent = await RawClient.open(server.port, connect=b"")
        talking = await RawClient.open(server.port)
        with trio.fail_after(3):
            assert await silent.until_closed() == [p.Err("Authentication Timeout")]
        await talking.send(b"PING\r\n")
        assert await talking.next() == p.PONG  # past its timeout too, it said CONNECT: it stays


async def test_names_the_store_cannot_take_are_refused_up_front() -> None:
    async with running(config()) as server:
        with pytest.raises(StanError, match="stan: invalid clientID: longer than 255 bytes"):
            async with connect(CID, "c" * 600, port=server.port):
                pass
        async with connect(CID, "ok", port=server.port) as sc:
            with pytest.raises(StanError, match="stan: invalid publish request"):
                await sc.publish("x" * 600, b"data")
            with pytest.raises(StanError, match="stan: invalid subject: channel names are limited to 255 bytes"):
                async with sc.subscribe("y" * 600):
                    pass
            await sc.publish("fine", b"the connection still works")


async def _stuck_queue_member(port: int, channel: str, group: str) -> RawClient:
    """A STAN client, by hand on a raw socket, that joins a queue group and then never reads again."""
    raw = await RawClient.open(port)
    hb, inbox, reply = "_INBOX.stuck.hb", "_INBOX.stuck.msgs", "_INBOX.stuck.reply"
    await raw.send(f"SUB {hb} 1\r\nSUB {inbox} 2\r\nSUB {reply} 3\r\n".encode())

    async def call(subject: str, request: bytes) -> bytes:
        await raw.send(f"PUB {subject} {reply} {len(request)}\r\n".encode() + request + b"\r\n")
        while True:
            event = await raw.next()
            if isinstance(event, p.Msg) and event.subject == reply:
                return event.payload

    connected = pb.ConnectResponse.FromString(
        await call(
            f"_STAN.discover.{CID}",
            pb.ConnectRequest(clientID="stuck", heartbeatInbox=hb, protocol=1, connID=b"stuck").SerializeToString(),
        )
    )
    subscribed = pb.SubscriptionResponse.FromString(
        await call(
            connected.subRequests,
            pb.SubscriptionRequest(
                clientID="stuck", subject=channel, qGroup=group, inbox=inbox, maxInFlight=1000, ackWaitInSecs=-500
            ).SerializeToString(),
        )
    )
    assert not subscribed.error
    return raw


async def test_a_queue_member_that_stops_reading_does_not_keep_its_messages() -> None:
    """It is cut off as a slow consumer (a write to it blocks past the write deadline); its heartbeat
    inbox went with the connection, so it is found
    dead within hb_timeout (not after hb_fail_count heartbeats 30 s apart), and what it held goes to
    the other member when its AckWait (0.5 s) ends. The other member holds more unacknowledged
    messages (for a minute): a member not known to be dead, holding the fewest, would get its own
    messages back every AckWait."""
    cfg = config(write_deadline=1.0, hb_interval=30.0, hb_timeout=0.5, hb_fail_count=10)
    async with running(cfg) as server, connect(CID, "worker", port=server.port) as sc:
        async with sc.subscribe("jobs", queue="workers", manual_ack=True, ack_wait=60, max_inflight=5000) as healthy:
            for i in range(1000):  # held, unacknowledged, by the healthy member
                await sc.publish_async("jobs", b"small %d" % i)
            await sc.wait_pub_acks()
            held = [await healthy.next_msg() for _ in range(1000)]
            stuck = await _stuck_queue_member(server.port, "jobs", "workers")
            for i in range(200):  # the stuck member, holding none, gets these: more than socket buffers hold
                await sc.publish_async("jobs", b"%d:" % i + b"j" * 65536)
            await sc.wait_pub_acks()
            await eventually(lambda: server.broker.statistics().slow_consumers == 1)
            large: set[int] = set()
            with trio.fail_after(10):
                while len(large) < 200:
                    msg = await healthy.next_msg()
                    if not msg.data.startswith(b"small"):
                        large.add(int(msg.data.split(b":")[0]))
                    msg.ack()
            for msg in held:
                msg.ack()
            await stuck.aclose()


def _child_server(*args: str, nofile: int | None = None) -> ServerProcess:
    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return ServerProcess(["-p", "0", "--store", "memory", *args], preexec=limit).start()


def test_out_of_descriptors_is_said_once_and_the_open_connections_are_served() -> None:
    server = _child_server(nofile=64)
    sockets: list[socket.socket] = []
    try:
        first = socket.create_connection(("127.0.0.1", server.port))
        first.recv(4096)
        first.sendall(b"CONNECT {}\r\n")
        for _ in range(120):  # past the limit: the rest wait in the listen backlog
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sockets.append(s)
        time.sleep(1.5)
        first.sendall(b"PING\r\n")
        assert b"PONG" in first.recv(4096), "an open connection is served while accept() fails"
        refusals = [line for line in server.log if "cannot accept connections" in line]
        assert len(refusals) == 1, server.log[-20:]
        assert "Traceback" not in "\n".join(server.log)
        for s in sockets:
            s.close()
        sockets.clear()
        late = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sockets.append(late)
        assert late.recv(4096).startswith(b"INFO "), "accepting again once descriptors are free"
    finally:
        for s in sockets:
            s.close()
        server.stop()
    assert any("accepting connections again" in line for line in server.log)


def test_half_sent_large_messages_leave_no_memory_behind() -> None:
    server = _child_server()
    assert server.proc is not None
    proc = psutil.Process(server.proc.pid)
    try:
        time.sleep(0.5)
        before = proc.memory_info().rss
        sockets = []
        for _ in range(100):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.recv(4096)
            s.sendall(b"CONNECT {}\r\nPUB big 1000000\r\n" + b"a" * 900_000)  # and never the rest
            sockets.append(s)
        time.sleep(1.5)
        during = proc.memory_info().rss
        for s in sockets:
            s.close()
        time.sleep(1.5)
        after = proc.memory_info().rss
    finally:
        server.stop()
    assert during - before > 60 << 20, "the test holds the buffers it means to hold"
    assert after - before < 4 << 20, f"{(after - before) >> 20} MiB still held after the connections closed"


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("RLIMIT_NOFILE and RSS readings as on Linux")
