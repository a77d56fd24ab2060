"""An FT group on a real three-node nats-server cluster with JetStream, under continuous load from
node-nats-streaming: the active killed, paused, wiped; NATS nodes killed. Nothing acknowledged is
lost, nothing is stored twice, the clients never reconnect, and a standby serves within seconds."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
from pathlib import Path

import httpx
import nats
import pytest

from bench.peers import NatsNode, nats_cluster
from streaming.observability.event_schema import problems
from tests.support.ft import (
    Load,
    caught_up,
    check,
    first_ack_after,
    group,
    member,
    stop_and_compare,
    stored,
    the_active,
)
from tests.support.node import node
from tests.support.servers import wait_for

pytestmark = [pytest.mark.slow, node]
CHANNEL = "orders"


def test_killing_the_active_loses_nothing_and_a_standby_serves_within_seconds(tmp_path: Path) -> None:
    with nats_cluster(3, jetstream=True) as nodes, group(nodes, tmp_path) as members:
        active = the_active(members)
        load = Load(nodes, CHANNEL)
        load.wait_acked(300)
        killed_at = time.time() * 1000
        active.process.kill()
        standby = the_active([m for m in members if m is not active])
        load.wait_acked(load.acked() + 300)
        events = load.stop()
        took = first_ack_after(events, killed_at)
        assert took < 5.0, f"the first PubAck after the kill came {took:.2f}s later"
        # The killed member comes back as a standby and catches up; its copy is the active's.
        active.start()
        caught_up(active, standby)
        active.process.stop()
        standby.process.stop()
        messages = stored(standby.data, CHANNEL)
        report = check(events, messages)
        assert report.acked >= 600
        assert stored(active.data, CHANNEL) == messages
        # The new active's event log records the takeover, after its start, as the schema says.
        lines = [json.loads(line) for f in sorted((tmp_path / f"{standby.name}-events").iterdir()) for line in f.open()]
        kinds = [line["event"] for line in lines if line["event"] in ("server_start", "ft_takeover")]
        assert kinds == ["server_start", "ft_takeover"]
        (takeover,) = [line for line in lines if line["event"] == "ft_takeover"]
        assert problems(takeover) == [] and takeover["group"] == "main"


def test_a_paused_active_steps_down_and_acknowledges_nothing_the_new_one_lacks(tmp_path: Path) -> None:
    with nats_cluster(3, jetstream=True) as nodes, group(nodes, tmp_path) as members:
        old = the_active(members)
        load = Load(nodes, CHANNEL)
        load.wait_acked(200)
        old.signal(signal.SIGSTOP)
        new = the_active([m for m in members if m is not old])
        load.wait_acked(load.acked() + 200)
        old.signal(signal.SIGCONT)
        wait_for(lambda: old.state == "FT_STANDBY", 20)
        assert any("stopped serving; it is a standby again" in line for line in old.process.log)
        load.wait_acked(load.acked() + 100)
        stop_and_compare(load, old, new, CHANNEL)  # every PubAck'd message is in the new active's channel, once


def test_a_wiped_standby_rebuilds_a_byte_identical_copy_from_the_log(tmp_path: Path) -> None:
    with nats_cluster(3, jetstream=True) as nodes, group(nodes, tmp_path) as members:
        active = the_active(members)
        standby = next(m for m in members if m is not active)
        load = Load(nodes, CHANNEL)
        load.wait_acked(300)
        # A standby's monitoring port: where it stands, for Prometheus too.
        scrape = httpx.get(f"http://127.0.0.1:{standby.http_port}/metrics").text
        assert 'streaming_ft_active{ft_group="main"} 0.0' in scrape
        assert (
            'streaming_ft_active{ft_group="main"} 1.0' in httpx.get(f"http://127.0.0.1:{active.http_port}/metrics").text
        )
        standby.process.stop()
        shutil.rmtree(standby.data)
        standby.start()
        load.wait_acked(load.acked() + 200)
        stop_and_compare(load, standby, active, CHANNEL)


def test_a_member_whose_copy_is_damaged_keeps_it_aside_and_rebuilds_from_the_log(tmp_path: Path) -> None:
    with nats_cluster(3, jetstream=True) as nodes, group(nodes, tmp_path) as members:
        active = the_active(members)
        standby = next(m for m in members if m is not active)
        load = Load(nodes, CHANNEL)
        load.wait_acked(200)
        caught_up(standby, active)
        standby.process.stop()
        data = standby.data / "state" / "data.mdb"
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # damage that the open finds
        standby.start()
        assert any("cannot be used" in line and "rebuilding it from the log" in line for line in standby.process.log)
        assert [p.name.startswith(f"{standby.name}.damaged-") for p in tmp_path.iterdir()].count(True) == 1
        load.wait_acked(load.acked() + 100)
        stop_and_compare(load, standby, active, CHANNEL)


def test_losing_nats_nodes_pauses_writes_and_never_splits_the_brain(tmp_path: Path) -> None:
    with nats_cluster(3, jetstream=True) as nodes, group(nodes, tmp_path) as members:
        the_active(members)
        load = Load(nodes, CHANNEL, max_ping_out=30)  # the client waits out the outage (pings 5 s apart)
        load.wait_acked(200)
        # The node that leads the group's log, one of three: the stream and the lease keep a quorum
        # and elect another leader; writes pause at most, then resume.
        leader = next(n for n in nodes if n.name == stream_leader(nodes))
        leader.kill()
        load.wait_acked(load.acked() + 200, within=60)
        # Two of three: no quorum, so no PubAck at all until a node returns.
        second = next(n for n in nodes if n is not leader)
        second.kill()
        time.sleep(1.0)
        quiet_from = time.time() * 1000
        time.sleep(4.0)
        acked_without_quorum = [e for e in list(load.events) if "a" in e and e["t"] > quiet_from]
        assert acked_without_quorum == []
        second.start()
        load.wait_acked(load.acked() + 200, within=90)
        events = load.stop()
        active = the_active(members, within=30)
        for m in members:
            m.process.stop()
        check(events, stored(active.data, CHANNEL))


def stream_leader(nodes: list[NatsNode]) -> str:
    """The name of the nats-server node that leads the group's log stream."""

    async def ask() -> str:
        nc = await nats.connect([n.url for n in nodes])
        try:
            info = await nc.jetstream().stream_info("FT_test-cluster_main")
            assert info.cluster is not None and info.cluster.leader
            return str(info.cluster.leader)
        finally:
            await nc.close()

    return asyncio.run(ask())


def test_a_group_on_a_single_node_with_one_replica(tmp_path: Path) -> None:
    """Development: one nats-server, `--ft_replicas 1`."""
    with nats_cluster(1, jetstream=True) as nodes:
        first = member("solo", nodes, tmp_path, replicas=1).start()
        try:
            the_active([first])
            load = Load(nodes, CHANNEL)
            load.wait_acked(100)
            events = load.stop()
        finally:
            first.process.stop()
        check(events, stored(first.data, CHANNEL))
