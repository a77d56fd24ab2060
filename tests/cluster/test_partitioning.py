"""Partitioned servers on a real three-node nats-server cluster: clients on any node reach every
channel's owner, queue groups and durables work across nodes, a channel has one owner, and a server
or a NATS node that dies takes nothing acknowledged with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest
import trio

from bench.peers import NatsNode, nats_cluster
from streaming.client import Msg, StanError, StartPosition, Subscription, connect
from streaming.client.stan import PUB_ACK_TIMEOUT
from streaming.config import ChannelConfig
from streaming.wire import nats as p
from streaming.wire.stan_pb import protocol_pb2 as pb
from tests.support.backends import on_both_backends
from tests.support.node import NODE_DIR, node, run_node
from tests.support.servers import ATTACHED, RawClient, ServerProcess, config, eventually, running, state_stored

pytestmark = pytest.mark.slow
CID = "test-cluster"


async def pending_in(http_port: int, channel: str, count: int, within: float = 10.0) -> None:
    """Wait until the server's one subscription on `channel` has `count` messages pending."""
    with trio.fail_after(within):
        async with httpx.AsyncClient() as http:
            while True:  # another process's state: polled (see tests/support/servers.py, `eventually`)
                page = (
                    await http.get(f"http://127.0.0.1:{http_port}/streaming/channelsz?channel={channel}&subs=1")
                ).json()
                if [s["pending_count"] for s in page["subscriptions"]] == [count]:
                    return
                await trio.sleep(0.005)


def partitioned(name: str, node: NatsNode, channels: list[str], data: Path) -> ServerProcess:
    """A partitioned server process attached to `node`, owning `channels`, storing in `data`."""
    conf = data.parent / f"{name}.toml"
    tables = "".join(f'[channels."{c}"]\n' for c in channels)
    conf.write_text(
        f'nats_server = "{node.url}"\npartitioning = true\nserver_name = "{name}"\ndir = "{data}"\n'
        f"http_port = -1\n{tables}"
    )
    return ServerProcess(["-c", str(conf)], ready=ATTACHED)


@contextmanager
def started(*servers: ServerProcess) -> Iterator[None]:
    try:
        for server in servers:
            server.start()
        yield
    finally:
        for server in servers:
            server.stop()


async def take(sub: Subscription, n: int, within: float = 10.0) -> list[Msg]:
    with trio.fail_after(within):
        return [await sub.next_msg() for _ in range(n)]


async def test_clients_on_any_node_reach_every_owner(tmp_path: Path) -> None:
    with nats_cluster(3) as (n0, n1, n2):
        a = partitioned("A", n0, ["orders.>", "audit"], tmp_path / "a")
        b = partitioned("B", n1, ["billing.>"], tmp_path / "b")
        with started(a, b):
            async with (
                connect(CID, "writer", port=n2.port) as writer,
                connect(CID, "reader", port=n0.port) as reader,
                connect(CID, "member1", port=n1.port) as member1,
                connect(CID, "member2", port=n2.port) as member2,
            ):
                for i in range(3):
                    await writer.publish("orders.eu", b"o%d" % i)
                    await writer.publish("billing.x", b"b%d" % i)
                    await writer.publish("audit", b"a%d" % i)
                for channel, prefix in (("orders.eu", b"o"), ("billing.x", b"b"), ("audit", b"a")):
                    async with reader.subscribe(channel, start_at=StartPosition.FIRST) as sub:
                        got = await take(sub, 3)
                        assert [(m.seq, m.data) for m in got] == [(i + 1, prefix + b"%d" % i) for i in range(3)]

                # A queue group whose members are on different nodes, on each server's channel.
                for channel in ("orders.q", "billing.q"):
                    async with (
                        member1.subscribe(channel, queue="workers", manual_ack=True) as q1,
                        member2.subscribe(channel, queue="workers", manual_ack=True) as q2,
                    ):
                        for i in range(10):
                            await writer.publish(channel, b"%d" % i)
                        await eventually(lambda q1=q1, q2=q2: q1.pending() + q2.pending() == 10, within=10)
                        one, two = await take(q1, q1.pending()), await take(q2, q2.pending())
                        assert sorted(m.seq for m in one + two) == list(range(1, 11))
                        assert one and two, "both members get work"
                        for m in one + two:
                            m.ack()

                # A durable made through one node (its client closes) ...
                async with connect(CID, "durable", port=n0.port) as sc:
                    async with sc.subscribe(
                        "billing.d", durable="d", manual_ack=True, start_at=StartPosition.FIRST, close_on_exit=True
                    ) as sub:
                        for i in range(4):
                            await writer.publish("billing.d", b"%d" % i)
                        got = await take(sub, 4)
                        got[0].ack()
                        got[1].ack()
                        await sc.nats.flush()
                # ... resumes through another node, where it stopped.
                async with connect(CID, "durable", port=n2.port) as sc:
                    async with sc.subscribe("billing.d", durable="d", manual_ack=True) as sub:
                        again = await take(sub, 2)
                        assert [(m.seq, m.redelivered) for m in again] == [(3, True), (4, True)]
                        for m in again:
                            m.ack()

                # A channel nobody owns: nobody answers.
                writer.pub_ack_timeout_s = 0.5
                with pytest.raises(StanError, match="publish ack timeout"):
                    await writer.publish("nobody", b"x")
                # Pipelined, each fails in time too, and none holds the publisher for ever.
                futures = [await writer.publish_async("nobody", b"%d" % i) for i in range(3)]
                await writer.wait_pub_acks()
                assert [f.error for f in futures] == [PUB_ACK_TIMEOUT] * 3
                with pytest.raises(StanError, match="timeout"):
                    await reader.open_subscription("nobody")

            # A client nobody on the team wrote, on other nodes.
            if (NODE_DIR / "node_modules").is_dir():
                assert run_node("publish", n2.port, "billing.node")["published"] == 20
                result = run_node("queue", n0.port, "orders.node")
                assert sorted(result["a"] + result["b"]) == list(range(1, 11))  # type: ignore[operator]


