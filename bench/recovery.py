"""Restart cost with a full store, ours vs NATS JetStream and nats-streaming-server: time to serve
again, memory, and how soon the pending messages come back.

    python bench/recovery.py [--quick] [--json]

Each system gets 1,000,000 stored 128-byte messages (quick: 100,000) and a durable subscription with
100,000 delivered-but-unacked messages (quick: 10,000; AckWait 10 minutes, so none are redelivered
before the restart). The server is stopped (SIGTERM) and started again on the same data directory:
- `<system>_ready_s`: from starting the process to its port accepting connections;
- `<system>_rss_mb`: resident memory (process tree) once ready, and `<system>_rss_settled_mb` of a
  second restart on the same data after it was left alone for 5 s and its full check has ended (no
  client): the steady figure, taken apart from the resume, which reads and sends a different amount
  each;
- `ours_serves_s`, `stan_serves_s`: from starting the process to a STAN connect answered (the port
  of nats-streaming-server's embedded NATS server opens before its store is recovered, so the port
  alone does not say it serves); `jetstream_consumer_ready_s`: to its answer about the durable
  consumer (with all its pending counted);
- `ours_first_delivery_s`, `stan_first_delivery_s`: from starting the process to the first message
  the re-attached durable receives (a pending one: STAN redelivers them first, at once, after a
  restart), and `<system>_pending_redelivered_s` until all of them came back. JetStream sends pending
  messages again only when their ack_wait ends, and nothing new while max_ack_pending is used up, so
  there is no first delivery to time;
- `<system>_disk_mb`: the data directory's size.
Both STAN servers are filled and resumed by the same client (ours, in Python); nats-streaming-server
(FILE store, its defaults) is skipped when its binary is absent (`STAN_SERVER`, else ../shared/peers).
Our server checks every message in the background after a restart (`verify_on_start`, default
"background": docs/storage.md): `ours_rss_mb` includes that check's process.
RSS ratios are of the settled figures.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.load import jetstream_publish, publish_pipelined  # noqa: E402
from bench.report import arguments, machine, print_report, progress  # noqa: E402
from streaming.client import StartPosition, connect  # noqa: E402

PAYLOAD = b"x" * 128
ACK_WAIT = 600
SETTLED_S = 5.0  # after a start: when the steady memory figure is taken


def _rss_mb(pid: int) -> float:
    proc = psutil.Process(pid)
    rss: int = sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
    return rss / 2**20


def _settled_rss_mb(command: list[str], port: int) -> float:
    """Resident memory of the server started again with `command`, left alone for SETTLED_S and until
    it has no child process (ours: its full check has ended, which on a slow machine takes longer)."""
    proc, started = _restart(command, port)
    try:
        time.sleep(max(0.0, started + SETTLED_S - time.perf_counter()))
        deadline = time.perf_counter() + 120
        while psutil.Process(proc.pid).children(recursive=True) and time.perf_counter() < deadline:
            time.sleep(0.1)
        return _rss_mb(proc.pid)
    finally:
        peers.stop(proc)


def _disk_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


async def _stan_fill(port: int, stored: int, pending: int) -> None:
    async with connect("test-cluster", "bench-fill", port=port) as sc:
        for first in range(0, stored, 100_000):
            await publish_pipelined(sc, "recover", min(100_000, stored - first), PAYLOAD)
            await sc.wait_pub_acks()
        sub = await sc.open_subscription(
            "recover",
            durable="d",
            start_at=StartPosition.FIRST,
            ack_wait=ACK_WAIT,
            max_inflight=pending,
            manual_ack=True,
        )
        for _ in range(pending):
            await sub.next_msg()  # not acked; the durable keeps them when the client goes


async def _stan_resume(port: int, pending: int, started: float) -> tuple[float, float]:
    """Seconds from `started` to the first pending message back, and to the last (our client against
    either STAN server, once it answers connects)."""
    async with connect("test-cluster", "bench-fill", port=port) as sc:  # a durable belongs to its client id
        sub = await sc.open_subscription(
            "recover", durable="d", ack_wait=ACK_WAIT, max_inflight=pending, manual_ack=True
        )
        with trio.fail_after(60):
            msg = await sub.next_msg()
        first = time.perf_counter() - started
        assert msg.redelivered, "a pending message comes first"
        msg.ack()
        with trio.fail_after(120):
            for _ in range(pending - 1):
                (await sub.next_msg()).ack()
        return first, time.perf_counter() - started


async def _js_fill(port: int, stored: int, pending: int) -> None:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(name="RECOVER", subjects=["recover"], storage=StorageType.FILE)
    await jetstream_publish(js, "recover", stored, PAYLOAD)
    config = ConsumerConfig(
        ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT, max_ack_pending=pending, deliver_policy=DeliverPolicy.ALL
    )
    sub = await js.subscribe("recover", durable="d", config=config, manual_ack=True, pending_msgs_limit=pending + 1)
    for _ in range(pending):
        await sub.next_msg(timeout=60)
    await nc.close()


async def _js_resume(port: int, pending: int, started: float) -> float:
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    info = await nc.jetstream().consumer_info("RECOVER", "d")
    assert info.num_ack_pending == pending, info
    answered = time.perf_counter() - started
    await nc.close()
    return answered


def _restart(cmd: list[str], port: int) -> tuple[subprocess.Popen[bytes], float]:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peers.wait_port(port, proc, timeout=600)
    return proc, started


def run_ours(stored: int, pending: int) -> dict[str, float]:
    data = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    with peers.ours(data=data, keep=True) as server:
        trio.run(_stan_fill, server.port, stored, pending)
        port = server.port
    return _resume_stan(peers.our_command(port, data / "store"), port, pending, data)


def run_stan(stored: int, pending: int) -> dict[str, float]:
    binary = peers.stan_binary()
    assert binary is not None
    data = Path(tempfile.mkdtemp(prefix="bench-recovery-stan-"))
    with peers.stan(data=data, keep=True) as server:
        trio.run(_stan_fill, server.port, stored, pending)
        port = server.port
    return _resume_stan(peers.stan_command(binary, port, data / "store"), port, pending, data)


def _resume_stan(command: list[str], port: int, pending: int, data: Path) -> dict[str, float]:
    """Start a STAN server on its filled directory again; time it, and the durable's pending."""
    proc, started = _restart(command, port)
    try:
        ready = time.perf_counter() - started
        rss = _rss_mb(proc.pid)
        peers.wait_stan(port)  # nats-streaming-server opens its port before it has recovered
        serves = time.perf_counter() - started
        first, drained = trio.run(_stan_resume, port, pending, started)
        peers.stop(proc)
        settled = _settled_rss_mb(command, port)
        return {
            "ready_s": round(ready, 3),
            "rss_mb": round(rss, 1),
            "rss_settled_mb": round(settled, 1),
            "serves_s": round(serves, 3),
            "first_delivery_s": round(first, 3),
            "pending_redelivered_s": round(drained, 3),
            "disk_mb": round(_disk_mb(data), 1),
        }
    finally:
        peers.stop(proc)
        shutil.rmtree(data, ignore_errors=True)


