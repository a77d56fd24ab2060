"""A seeded random schedule of faults against an FT group under load (the active killed or paused, a
standby wiped or restarted, a NATS node killed and brought back), then one checker over the whole
history: nothing acknowledged lost, nothing stored twice, no gap in the sequences, every subscriber
got everything, and an acknowledged message delivered again only for an ack sent just before a
fault. `FT_FAULT_SEED` picks another schedule (the seed is in the failure message)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from bench.peers import NatsNode, nats_cluster
from tests.support.ft import Load, Member, caught_up, check, group, stored, the_active
from tests.support.node import node
from tests.support.servers import wait_for

pytestmark = [pytest.mark.slow, node]
SEED = int(os.environ.get("FT_FAULT_SEED", "20261127"))
FAULTS = ("kill_active", "pause_active", "wipe_standby", "restart_standby", "kill_node")
STEPS = 8
BEFORE_MS = 1000  # an ack this soon before a fault may not have reached the log


def now_ms() -> float:
    return time.time() * 1000


def test_a_seeded_schedule_of_faults_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    schedule = [rng.choice(FAULTS) for _ in range(STEPS)]
    windows: list[tuple[float, float]] = []
    with nats_cluster(3, jetstream=True) as nodes, group(nodes, tmp_path) as members:
        active = the_active(members)
        load = Load(nodes, "orders", max_ping_out=30)
        load.wait_acked(200)
        for step, fault in enumerate(schedule):
            started = now_ms()
            active = do(fault, members, active, nodes, rng)
            load.wait_acked(load.acked() + 150, within=90)
            windows.append((started - BEFORE_MS, now_ms()))
            assert sum(m.state == "FT_ACTIVE" for m in members) == 1, f"seed {SEED}, step {step} ({fault})"
        events = load.stop()
        standby = next(m for m in members if m is not active)
        caught_up(standby, active, within=60)
        standby.process.stop()
        active.process.stop()
        messages = stored(active.data, "orders")
        try:
            check(events, messages, windows)
            assert stored(standby.data, "orders") == messages
        except AssertionError as exc:
            raise AssertionError(f"seed {SEED}, schedule {schedule}: {exc}") from None


def do(fault: str, members: list[Member], active: Member, nodes: list[NatsNode], rng: random.Random) -> Member:
    """Carry out one fault and wait until the group is whole again; the active after it."""
    standby = next(m for m in members if m is not active)
    if fault == "kill_active":
        active.process.kill()
        new = the_active([standby], within=30)
        active.start()
        caught_up(active, new, within=60)
        return new
    if fault == "pause_active":
        active.signal(signal.SIGSTOP)
        new = the_active([standby], within=30)
        active.signal(signal.SIGCONT)
        wait_for(lambda: active.state == "FT_STANDBY", 30)
        return new
    if fault in ("wipe_standby", "restart_standby"):
        standby.process.stop()
        if fault == "wipe_standby":
            shutil.rmtree(standby.data)
        standby.start()
        caught_up(standby, active, within=60)
        return active
    victim = rng.choice(nodes)
    victim.kill()
    time.sleep(rng.uniform(0.5, 3.0))
    victim.start()
    return the_active(members, within=60)
