"""What the benchmarks share about the servers they drive: the server process's CPU time over the timed
part, and the fast clients (Node on both sides: node-nats-streaming against ours and nats-streaming-server,
nats.js 2.x against JetStream; `bench/node/clients.js`, installed with `npm ci --prefix bench/node`)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from bench import peers

NODE_DIR = Path(__file__).resolve().parent / "node"
# nats-streaming-server speaks STAN as ours does: the same node-nats-streaming client drives both.
NODE_SYSTEMS = ("ours", "jetstream", *(("stan",) if peers.stan_binary() else ()))


class ServerCpu:
    """The server processes' CPU time (user + system) over the timed part: `start()` to `stop()`."""

    def __init__(self, pid: int, *more: int) -> None:
        self._procs = [psutil.Process(p) for p in (pid, *more)]
        self._at = 0.0
        self.seconds = 0.0

    def _now(self) -> float:
        return sum(float(t.user + t.system) for t in (p.cpu_times() for p in self._procs))

    def start(self) -> None:
        self._at = self._now()

    def stop(self) -> None:
        self.seconds = self._now() - self._at


class NodeRun(NamedTuple):
    msgs_per_s: float  # over the timed part
    server_us_per_msg: float  # the server's CPU per message over it
    # The share of one core the client's main thread was busy over it: node-nats-streaming runs on
    # that one thread, so 1.0 is as fast as this client goes whatever the server, and `msgs_per_s /
    # client_busy` is the most any server could show it (its ceiling).
    client_busy: float
    # The reads of the client's sockets over it, and their median size: how the server's writes
    # reach the client (fewer, fuller reads cost it less per message).
    reads: int = 0
    read_p50_bytes: int = 0

    @property
    def client_ceiling(self) -> float:
        return client_ceiling(self.msgs_per_s, self.client_busy)


def client_ceiling(msgs_per_s: float, client_busy: float) -> float:
    """The rate a client would reach with its main thread busy all the time: `msgs_per_s` at a share
    `client_busy` of a core. The most any server could show it (inf when it was never busy)."""
    return msgs_per_s / client_busy if client_busy else float("inf")


def run_node(
    system: str,
    workload: str,
    messages: int,
    subscribers: int,
    queue: bool,
    count: int,
    ours_flags: Sequence[str] = (),
) -> NodeRun:
    """Run `bench/node/clients.js` against a fresh server (ours with `ours_flags` added): msgs/s of
    the timed part, the server's CPU µs per message over it (`count` messages: deliveries for a
    consume), and how busy the client's main thread was."""
    if not (NODE_DIR / "node_modules").exists():
        raise SystemExit("the Node clients are not installed: npm ci --prefix bench/node")
    with peers.ours(*ours_flags) if ours_flags else peers.start(system) as server:
        cpu = ServerCpu(server.pid)
        argv = ["node", str(NODE_DIR / "clients.js"), system, workload, str(server.port), str(messages)]
        argv += [str(subscribers), "queue" if queue else ""]
        result = drive(argv, cpu, "start")
    if not result.get("ok"):
        raise RuntimeError(f"node {system} {workload}: {result.get('error')}")
    return NodeRun(
        float(result["msgs_per_s"]),
        cpu.seconds / count * 1e6,
        float(result["client_busy"]),
        int(result.get("reads", 0)),
        int(result.get("read_p50_bytes", 0)),
    )


def _main_thread_seconds(process: psutil.Process) -> float:
    """CPU time of a process's main thread (its id is the process's), 0 if it is gone."""
    try:
        return next((t.user_time + t.system_time for t in process.threads() if t.id == process.pid), 0.0)
    except psutil.Error:
        return 0.0


def drive(argv: list[str], cpu: ServerCpu, marker: str) -> dict[str, Any]:
    """Run a Node client that prints `marker` when its timed part starts and a JSON line at its end;
    `cpu` measures the server over that part. Returns the JSON line ({"ok": False, ...} if none),
    with `client_busy` added: the share of a core the client's main thread used over that part."""
    result: dict[str, Any] = {"ok": False, "error": "no result"}
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        client = psutil.Process(proc.pid)
        began = busy = 0.0
        for line in proc.stdout:
            if line.strip() == marker:
                cpu.start()
                began, busy = time.monotonic(), _main_thread_seconds(client)
            elif line.startswith("{"):
                cpu.stop()
                busy = _main_thread_seconds(client) - busy
                result = json.loads(line)
                result["client_busy"] = round(busy / max(time.monotonic() - began, 1e-9), 3)
    return result
