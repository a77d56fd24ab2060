"""Clients nobody on the team wrote, against the server as users run it (`python -m streaming`):
nats-py on the embedded NATS broker, and node-nats-streaming (npm) on the STAN layer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import nats
import pytest
from nats.aio.msg import Msg

from tests.support.node import node, run_node
from tests.support.servers import ATTACHED, ServerProcess, server_process


def test_nats_py_pub_sub_wildcards_queues_request_reply() -> None:
    async def scenario(port: int) -> None:
        nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False)
        try:
            star = await nc.subscribe("orders.*")
            tail = await nc.subscribe("orders.>")
            q1 = await nc.subscribe("jobs", queue="workers")
            q2 = await nc.subscribe("jobs", queue="workers")

            async def echo(msg: Msg) -> None:
                await msg.respond(b"echo:" + msg.data)

            await nc.subscribe("svc.echo", cb=echo)
            await nc.publish("orders.new", b"1")
            await nc.publish("orders.eu.new", b"2")
            for i in range(20):
                await nc.publish("jobs", b"%d" % i)
            reply = await nc.request("svc.echo", b"ping", timeout=2)
            assert reply.data == b"echo:ping"
            old_style = await nc.request("svc.echo", b"old", timeout=2, old_style=True)
            assert old_style.data == b"echo:old"
            await nc.flush()
            assert (await star.next_msg(timeout=2)).subject == "orders.new"
            assert [(await tail.next_msg(timeout=2)).data for _ in range(2)] == [b"1", b"2"]
            with pytest.raises(nats.errors.TimeoutError):
                await star.next_msg(timeout=0.2)  # orders.eu.new is two tokens: not for `*`
            assert q1.pending_msgs + q2.pending_msgs == 20
        finally:
            await nc.close()

    with server_process("--store", "memory") as server:
        asyncio.run(scenario(server.port))


def test_nats_py_sees_max_payload_and_is_refused_beyond_it() -> None:
    async def scenario(port: int) -> None:
        nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False)
        try:
            assert nc.max_payload == 1024 * 1024
            with pytest.raises(nats.errors.MaxPayloadError):
                await nc.publish("big", b"x" * (1024 * 1024 + 1))
        finally:
            await nc.close()

    with server_process("--store", "memory") as server:
        asyncio.run(scenario(server.port))


@pytest.fixture(scope="module", params=["embedded", "external"])
def lmdb_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Ours with its LMDB store: on its embedded broker, or attached to an external nats-server (the
    Node client then connects to that nats-server: `port` is where clients go either way)."""
    data = tmp_path_factory.mktemp("node") / "data"
    if request.param == "embedded":
        with server_process("--dir", str(data)) as server:
            yield server
        return
    node_ = request.getfixturevalue("external_nats")
    server = ServerProcess(["--dir", str(data), "-ns", node_.url], ready=ATTACHED).start()
    try:
        server.port = node_.port
        yield server
    finally:
        server.stop()


@node
def test_node_client_connects_and_publishes_with_acks(lmdb_server: ServerProcess) -> None:
    assert run_node("publish", lmdb_server.port, "node.pub") == {"ok": True, "published": 20, "unique": 20}


@node
def test_node_client_manual_ack_and_ackwait_redelivery(lmdb_server: ServerProcess) -> None:
    result = run_node("redelivery", lmdb_server.port, "node.redeliver")
    assert result["got"] == [
        {"seq": 1, "redelivered": False, "data": "first"},
        {"seq": 1, "redelivered": True, "data": "first"},
    ]


@node
def test_node_client_durable_resume_after_close(lmdb_server: ServerProcess) -> None:
    result = run_node("durable", lmdb_server.port, "node.durable")
    first, second = result["first"], result["second"]
    assert isinstance(first, list) and isinstance(second, list)
    assert [m["seq"] for m in first] == [1, 2, 3]
    assert [(m["seq"], m["data"]) for m in second] == [(4, "m4"), (5, "m5")]


@node
def test_node_client_queue_group_shares_the_work(lmdb_server: ServerProcess) -> None:
    result = run_node("queue", lmdb_server.port, "node.queue")
    a, b = result["a"], result["b"]
    assert isinstance(a, list) and isinstance(b, list)
    assert sorted(a + b) == list(range(1, 11))  # each message to exactly one member
    assert a and b  # both members got work


@node
def test_node_client_follows_a_wildcard_unmodified(lmdb_server: ServerProcess) -> None:
    """node-nats-streaming sends the pattern as the subscription's subject and each ack with its
    message's subject: a wildcard subscription works with it as it is."""
    result = run_node("wildcard", lmdb_server.port, "node.wild")
    first, second = result["first"], result["second"]
    assert isinstance(first, list) and isinstance(second, list)
    got = [(m["subject"], m["seq"], m["redelivered"], m["data"]) for m in first]
    assert got == [
        ("node.wild.a", 1, False, "a1"),
        ("node.wild.b", 1, False, "b1"),
        ("node.wild.a", 2, False, "a2"),
        ("node.wild.b", 1, True, "b1"),  # acked by its channel only on the redelivery
    ]
    assert sorted((m["subject"], m["seq"], m["data"]) for m in second) == [
        ("node.wild.a", 3, "a3"),
        ("node.wild.c", 1, "c1"),
    ]
    assert result["total"] == 6, "nothing more: every ack reached its channel"


@node
def test_node_clients_share_a_pattern_in_a_queue_group(lmdb_server: ServerProcess) -> None:
    result = run_node("wildcard_queue", lmdb_server.port, "node.wq")
    a, b = result["a"], result["b"]
    assert isinstance(a, list) and isinstance(b, list)
    expected = [f"node.wq.even#{n}" for n in range(1, 6)] + [f"node.wq.odd#{n}" for n in range(1, 6)]
    assert sorted(a + b) == sorted(expected), "each message of each channel exactly once over the group"
    assert a and b, "both members got work"