def test_a_second_owner_of_a_channel_refuses_to_start(tmp_path: Path) -> None:
    with nats_cluster(3) as (n0, n1, _):
        a = partitioned("A", n0, ["orders.>"], tmp_path / "a")
        with started(a):
            newcomer = partitioned("C", n1, ["stock", "orders.eu"], tmp_path / "c")
            with pytest.raises(RuntimeError, match="did not start"):
                newcomer.start()
            assert newcomer.proc is not None and newcomer.proc.wait(10) == 1
            text = "\n".join(newcomer.log)
            assert "orders.eu" in text and "'A'" in text and "a channel must have one owner" in text
            assert a.proc is not None and a.proc.poll() is None, "the first owner carries on"


def test_an_overlap_found_when_two_clusters_join_stops_the_newcomer(tmp_path: Path) -> None:
    """Two nodes that are not yet routed, a server on each claiming one channel; once the nodes form
    one cluster (a reload adds the route), the server that started later stops, naming the channel."""
    with nats_cluster(1) as (n0,), nats_cluster(1) as (n1,):
        a = partitioned("A", n0, ["orders.>"], tmp_path / "a")
        c = partitioned("C", n1, ["orders.eu"], tmp_path / "c")
        with started(a, c):
            route = f"nats-route://127.0.0.1:{n0.cluster_port}"
            n1.conf.write_text(n1.conf.read_text().replace("routes: []", f"routes: [{route}]"))
            assert n1.proc is not None
            n1.proc.send_signal(signal.SIGHUP)  # nats-server reloads its configuration: the route forms
            assert c.proc is not None
            assert c.proc.wait(15) == 1
            assert "orders.eu" in "\n".join(c.log)
            assert a.proc is not None and a.proc.poll() is None


async def test_a_killed_server_takes_only_its_channels_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    with nats_cluster(3) as (n0, n1, n2):
        a = partitioned("A", n0, ["orders.>"], tmp_path / "a")
        b = partitioned("B", n1, ["billing.>"], tmp_path / "b")
        with started(a, b):
            async with connect(CID, "app", port=n2.port) as sc:
                sub = await sc.open_subscription(
                    "orders.k", durable="d", manual_ack=True, ack_wait=60, start_at=StartPosition.FIRST
                )
                for i in range(1, 6):
                    await sc.publish("orders.k", b"%d" % i)
                got = await take(sub, 5)
                for m in got[:2]:
                    m.ack()
                # Through the cluster, the acks reach the owner after the client's flush: once it holds
                # them (3 pending), they are stored when nothing waits to be written.
                await pending_in(a.http_port, "orders.k", 3)
                await state_stored(a.http_port)

                a.kill()
                sc.pub_ack_timeout_s = 0.5
                with pytest.raises(StanError, match="publish ack timeout"):
                    await sc.publish("orders.k", b"lost")  # nobody owns it now: refused, not stored
                await sc.publish("billing.x", b"still served")  # the other server carries on
                sc.pub_ack_timeout_s = 10

                a.start()
                await sc.publish("orders.k", b"6")
                after = await take(sub, 4)
                assert [(m.seq, m.redelivered) for m in after] == [(3, True), (4, True), (5, True), (6, False)]
                for m in after:
                    m.ack()


@node
def test_a_dead_nats_node_sends_everyone_to_the_others(tmp_path: Path) -> None:
    """The server's node dies: it reconnects to another node it learnt from the cluster. A client of
    that node (node-nats-streaming with two URLs) fails over too, and both carry on."""
    with nats_cluster(3) as (n0, n1, n2):
        a = partitioned("A", n0, ["orders.>"], tmp_path / "a")
        with started(a):
            driver = subprocess.Popen(
                ["node", str(NODE_DIR / "driver.js"), "failover", str(n0.port), "orders.failover"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "NATS_SERVERS": f"{n0.url},{n1.url}"},
            )
            assert driver.stdout is not None and driver.stdin is not None
            try:
                first = json.loads(driver.stdout.readline())
                assert first == {"phase": "kill now"}, first
                n0.kill()
                driver.stdin.write("go\n")
                driver.stdin.flush()
                result = json.loads(driver.stdout.readline())
            finally:
                driver.kill()
                driver.wait(10)
            assert result["ok"] and result["got"] == ["before", "after"], result
            assert any("reconnected to the NATS server" in line for line in a.log)
            lost = [line for line in a.log if "lost the connection to the NATS server" in line]
            assert lost and "it closed the connection" in lost[0], "the log says why the link was lost"
            assert n2.port  # the third node stays up throughout


