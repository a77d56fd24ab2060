"""Durable publish against real peers, same machine, same run: pipelined and one at a time, 128 B and 4 KiB.

    python bench/publish.py [--quick] [--json] [--plot FILE.png] [--clients python|node|both]

Systems, each in its own process on loopback, driven from this one:
- ours: `python -m streaming` (LMDB; a PubAck only after the group commit's fsync), our client (under Trio);
- jetstream: `nats-server -js`, file storage at its default sync (fsync every 2 minutes), nats-py;
- jetstream_sync: the same with `sync_interval: always` (an fsync per write, like ours);
- redis: `redis-server --appendonly yes` (appendfsync everysec, its default), XADD with redis-py.

Pipelined: as many publishes in flight as the client allows (ours: its PubAck window; nats-py:
`publish_async`; redis-py: pipelines of 1,000 XADDs), until the last confirmation. One at a time: each
publish waits for its confirmation; bounded by count and by `SEQUENTIAL_SECONDS`.

JSON keys: `<system>_<mode>_<size>_msgs_per_s` for every case; ratios ours / peer as
`ratio_<mode>[_4k]_vs_<peer>` with mode `async` (pipelined) or `sync` (one at a time), e.g.
`ratio_async_vs_jetstream` (128 B, pipelined; target >= 2.5) and `ratio_async_vs_redis`.

One at a time, a durable publish cannot beat one fdatasync plus one loopback round trip: both are
measured in the same run (medians of 300; `fdatasync_ms`, `loopback_rtt_ms`) and ours is reported as a
fraction of `1 / (fdatasync + round trip)` (`ours_sync_fraction_of_limit`, target >= 0.7). The same
one-at-a-time run against ours with the memory store (`ours_memory_sync_128_msgs_per_s`: everything a
publish costs but the disk) bounds what this design can reach: `ours_sync_ceiling_fraction` is
`1 / (fdatasync + 1 / that rate)` as a fraction of the limit.
Two floors under that limit are measured in the same run by `bench/floor_server.py`, a server that
appends, fdatasyncs and echoes and does nothing else, with a blocking client
(`floor_blocking_fraction_of_limit`: plain blocking calls; `floor_trio_fraction_of_limit`: on Trio, as
our server is): what any server reaches at best, and what one on Trio reaches at best.
With `--clients node` (or `both`): 128 B with Node clients on both sides, ours and JetStream: pipelined
(`node_ours_async_128_msgs_per_s`, `node_ratio_async_vs_jetstream`, server CPU per message) and one at a
time against JetStream with an fsync per write (`node_ours_sync_128_msgs_per_s`,
`node_ratio_sync_vs_jetstream_sync`, `node_ours_sync_fraction_of_limit`); and, when nats-streaming-server
is at hand (`STAN_SERVER`, else ../shared/peers), against it with the same node-nats-streaming client:
`node_ratio_async_vs_stan` (target >= 1.5), `node_ratio_sync_vs_stan`, `node_cpu_ratio_<mode>_vs_stan`
(server CPU per message, ours / it; target <= 1.0 pipelined). node-nats-streaming runs on one thread:
`node_<system>_<mode>_128_client_busy` is the share of a core that thread used, and
`node_client_ceiling_<mode>_vs_stan` the rate at which it would be busy all the time (against ours)
over nats-streaming-server's rate, the most any server can show against it with this client.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.load import jetstream_publish, publish_pipelined, redis_xadd, sequential_rate  # noqa: E402
from bench.node_clients import NODE_SYSTEMS, run_node  # noqa: E402
from bench.peers import SYSTEMS  # noqa: E402
from bench.report import arguments, bar_plot, machine, print_report, progress  # noqa: E402
from streaming.client import connect  # noqa: E402

SIZES = {"128": 128, "4k": 4096}
SEQUENTIAL_SECONDS = 5.0
_RECORD = 186  # bytes of journal per 128 B message published alone (header, head, payload)
_PUB_FRAME = 266  # bytes of the NATS PUB carrying one 128 B STAN publish


async def _ours(port: int, size: int, n_async: int, n_sync: int) -> tuple[float, float]:
    payload = b"x" * size
    async with connect("test-cluster", "bench-publish", port=port) as sc:
        for _ in range(200):
            await sc.publish_async("warm", payload)
        await sc.wait_pub_acks()
        started = time.perf_counter()
        futures = await publish_pipelined(sc, "async", n_async, payload)
        await sc.wait_pub_acks()
        assert all(f.error == "" for f in futures)
        rate_async = n_async / (time.perf_counter() - started)
        return rate_async, await sequential_rate(partial(sc.publish, "sync", payload), n_sync, SEQUENTIAL_SECONDS)


async def _jetstream(port: int, size: int, n_async: int, n_sync: int) -> tuple[float, float]:
    import nats
    from nats.js.api import StorageType

    payload = b"x" * size
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        js = nc.jetstream()
        for name in ("async", "sync", "warm"):
            await js.add_stream(name=name.upper(), subjects=[name], storage=StorageType.FILE)
        for _ in range(200):
            await js.publish_async("warm", payload)
        await js.publish_async_completed()
        started = time.perf_counter()
        await jetstream_publish(js, "async", n_async, payload, window=n_async)  # one window: all in flight
        rate_async = n_async / (time.perf_counter() - started)
        return rate_async, await sequential_rate(partial(js.publish, "sync", payload), n_sync, SEQUENTIAL_SECONDS)
    finally:
        await nc.close()


async def _redis(port: int, size: int, n_async: int, n_sync: int) -> tuple[float, float]:
    import redis.asyncio as aioredis

    payload = b"x" * size
    r = aioredis.Redis(port=port)
    try:
        await r.xadd("warm", {"d": payload})
        started = time.perf_counter()
        await redis_xadd(r, "async", n_async, payload)
        rate_async = n_async / (time.perf_counter() - started)
        return rate_async, await sequential_rate(partial(r.xadd, "sync", {"d": payload}), n_sync, SEQUENTIAL_SECONDS)
    finally:
        await r.aclose()


def _run(system: str, port: int, size: int, n_async: int, n_sync: int) -> tuple[float, float]:
    if system == "ours":
        return trio.run(_ours, port, size, n_async, n_sync)
    client: Callable[..., Any] = _redis if system == "redis" else _jetstream
    result: tuple[float, float] = asyncio.run(client(port, size, n_async, n_sync))
    return result


def physical_limit(samples: int = 300) -> tuple[float, float]:
    """The floor under one publish whose PubAck waits for the disk, on this machine now: the median
    fdatasync of a small append (in the temp directory the servers' data goes to) and the median
    loopback round trip of one small message between two sockets (seconds each)."""
    syncs: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-fsync-") as tmp:
        # As the journal writes: records one after the other (186 B: the journal's record of one 128 B
        # message) in a preallocated file, so there is no size change to flush. A record per 4 KiB
        # block instead would make every fdatasync also commit the block's first write (ext4 marks
        # fallocated blocks unwritten until then), about 0.07 ms more here than the journal pays.
        fd = os.open(os.path.join(tmp, "probe"), os.O_RDWR | os.O_CREAT)
        try:
            os.posix_fallocate(fd, 0, samples * _RECORD)
            os.fsync(fd)
            for i in range(samples):
                os.pwrite(fd, b"x" * _RECORD, i * _RECORD)
                started = time.perf_counter()
                os.fdatasync(fd)
                syncs.append(time.perf_counter() - started)
        finally:
            os.close(fd)
    # The echo runs in a process of its own, as a server does: a thread of this one would be woken by
    # the same process, which is not what a publish pays.
    with _floor_client("echo") as client:
        trips: list[float] = []
        for _ in range(samples):
            started = time.perf_counter()
            client.sendall(b"p")
            client.recv(64)
            trips.append(time.perf_counter() - started)
    return statistics.median(syncs), statistics.median(trips)


def floor_rate(kind: str, count: int = 3000) -> float:
    """Requests per second, one at a time, that `bench/floor_server.py` answers with `kind`
    ("blocking" or "trio") to a blocking client: a publish-sized request, a 186-byte append and an
    fdatasync, the request echoed back. The best a server can do (blocking), and on Trio."""
    request = b"x" * _PUB_FRAME
    with _floor_client(kind) as client:

        def one() -> None:
            client.sendall(request)
            left = len(request)
            while left:
                left -= len(client.recv(65536))

        for _ in range(300):
            one()
        started = time.perf_counter()
        for _ in range(count):
            one()
        return count / (time.perf_counter() - started)


@contextmanager
def _floor_client(kind: str) -> Iterator[socket.socket]:
    """A blocking client socket (TCP_NODELAY) connected to `bench/floor_server.py` of `kind`, in a
    process of its own; stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        argv = [sys.executable, str(ROOT / "bench" / "floor_server.py"), tmp, kind]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            try:
                with socket.create_connection(("127.0.0.1", int(proc.stdout.readline()))) as client:
                    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    yield client
            finally:
                proc.kill()


def cases(quick: bool) -> Iterator[tuple[str, int, int, int]]:
    """(size key, bytes, pipelined count, sequential count)."""
    yield "128", 128, (20_000 if quick else 100_000), (300 if quick else 3_000)
    yield "4k", 4096, (5_000 if quick else 20_000), (300 if quick else 2_000)


def main() -> None:
    parser = arguments(__doc__, quick="smaller runs (under a minute)", plot="bar chart of every case")
    parser.add_argument(
        "--clients",
        choices=["python", "node", "both"],
        default="python",
        help="who publishes: our Python client and nats-py / redis-py (default), Node clients on both sides "
        "(node-nats-streaming, nats.js 2.x; ours and JetStream, 128 B pipelined and one at a time), or both",
    )
    args = parser.parse_args()
    console = Console(stderr=args.json)
    result: dict[str, Any] = {
        "scale": "quick" if args.quick else "full",
        "machine": machine(),
    }
    python, node = args.clients in ("python", "both"), args.clients in ("node", "both")
    rows: list[tuple[str, str, str]] = []
    if node:
        _node_cases(result, rows, args.quick)
    if python:
        _python_cases(result, rows, list(cases(args.quick)), console)
    _sync_limits(result, rows, python, node, args.quick)
    print_report(console, f"durable publish, msgs/s ({result['scale']})", rows, result, args.json)
    if args.plot and python:
        groups = {
            f"{'pipelined' if mode == 'async' else 'sequential'} {size_key}": {
                system: float(result[f"{system}_{mode}_{size_key}_msgs_per_s"]) for system in SYSTEMS
            }
            for mode in ("async", "sync")
            for size_key in SIZES
        }
        bar_plot(args.plot, "durable publish", "messages/s (log)", groups, log=True)


def _node_cases(result: dict[str, Any], rows: list[tuple[str, str, str]], quick: bool) -> None:
    """Node clients on both sides, 128 B: pipelined against JetStream's default, and one at a time
    against JetStream with an fsync per write; then both against nats-streaming-server when it is at
    hand, with the same client as ours."""
    pipelined, sequential = (50_000, 2_000) if quick else (200_000, 10_000)
    _node_pair(result, rows, "publish", "jetstream", pipelined, ("<= 6 µs", ">= 3"))
    _node_pair(result, rows, "sequential", "jetstream_sync", sequential, ("", ""))
    if "stan" in NODE_SYSTEMS:  # the server ours replaces
        for workload, count, target in (("publish", pipelined, "<= 1.0"), ("sequential", sequential, "")):
            mine_us, theirs_us = _node_pair(result, rows, workload, "stan", count, ("", ">= 1.5" if target else ""))
            mode = "async" if workload == "publish" else "sync"
            cpu = result[f"node_cpu_ratio_{mode}_vs_stan"] = round(mine_us / theirs_us, 3)
            rows.append((f"  {mode}: server CPU per message, ours / it ({theirs_us:.2f} µs)", f"{cpu:.2f}", target))


def _node_pair(
    result: dict[str, Any],
    rows: list[tuple[str, str, str]],
    workload: str,
    peer: str,
    count: int,
    targets: tuple[str, str],
) -> tuple[float, float]:
    """One Node workload against ours and `peer`, one after the other: rates, server CPU per message and
    the ratio, under `node_<system>_<mode>_128_...` (ours': its first pair's) and
    `node_ratio_<mode>_vs_<peer>` (mode: async or sync). Returns both servers' CPU µs per message."""
    mode = "async" if workload == "publish" else "sync"
    runs = {system: run_node(system, workload, count, 1, False, count) for system in ("ours", peer)}
    for system, run in runs.items():
        result.setdefault(f"node_{system}_{mode}_128_msgs_per_s", round(run.msgs_per_s))
        result.setdefault(f"node_{system}_{mode}_128_server_us_per_msg", round(run.server_us_per_msg, 2))
        result.setdefault(f"node_{system}_{mode}_128_client_busy", run.client_busy)
    mine, mine_us = runs["ours"].msgs_per_s, runs["ours"].server_us_per_msg
    theirs, theirs_us = runs[peer].msgs_per_s, runs[peer].server_us_per_msg
    ratio = result[f"node_ratio_{mode}_vs_{peer}"] = round(mine / theirs, 3)
    if peer == "stan":  # the same client on both: the most any server could show against it with it
        ceiling = runs["ours"].client_ceiling / theirs  # its main thread busy all the time
        result.setdefault(f"node_client_ceiling_{mode}_vs_stan", round(ceiling, 3))
    rows.append((f"node clients, {mode} 128 B: ours", f"{mine:,.0f} ({mine_us:.2f} µs server CPU each)", targets[0]))
    rows.append((f"node clients, {mode} 128 B: {peer} (ours / it)", f"{theirs:,.0f} ({ratio:.2f})", targets[1]))
    return mine_us, theirs_us


def _python_cases(
    result: dict[str, Any], rows: list[tuple[str, str, str]], todo: list[tuple[str, int, int, int]], console: Console
) -> None:
    """Every system with its Python client: pipelined and one at a time, 128 B and 4 KiB."""
    with progress(console) as bar:
        task = bar.add_task("publish", total=len(SYSTEMS) * len(todo))
        for system in SYSTEMS:
            for size_key, size, n_async, n_sync in todo:
                bar.update(task, description=f"{system}, {size_key} B")
                with peers.start(system) as server:  # a fresh server per case: no case sees another's data
                    rate_async, rate_sync = _run(system, server.port, size, n_async, n_sync)
                result[f"{system}_async_{size_key}_msgs_per_s"] = round(rate_async)
                result[f"{system}_sync_{size_key}_msgs_per_s"] = round(rate_sync)
                bar.advance(task)
    for mode in ("async", "sync"):
        for size_key in SIZES:
            suffix = "" if size_key == "128" else "_4k"
            mine = result[f"ours_{mode}_{size_key}_msgs_per_s"]
            rows.append((f"{mode} {size_key} B: ours", f"{mine:,}", ""))
            for peer in SYSTEMS[1:]:
                theirs = result[f"{peer}_{mode}_{size_key}_msgs_per_s"]
                ratio = result[f"ratio_{mode}{suffix}_vs_{peer}"] = round(mine / theirs, 3)
                target = ">= 2.5" if (mode, size_key, peer) == ("async", "128", "jetstream") else ""
                if (mode, size_key, peer) == ("sync", "128", "jetstream"):
                    target = ">= 1.5"
                rows.append((f"{mode} {size_key} B: {peer} (ours / it)", f"{theirs:,} ({ratio:.2f})", target))
    # What this design allows at best: the same run with the memory store (no disk at all) gives the
    # time a publish costs besides its fsync; `_sync_limits` adds one fdatasync to it.
    _, size, n_async, n_sync = todo[0]
    with peers.ours("-st", "memory") as server:
        _, memory_rate = _run("ours", server.port, size, n_async, n_sync)
    result["ours_memory_sync_128_msgs_per_s"] = round(memory_rate)


def _sync_limits(
    result: dict[str, Any], rows: list[tuple[str, str, str]], python: bool, node: bool, quick: bool
) -> None:
    """One publish at a time as a fraction of the physical limit, and of the two floors under it that
    do no work of a server's (`bench/floor_server.py`): blocking calls, and Trio."""
    fsync_s, rtt_s = physical_limit()
    limit = 1 / (fsync_s + rtt_s)
    result["fdatasync_ms"], result["loopback_rtt_ms"] = round(fsync_s * 1000, 3), round(rtt_s * 1000, 3)
    result["sync_limit_msgs_per_s"] = round(limit)
    limit_text = f"1 / (fdatasync {fsync_s * 1000:.3f} ms + round trip {rtt_s * 1000:.3f} ms)"
    for kind in ("blocking", "trio"):
        rate = floor_rate(kind, 1_000 if quick else 3_000)
        result[f"floor_{kind}_msgs_per_s"] = round(rate)
        fraction = result[f"floor_{kind}_fraction_of_limit"] = round(rate / limit, 3)
        rows.append((f"sync: append + fdatasync + echo, {kind} server / limit", f"{rate:,.0f}/s; {fraction:.2f}", ""))
    if python:
        fraction = result["ours_sync_fraction_of_limit"] = round(result["ours_sync_128_msgs_per_s"] / limit, 3)
        rows.append((f"sync 128 B: ours / ({limit_text})", f"{fraction:.2f} of {limit:,.0f}/s", ">= 0.7"))
        memory_rate = result["ours_memory_sync_128_msgs_per_s"]
        ceiling = result["ours_sync_ceiling_fraction"] = round(1 / (fsync_s + 1 / memory_rate) / limit, 3)
        rows.append(
            (
                "sync 128 B: ours with the memory store (no disk); the best fraction that leaves",
                f"{memory_rate:,.0f}/s; {ceiling:.2f}",
                "",
            )
        )
    if node:
        rate = result["node_ours_sync_128_msgs_per_s"]
        fraction = result["node_ours_sync_fraction_of_limit"] = round(rate / limit, 3)
        rows.append((f"node clients, sync 128 B: ours / ({limit_text})", f"{fraction:.2f} of {limit:,.0f}/s", ""))


if __name__ == "__main__":
    main()
