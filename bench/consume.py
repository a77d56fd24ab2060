"""Push delivery with a manual ack per message (MaxInflight 1024) against real peers, same run.

    python bench/consume.py [--quick] [--json] [--plot FILE.png] [--clients python|node|both]

Each case pre-publishes a channel, then times from subscribing to the last message received and acked:
- `1sub`: one subscriber reads the channel;
- `10subs`: ten independent subscribers each read the whole channel (deliveries = 10 x messages);
- `queue4`: a queue group of four members shares the channel.
Every subscriber has its own connection, all in this process. Systems:
- ours: STAN subscriptions (MaxInflight 1024, manual ack), our client (under Trio);
- jetstream / jetstream_sync: push consumers (DeliverAll, AckExplicit, max_ack_pending 1024; the queue
  group is one consumer with a deliver group, so its 1024 is shared by the members), nats-py;
- redis: XREADGROUP (COUNT up to 1024 minus what is unacked; a consumer group per subscriber, one group
  with four consumers for the queue), one XACK per message, sent in a pipeline per batch, redis-py.

With `--clients node` (or `both`) the same cases run with Node clients on both sides: ours, JetStream,
and nats-streaming-server when it is at hand (`STAN_SERVER`, else ../shared/peers; its FILE store at its
defaults) (`bench/node/clients.js`: node-nats-streaming 0.3.2 against ours and nats-streaming-server,
nats.js 2.x with `consumers.get(...).consume()` against a file stream; `npm ci --prefix bench/node`
first): keys `node_<system>_<case>_...`, `node_ratio_<case>_vs_jetstream`, `node_ratio_<case>_vs_stan`
(target >= 1.5) and `node_cpu_ratio_<case>_vs_stan` (server CPU per delivery, ours / it; target <= 1.0).
The subscribers all live in one Node process, whose main thread does their work: `node_<system>_<case>_
client_busy` is the share of a core it used, and `node_client_ceiling_<case>_vs_stan` the rate at which it
would be busy all the time (against ours) over nats-streaming-server's rate: the most any server can
show against it with this client on this machine.
Python clients are slow at consuming from JetStream, which flatters our ratio; the Node figures are the
fair one.

Figures are deliveries per second (acked), and the server process's CPU time per delivery over the
consume phase (user + system, all its threads; psutil). JSON keys: `<system>_<case>_msgs_per_s`,
`<system>_<case>_server_us_per_msg`,
`ratio_<case>_vs_<peer>` and `ratio_vs_jetstream` (the 1-subscriber case; target >= 1.0).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.load import jetstream_publish, publish_pipelined, redis_xadd  # noqa: E402
from bench.node_clients import NODE_SYSTEMS, NodeRun, ServerCpu, run_node  # noqa: E402
from bench.peers import SYSTEMS  # noqa: E402
from bench.report import arguments, bar_plot, machine, print_report, progress  # noqa: E402
from streaming.client import StartPosition, connect  # noqa: E402

PAYLOAD = b"x" * 128
CASES = {"1sub": (1, False), "10subs": (10, False), "queue4": (4, True)}  # subscribers, queue group


def expected(case: str, messages: int) -> int:
    subscribers, queue = CASES[case]
    return messages if queue else subscribers * messages


async def _ours(port: int, case: str, messages: int, cpu: ServerCpu) -> float:
    subscribers, queue = CASES[case]
    async with connect("test-cluster", "bench-pub", port=port) as sc:
        await publish_pipelined(sc, "consume", messages, PAYLOAD)
        await sc.wait_pub_acks()
    total = expected(case, messages)
    received = 0
    done = trio.Event()
    loops = [trio.CancelScope() for _ in range(subscribers)]  # cancelled at the end; the rest exits cleanly

    async def member(i: int) -> None:
        nonlocal received
        async with connect("test-cluster", f"bench-sub-{i}", port=port) as sc:
            options: dict[str, Any] = {"queue": "workers"} if queue else {}
            async with sc.subscribe(
                "consume", start_at=StartPosition.FIRST, max_inflight=1024, manual_ack=True, **options
            ) as sub:
                with loops[i]:
                    while received < total:
                        msg = await sub.next_msg()
                        msg.ack()
                        received += 1
                done.set()
                for scope in loops:
                    scope.cancel()

    cpu.start()
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(subscribers):
            nursery.start_soon(member, i)
        await done.wait()
        elapsed = time.perf_counter() - started
        cpu.stop()
    return total / elapsed


async def _until_done(
    member: Callable[[int], Coroutine[Any, Any, None]], subscribers: int, done: asyncio.Event, started: float
) -> float:
    """Run the members (asyncio) until one sets `done`; the seconds since `started`."""
    tasks = [asyncio.create_task(member(i)) for i in range(subscribers)]
    await done.wait()
    elapsed = time.perf_counter() - started
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return elapsed


async def _jetstream(port: int, case: str, messages: int, cpu: ServerCpu) -> float:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

    subscribers, queue = CASES[case]
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(name="CONSUME", subjects=["consume"], storage=StorageType.FILE)
    await jetstream_publish(js, "consume", messages, PAYLOAD)
    total = expected(case, messages)
    received = 0
    done = asyncio.Event()
    conns = [await nats.connect(f"nats://127.0.0.1:{port}") for _ in range(subscribers)]

    def config() -> ConsumerConfig:  # a new one each time: nats-py fills in the one it is given
        return ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=1024, deliver_policy=DeliverPolicy.ALL)

    cpu.start()
    started = time.perf_counter()
    queue_subs = []
    if queue:  # the members one after another, so that the group's consumer is made once
        for conn in conns:
            queue_subs.append(
                await conn.jetstream().subscribe(
                    "consume", queue="workers", durable="workers", config=config(), manual_ack=True
                )
            )

    async def member(i: int) -> None:
        nonlocal received
        if queue:
            sub = queue_subs[i]
        else:
            sub = await conns[i].jetstream().subscribe("consume", durable=f"d{i}", config=config(), manual_ack=True)
        while received < total:
            msg = await sub.next_msg(timeout=60)
            await msg.ack()
            received += 1
        done.set()

    elapsed = await _until_done(member, subscribers, done, started)
    cpu.stop()
    for conn in [*conns, nc]:
        await conn.close()
    return total / elapsed


async def _redis(port: int, case: str, messages: int, cpu: ServerCpu) -> float:
    import redis.asyncio as aioredis

    subscribers, queue = CASES[case]
    r = aioredis.Redis(port=port)
    await redis_xadd(r, "consume", messages, PAYLOAD)
    groups = ["workers"] if queue else [f"g{i}" for i in range(subscribers)]
    for group in groups:
        await r.xgroup_create("consume", group, id="0")
    total = expected(case, messages)
    received = 0
    done = asyncio.Event()
    conns = [aioredis.Redis(port=port) for _ in range(subscribers)]

    async def member(i: int) -> None:
        nonlocal received
        conn, group = conns[i], groups[0] if queue else groups[i]
        while received < total:
            reply = await conn.xreadgroup(group, f"c{i}", {"consume": ">"}, count=1024, block=1000)
            if not reply:
                continue
            entries = cast(list[tuple[bytes, Any]], reply[0][1])  # type: ignore[index]
            pipe = conn.pipeline(transaction=False)
            for entry_id, _fields in entries:
                pipe.xack("consume", group, entry_id)  # one XACK per message, as the others ack
            await pipe.execute()
            received += len(entries)
        done.set()

    cpu.start()
    elapsed = await _until_done(member, subscribers, done, time.perf_counter())
    cpu.stop()
    for conn in [*conns, r]:
        await conn.aclose()
    return total / elapsed


def run_node_case(system: str, case: str, messages: int) -> NodeRun:
    subscribers, queue = CASES[case]
    return run_node(system, "consume", messages, subscribers, queue, expected(case, messages))


def run_case(system: str, case: str, messages: int) -> tuple[float, float]:
    """Deliveries per second, and the server's CPU µs per delivery (acked) over the consume phase."""
    with peers.start(system) as server:
        cpu = ServerCpu(server.pid)
        if system == "ours":
            rate = trio.run(_ours, server.port, case, messages, cpu)
        elif system == "redis":
            rate = asyncio.run(_redis(server.port, case, messages, cpu))
        else:
            rate = asyncio.run(_jetstream(server.port, case, messages, cpu))
    return rate, cpu.seconds / expected(case, messages) * 1e6