async def test_requests_that_overtake_their_clients_connect_wait_for_it(tmp_path: Path) -> None:
    """Partitioned, a client's first publish can reach this server before its connect is done here
    (another server answered the connect first). Sent in one write right behind the connect, it
    waits for it; a publish from a client that never connects is refused after the wait, and does
    not hold anybody else up meanwhile."""
    with nats_cluster(1) as (node_,):
        cfg = config(
            tmp_path / "data", nats_server=node_.url, partitioning=True, channels={"orders.>": ChannelConfig()}
        )
        async with running(cfg), connect(CID, "known", port=node_.port) as known:
            raw = await RawClient.open(node_.port)
            connect_request = pb.ConnectRequest(clientID="eager", heartbeatInbox="_INBOX.hb", protocol=1, connID=b"e1")
            publish = pb.PubMsg(clientID="eager", connID=b"e1", guid="g1", subject="orders.eu", data=b"x")
            stranger = pb.PubMsg(clientID="nobody", connID=b"n1", guid="g2", subject="orders.eu", data=b"y")
            await raw.send(
                b"SUB _INBOX.r.> 1\r\n"
                + p.encode_pub("_STAN.discover.test-cluster", "_INBOX.r.connect", connect_request.SerializeToString())
                + p.encode_pub("_STAN.pub.test-cluster.orders.eu", "_INBOX.r.ack1", publish.SerializeToString())
                + p.encode_pub("_STAN.pub.test-cluster.orders.eu", "_INBOX.r.ack2", stranger.SerializeToString())
            )
            answers: dict[str, bytes] = {}
            with trio.fail_after(1.5):  # well inside the 2 s the stranger's publish waits
                while len(answers) < 2:
                    event = await raw.next()
                    if isinstance(event, p.Msg):
                        answers[event.subject] = event.payload
                await known.publish("orders.eu", b"not held up")
            assert not pb.ConnectResponse.FromString(answers["_INBOX.r.connect"]).error
            assert pb.PubAck.FromString(answers["_INBOX.r.ack1"]) == pb.PubAck(guid="g1")
            with trio.fail_after(5):
                while "_INBOX.r.ack2" not in answers:
                    event = await raw.next()
                    if isinstance(event, p.Msg):
                        answers[event.subject] = event.payload
            assert pb.PubAck.FromString(answers["_INBOX.r.ack2"]).error == "stan: invalid publish request"
            await raw.aclose()


async def test_monitoring_shows_the_node_attached_to_and_the_channels_owned(tmp_path: Path) -> None:
    with nats_cluster(1) as (node_,):
        channels = {"orders.>": ChannelConfig(), "audit": ChannelConfig()}
        cfg = config(nats_server=node_.url, partitioning=True, channels=channels, server_name="A", http_port=-1)
        async with running(cfg) as server, httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
            serverz = (await http.get("/streaming/serverz")).json()
            assert serverz["server_name"] == "A" and serverz["nats_url"] == node_.url
            assert serverz["partitioned"] is True and serverz["channels_owned"] == ["orders.>", "audit"]
            metrics = (await http.get("/metrics")).text
            line = next(x for x in metrics.splitlines() if x.startswith("streaming_server_info{"))
            assert 'server_name="A"' in line and f'nats_url="{node_.url}"' in line
            assert 'channels_owned="orders.>,audit"' in line


@on_both_backends
async def test_our_client_fails_over_to_another_node(tmp_path: Path) -> None:
    """Given one node's URL, our client learns the others from the cluster; when its node dies it
    reconnects to another, and its session, subscription and unacknowledged publish carry on."""
    with nats_cluster(3) as (n0, n1, _n2):
        server = ServerProcess(["--dir", str(tmp_path / "data"), "-ns", n1.url], ready=ATTACHED).start()
        try:
            async with connect(CID, "app", servers=[n0.url], reconnect_wait_s=0.1) as sc:
                assert sc.nats.url == n0.url and len(sc.nats.servers) == 3, "the other nodes are learnt"
                async with sc.subscribe("orders", manual_ack=True) as sub:
                    await sc.publish("orders", b"before")
                    with anyio.fail_after(5):
                        (await sub.next_msg()).ack()
                    await anyio.to_thread.run_sync(n0.kill)
                    await sc.publish("orders", b"after")  # sent again on the new node until stored
                    with anyio.fail_after(10):
                        msg = await sub.next_msg()
                    assert msg.data == b"after" and sc.nats.url != n0.url
                    msg.ack()
        finally:
            server.stop()