def run_jetstream(stored: int, pending: int) -> dict[str, float]:
    data = Path(tempfile.mkdtemp(prefix="bench-recovery-js-"))
    with peers.jetstream(data=data, keep=True) as server:
        asyncio.run(_js_fill(server.port, stored, pending))
        port = server.port
    proc, started = _restart(peers.jetstream_command(port, data, sync_always=False), port)
    try:
        ready = time.perf_counter() - started
        rss = _rss_mb(proc.pid)
        first = asyncio.run(_js_resume(port, pending, started))
        peers.stop(proc)
        settled = _settled_rss_mb(peers.jetstream_command(port, data, sync_always=False), port)
        return {
            "ready_s": round(ready, 3),
            "rss_mb": round(rss, 1),
            "rss_settled_mb": round(settled, 1),
            "consumer_ready_s": round(first, 3),
            "disk_mb": round(_disk_mb(data), 1),
        }
    finally:
        peers.stop(proc)
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = arguments(__doc__, quick="100,000 stored, 10,000 pending (under a minute)")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    stored, pending = (100_000, 10_000) if args.quick else (1_000_000, 100_000)
    result: dict[str, Any] = {
        "scale": "quick" if args.quick else "full",
        "machine": machine(),
        "stored": stored,
        "pending": pending,
    }
    runners = [("ours", run_ours), ("jetstream", run_jetstream)]
    if peers.stan_binary() is not None:
        runners.append(("stan", run_stan))
    with progress(console) as bar:
        task = bar.add_task("fill, stop, restart", total=len(runners))
        for name, runner in runners:
            bar.update(task, description=f"{name}: fill {stored:,}, {pending:,} pending, restart")
            for key, value in runner(stored, pending).items():
                result[f"{name}_{key}"] = value
            bar.advance(task)
    result["ready_ratio_vs_jetstream"] = round(result["ours_ready_s"] / result["jetstream_ready_s"], 3)
    result["rss_ratio_vs_jetstream"] = round(result["ours_rss_settled_mb"] / result["jetstream_rss_settled_mb"], 3)
    ratios = ["ready_ratio_vs_jetstream", "rss_ratio_vs_jetstream"]
    if "stan_serves_s" in result:
        for key in ("serves_s", "first_delivery_s", "pending_redelivered_s", "rss_settled_mb"):
            result[f"{key.removesuffix('_s').removesuffix('_mb')}_ratio_vs_stan"] = round(
                result[f"ours_{key}"] / result[f"stan_{key}"], 3
            )
        ratios += [k for k in result if k.endswith("_ratio_vs_stan")]
    rows = [(key, f"{value}", "") for key, value in result.items() if key.startswith(("ours_", "jetstream_", "stan_"))]
    rows += [(k, f"{result[k]}", "") for k in ratios]
    print_report(
        console, f"restart with {stored:,} stored, {pending:,} pending ({result['scale']})", rows, result, args.json
    )


if __name__ == "__main__":
    main()
