"""What the benchmarks share about the servers they drive: the server process's CPU time over the timed
part, and the fast clients (Node on both sides: node-nats-streaming against ours and nats-streaming-server,
nats.js 2.x against JetStream; `bench/node/clients.js`, installed with `npm ci --prefix bench/node`)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def run_node(
    system: str,
    workload: str,
    messages: int,
    subscribers: int,
    queue: bool,
    count: int,
    ours_flags: Sequence[str] = (),
) -> tuple[float, float]:
    """Run `bench/node/clients.js` against a fresh server (ours with `ours_flags` added): msgs/s of
    the timed part, and the server's CPU µs per message over it (`count` messages: deliveries for a
    consume)."""
    if not (NODE_DIR / "node_modules").exists():
        raise SystemExit("the Node clients are not installed: npm ci --prefix bench/node")
    with peers.ours(*ours_flags) if ours_flags else peers.start(system) as server:
        cpu = ServerCpu(server.pid)
        argv = ["node", str(NODE_DIR / "clients.js"), system, workload, str(server.port), str(messages)]
        argv += [str(subscribers), "queue" if queue else ""]
        result = drive(argv, cpu, "start")
    if not result.get("ok"):
        raise RuntimeError(f"node {system} {workload}: {result.get('error')}")
    return float(result["msgs_per_s"]), cpu.seconds / count * 1e6


def drive(argv: list[str], cpu: ServerCpu, marker: str) -> dict[str, Any]:
    """Run a Node client that prints `marker` when its timed part starts and a JSON line at its end;
    `cpu` measures the server over that part. Returns the JSON line ({"ok": False, ...} if none)."""
    result: dict[str, Any] = {"ok": False, "error": "no result"}
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == marker:
                cpu.start()
            elif line.startswith("{"):
                cpu.stop()
                result = json.loads(line)
    return result