def main() -> None:
    parser = arguments(__doc__, quick="smaller runs (under a minute)", plot="bar chart of every case")
    parser.add_argument(
        "--clients",
        choices=["python", "node", "both"],
        default="python",
        help="who drives the workload: our Python clients and nats-py / redis-py (default), Node clients on "
        "both sides (node-nats-streaming, nats.js 2.x; ours, JetStream and nats-streaming-server), or both",
    )
    args = parser.parse_args()
    console = Console(stderr=args.json)
    # Messages in the channel per case (10subs reads each of them ten times).
    sizes = (
        {"1sub": 10_000, "10subs": 2_000, "queue4": 10_000}
        if args.quick
        else {"1sub": 50_000, "10subs": 10_000, "queue4": 50_000}
    )
    result: dict[str, Any] = {
        "scale": "quick" if args.quick else "full",
        "machine": machine(),
    }
    python, node = args.clients in ("python", "both"), args.clients in ("node", "both")
    todo = [(s, "python") for s in SYSTEMS if python] + [(s, "node") for s in NODE_SYSTEMS if node]
    with progress(console) as bar:
        task = bar.add_task("consume", total=len(todo) * len(CASES))
        for system, clients in todo:
            for case, messages in sizes.items():
                bar.update(task, description=f"{system}, {case} ({clients} clients)")
                if clients == "node":
                    run = run_node_case(system, case, messages * 2)
                    rate, cpu_us, key = run.msgs_per_s, run.server_us_per_msg, f"node_{system}_{case}"
                    result[f"{key}_client_busy"] = run.client_busy
                    result[f"{key}_client_ceiling_msgs_per_s"] = round(run.client_ceiling)
                else:
                    rate, cpu_us = run_case(system, case, messages)
                    key = f"{system}_{case}"
                result[f"{key}_msgs_per_s"] = round(rate)
                result[f"{key}_server_us_per_msg"] = round(cpu_us, 2)
                bar.advance(task)
    rows: list[tuple[str, str, str]] = []
    if python:
        for case in CASES:
            mine = result[f"ours_{case}_msgs_per_s"]
            mine_us = result[f"ours_{case}_server_us_per_msg"]
            rows.append((f"{case}: ours", f"{mine:,} ({mine_us} µs server CPU each)", ""))
            for peer in SYSTEMS[1:]:
                theirs = result[f"{peer}_{case}_msgs_per_s"]
                ratio = result[f"ratio_{case}_vs_{peer}"] = round(mine / theirs, 3)
                target = ">= 1.0" if (case, peer) == ("1sub", "jetstream") else ""
                theirs_us = result[f"{peer}_{case}_server_us_per_msg"]
                rows.append((f"{case}: {peer} (ours / it)", f"{theirs:,} ({ratio:.2f}; {theirs_us} µs)", target))
        result["ratio_vs_jetstream"] = result["ratio_1sub_vs_jetstream"]
    if node:
        for case in CASES:
            mine, theirs = result[f"node_ours_{case}_msgs_per_s"], result[f"node_jetstream_{case}_msgs_per_s"]
            ratio = result[f"node_ratio_{case}_vs_jetstream"] = round(mine / theirs, 3)
            mine_us = result[f"node_ours_{case}_server_us_per_msg"]
            rows.append((f"node clients, {case}: ours", f"{mine:,} ({mine_us} µs server CPU each)", "<= 10 µs"))
            target = ">= 1.5" if case == "1sub" else ">= 1.2"
            rows.append((f"node clients, {case}: jetstream (ours / it)", f"{theirs:,} ({ratio:.2f})", target))
            if "stan" in NODE_SYSTEMS:  # the server ours replaces, the same client on both
                theirs, theirs_us = (
                    result[f"node_stan_{case}_msgs_per_s"],
                    result[f"node_stan_{case}_server_us_per_msg"],
                )
                ratio = result[f"node_ratio_{case}_vs_stan"] = round(mine / theirs, 3)
                cpu = result[f"node_cpu_ratio_{case}_vs_stan"] = round(mine_us / theirs_us, 3)
                # The most any server could show against it with this client: the client's ceiling in
                # the run against ours (its main thread busy all the time) over its rate.
                ceiling = result[f"node_client_ceiling_{case}_vs_stan"] = round(
                    result[f"node_ours_{case}_client_ceiling_msgs_per_s"] / theirs, 3
                )
                rows.append(
                    (f"node clients, {case}: nats-streaming-server (ours / it)", f"{theirs:,} ({ratio:.2f})", ">= 1.5")
                )
                rows.append((f"  server CPU per message, ours / it ({theirs_us} µs)", f"{cpu:.2f}", "<= 1.0"))
                busy = result[f"node_ours_{case}_client_busy"]
                rows.append((f"  client's ceiling / its rate (client {busy:.0%} busy)", f"{ceiling:.2f}", ""))
    print_report(console, f"consume with an ack per message, deliveries/s ({result['scale']})", rows, result, args.json)
    if args.plot and python:
        groups = {case: {s: float(result[f"{s}_{case}_msgs_per_s"]) for s in SYSTEMS} for case in CASES}
        bar_plot(args.plot, "push delivery, ack per message", "deliveries/s", groups)


if __name__ == "__main__":
    main()
