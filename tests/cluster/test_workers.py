"""`streaming-server --workers N` as users run it: one address, channels spread over N worker
processes by a hash of their name, a killed worker started again with nothing acknowledged lost,
and Ctrl-C stopping every process it started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import trio

from storage import open_store
from streaming.client import StartPosition, connect
from streaming.stan.partitions import channel_partition
from tests.support.servers import ServerProcess, free_port, free_port_block, state_stored, wait_for

pytestmark = pytest.mark.slow
CID = "test-cluster"
ROOT = Path(__file__).resolve().parents[2]


def pids(log: list[str], name: str) -> list[int]:
    return [int(m.group(1)) for line in log if (m := re.search(rf"{name} started \(pid (\d+)\)", line))]


def monitoring_port(log: list[str], worker: int) -> int:
    """The monitoring port worker `worker` logged (each worker takes a free one with `--http_port=-1`)."""
    (port,) = [
        int(m.group(1))
        for line in log
        if f"[worker-{worker}]" in line and (m := re.search(r"Listening for HTTP monitoring on [^:]+:(\d+)", line))
    ]
    return port


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_workers_share_the_channels_by_hash_and_come_back_after_a_kill(tmp_path: Path) -> None:
    port = free_port()
    supervisor = ServerProcess(
        ["--workers", "3", "-p", str(port), "--http_port=-1", "--dir", str(tmp_path / "data")]
    ).start(timeout=40)
    assert supervisor.port == port
    channels = [f"ch{i}" for i in range(12)] + ["orders.eu.paris"]
    try:

        async def before_the_kill() -> None:
            async with connect(CID, "app", port=port) as sc:
                for channel in channels:
                    for i in range(3):
                        await sc.publish(channel, b"%s-%d" % (channel.encode(), i))
                for channel in channels:  # each channel reads back whole from its worker
                    async with sc.subscribe(channel, start_at=StartPosition.FIRST) as sub:
                        with trio.fail_after(5):
                            got = [await sub.next_msg() for _ in range(3)]
                        assert [m.seq for m in got] == [1, 2, 3]
                sub = await sc.open_subscription(
                    "ch1", durable="d", manual_ack=True, ack_wait=60, start_at=StartPosition.FIRST
                )
                with trio.fail_after(5):
                    got = [await sub.next_msg() for _ in range(3)]
                got[0].ack()
                await sub.close()  # answered by ch1's worker once it has the ack and the close...
            await state_stored(monitoring_port(supervisor.log, channel_partition("ch1", 3)))  # ...and stored them

        trio.run(before_the_kill)
        owner = channel_partition("ch1", 3)
        (victim,) = pids(supervisor.log, f"worker-{owner}")
        os.kill(victim, signal.SIGKILL)

        def serving() -> int:
            return sum(f"[worker-{owner}]" in line and "Serving STAN clients" in line for line in supervisor.log)

        async def after_the_kill() -> None:
            # It connects while ch1's worker is down: the other workers answer.
            async with connect(CID, "newcomer", port=port) as sc:
                assert serving() == 1, "connected before the killed worker came back"
                await trio.to_thread.run_sync(wait_for, lambda: serving() == 2)  # started again
                await sc.publish("ch1", b"new")  # the worker learns of this client from the others
            async with connect(CID, "app", port=port) as sc:
                async with sc.subscribe("ch1", durable="d", manual_ack=True) as sub:
                    with trio.fail_after(10):
                        again = [await sub.next_msg() for _ in range(3)]
                    assert [(m.seq, m.data) for m in again] == [(2, b"ch1-1"), (3, b"ch1-2"), (4, b"new")]

        trio.run(after_the_kill)
        children = [
            *pids(supervisor.log, "nats-server"),
            *(p for i in range(3) for p in pids(supervisor.log, f"worker-{i}")),
        ]
    finally:
        assert supervisor.proc is not None
        supervisor.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert supervisor.proc.wait(20) == 0
    assert not any(alive(pid) for pid in children), "Ctrl-C stops every process it started"

    # Each channel was stored by the worker its hash names, and by no other.
    for index in range(3):
        store = open_store("lmdb", tmp_path / "data" / f"worker-{index}", CID)
        try:
            stored = {c.name for c in store.channels()}
        finally:
            store.close()
        assert stored == {c for c in channels if channel_partition(c, 3) == index}, index


def test_the_cluster_demo_starts_three_nodes_and_three_servers_and_stops_them(tmp_path: Path) -> None:
    base = demo_ports()
    demo = start_demo(base, tmp_path)
    assert demo.stdout is not None
    try:
        lines = demo_banner(demo)
        assert lines[0].startswith("NATS cluster") and f"nats://127.0.0.1:{base + 2}" in lines[3], lines

        async def use_it() -> None:
            async with connect(CID, "demo", port=base + 2) as sc:
                await sc.publish("orders.eu", b"hello")  # stored by the server attached to node 0
                await sc.publish("audit", b"seen")
            async with (
                connect(CID, "reader", port=base) as sc,
                sc.subscribe("orders.eu", start_at=StartPosition.FIRST) as sub,
            ):
                with trio.fail_after(5):
                    assert (await sub.next_msg()).data == b"hello"

        trio.run(use_it)
    finally:
        code, left = ctrl_c(demo, tmp_path)
    assert code == 0, "Ctrl-C stops the demo"
    assert left == [], "Ctrl-C stops every process it started"


def test_the_cluster_demo_stops_on_ctrl_c_when_started_as_a_background_job(tmp_path: Path) -> None:
    """A shell's background job starts with SIGINT ignored, and Python then installs no handler of its
    own: the demo sets its own, or Ctrl-C would do nothing."""
    demo = start_demo(demo_ports(), tmp_path, preexec=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert demo.stdout is not None
    try:
        lines = demo_banner(demo)
        assert lines[0].startswith("NATS cluster"), lines
    finally:
        code, left = ctrl_c(demo, tmp_path)
    assert code == 0 and left == []


def demo_ports() -> int:
    """A base port for the demo: it listens on base + 0-2 (NATS), 100-102 (routes) and 200-203 (HTTP)."""
    return free_port_block([0, 1, 2, 100, 101, 102, 200, 201, 202, 203])


def demo_banner(demo: subprocess.Popen[str]) -> list[str]:
    """The nine lines the demo prints once everything runs; if it stops first, what it said instead."""
    assert demo.stdout is not None and demo.stderr is not None
    lines = [demo.stdout.readline() for _ in range(9)]
    if not lines[0]:  # its output ended: it is stopping
        code = demo.wait(10)
        pytest.fail(f"the demo stopped with {code} before it ran: {demo.stderr.read()}")
    return lines


def start_demo(base: int, directory: Path, preexec: Callable[[], object] | None = None) -> subprocess.Popen[str]:
    """scripts/cluster-demo on ports from `base`, its data in `directory` (`preexec`: in the child first)."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "cluster-demo"), "--base-port", str(base), "--dir", str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
    )


def ctrl_c(demo: subprocess.Popen[str], directory: Path) -> tuple[int | None, list[int]]:
    """Ctrl-C the demo: its exit status (None: it did not stop) and the processes it left running.
    Whatever happened, nothing it started outlives the test: those are killed."""
    demo.send_signal(signal.SIGINT)
    try:
        code: int | None = demo.wait(30)
    except subprocess.TimeoutExpired:
        code = None
    left = [p for p in psutil.process_iter(["cmdline"]) if str(directory) in " ".join(p.info["cmdline"] or [])]
    for process in left:
        process.kill()
    if demo.poll() is None:
        demo.kill()
        demo.wait()
    return code, [p.pid for p in left]
