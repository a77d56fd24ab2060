"""Partitioning and FT groups together: a partition whose servers form a group survives the death of
its active, and the other partitions never notice; members of one group are not a partition conflict."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from bench.peers import nats_cluster
from streaming.client import StanError, StartPosition, connect
from tests.support.ft import STANDBY_LINE, Member, the_active
from tests.support.servers import ATTACHED, ServerProcess, free_port

pytestmark = pytest.mark.slow
CID = "test-cluster"


def partition_member(name: str, urls: str, root: Path, channels: list[str], group: str) -> Member:
    port = free_port()
    conf = root / f"{name}.toml"
    tables = "".join(f'[channels."{c}"]\n' for c in channels)
    extra = f'ft_group = "{group}"\nft_lease = "2s"\n' if group else ""
    conf.write_text(
        f'nats_server = "{urls}"\npartitioning = true\nserver_name = "{name}"\ndir = "{root / name}"\n'
        f'http_port = {port}\nrecovery_hold = "1s"\n{extra}{tables}'
    )
    return Member(name, root / name, ServerProcess(["-c", str(conf)], ready=STANDBY_LINE if group else ATTACHED), port)


async def publish_until_stored(port: int, channel: str, data: bytes, within: float = 20.0) -> None:
    """Publish until one PubAck comes (a takeover drops what was sent meanwhile)."""
    deadline = time.monotonic() + within
    while True:
        try:
            async with connect(CID, f"pub-{time.monotonic_ns()}", port=port, request_timeout_s=2) as sc:
                sc.pub_ack_timeout_s = 2
                await sc.publish(channel, data)
                return
        except* (StanError, OSError):  # from inside the client's task group: in a group
            if time.monotonic() > deadline:
                raise
        await trio.sleep(0.2)


async def test_a_partition_that_is_a_group_survives_its_active_and_the_others_never_notice(tmp_path: Path) -> None:
    with nats_cluster(3, jetstream=True) as nodes:
        urls = ",".join(n.url for n in nodes)
        orders = [partition_member(f"orders-{i}", urls, tmp_path, ["orders.>"], "orders") for i in range(2)]
        billing = partition_member("billing", urls, tmp_path, ["billing.>"], "")
        try:
            for m in [*orders, billing]:
                m.start()
            active = the_active(orders)
            port = nodes[2].port
            await publish_until_stored(port, "orders.eu", b"before")
            await publish_until_stored(port, "billing.eu", b"b1")
            active.process.kill()
            await publish_until_stored(port, "orders.eu", b"after")
            await publish_until_stored(port, "billing.eu", b"b2", within=3)
            new = the_active([m for m in orders if m is not active])
            assert not any("owned by server" in line for line in new.process.log), "a member is not a conflict"
            async with (
                connect(CID, "reader", port=nodes[0].port) as sc,
                sc.subscribe("orders.eu", start_at=StartPosition.FIRST) as sub,
            ):
                with trio.fail_after(10):
                    assert [(await sub.next_msg()).data for _ in range(2)] == [b"before", b"after"]
        finally:
            for m in [*orders, billing]:
                m.process.stop()
