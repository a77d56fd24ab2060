"""Publish-to-delivery latency at a fixed rate (2,000 msgs/s), ours vs NATS JetStream and
nats-streaming-server, same run.

    python bench/latency.py [--quick] [--json] [--plot FILE.png] [--systems ours,...] [--runs N]

One process publishes at a steady 2,000 messages/s (each message carries its send time; the
publisher does not wait for PubAcks, which are collected as they come) and a subscriber on another
connection in the same process acks each message; latency = arrival - send, same clock. The first
0.5 s are warm-up and not counted. Full: 10 s per system; quick: 4 s. Each server runs on the last
CPU and the clients on the others (`peers.pin_apart`; `--no-pin` to leave them where Linux puts them).
- ours: durable publish (PubAck after fsync) to a STAN subscription (manual ack), our client (under Trio);
- ours_nosync: the same with `--file_sync=false` (commits flushed every second, not each one): what
  JetStream's default promises, so like for like with it;
- jetstream: `publish_async` to a stream, push consumer (AckExplicit), nats-py; at its default a
  message is delivered before any fsync;
- jetstream_sync: the same with `sync_interval: always` (an fsync per write, as ours): like for like;
- stan: nats-streaming-server (FILE store, its defaults: fsync per flushed batch), driven exactly as
  ours by our client; skipped when its binary is absent (`STAN_SERVER`, else ../shared/peers).

`--systems ours --runs 4` runs ours alone four times (each figure the median over the runs): how the
changes behind bench/README.md's latency figures were compared. The plot shows each system's last run.

JSON keys: `<system>_p50_ms`, `<system>_p99_ms`, `<system>_max_ms`; ours also as `p50_ms`,
`p99_ms`; `p50_ratio_vs_jetstream`, `p99_ratio_vs_jetstream` = ours / JetStream's (target <= 1: no
worse), `*_ratio_vs_jetstream_sync` against the syncing JetStream, `*_ratio_vs_stan` against
nats-streaming-server; `nosync_p50_ratio_vs_jetstream`,
`nosync_p99_ratio_vs_jetstream` = ours_nosync / JetStream's default.
"""

from __future__ import annotations

import asyncio
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.report import arguments, machine, print_report, progress  # noqa: E402
from streaming.client import connect  # noqa: E402

RATE = 2_000
WARMUP = 0.5
STAMP = struct.Struct("<q")
FILLER = b"x" * 120  # 128-byte messages with the stamp


def _payload() -> bytes:
    return STAMP.pack(time.perf_counter_ns()) + FILLER


def _latency_ms(data: bytes) -> float:
    sent: int = STAMP.unpack_from(data)[0]
    return (time.perf_counter_ns() - sent) / 1e6


async def _ours(port: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    total = int(RATE * seconds)
    async with (
        connect("test-cluster", "bench-lat-sub", port=port) as sub_conn,
        connect("test-cluster", "bench-lat-pub", port=port) as pub,
        sub_conn.subscribe("latency", manual_ack=True) as sub,
    ):

        async def publisher() -> None:
            start = trio.current_time()
            for i in range(total):
                await trio.sleep_until(start + i / RATE)
                await pub.publish_async("latency", _payload())
            await pub.wait_pub_acks()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publisher)
            for i in range(total):
                msg = await sub.next_msg()
                if i >= RATE * WARMUP:
                    latencies.append(_latency_ms(msg.data))
                msg.ack()
    return latencies


async def _jetstream(port: int, seconds: float) -> list[float]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType

    latencies: list[float] = []
    total = int(RATE * seconds)
    nc_sub = await nats.connect(f"nats://127.0.0.1:{port}")
    nc_pub = await nats.connect(f"nats://127.0.0.1:{port}")
    js_pub = nc_pub.jetstream()
    await js_pub.add_stream(name="LATENCY", subjects=["latency"], storage=StorageType.FILE)
    sub = await nc_sub.jetstream().subscribe(
        "latency", durable="lat", config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT), manual_ack=True
    )
    loop = asyncio.get_running_loop()

    async def publisher() -> None:
        start = loop.time()
        futures = []
        for i in range(total):
            delay = start + i / RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            futures.append(await js_pub.publish_async("latency", _payload()))
        await asyncio.gather(*futures)

    task = asyncio.create_task(publisher())
    for i in range(total):
        msg = await sub.next_msg(timeout=30)
        if i >= RATE * WARMUP:
            latencies.append(_latency_ms(msg.data))
        await msg.ack()
    await task
    await nc_sub.close()
    await nc_pub.close()
    return latencies


def _figures(latencies: list[float]) -> dict[str, float]:
    ms = sorted(latencies)
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
        "max_ms": round(ms[-1], 3),
    }


def run(system: str, seconds: float, pin: bool = True) -> list[float]:
    with peers.start(system) as server:
        if pin:
            peers.pin_apart(server)
        if system.startswith("ours") or system == "stan":  # both STAN servers: the same client
            return trio.run(_ours, server.port, seconds)
        return asyncio.run(_jetstream(server.port, seconds))


SYSTEMS = ("ours", "ours_nosync", "jetstream", "jetstream_sync", *(("stan",) if peers.stan_binary() else ()))


def main() -> None:
    parser = arguments(__doc__, quick="4 s per system", plot="latency distribution (CDF) of each system")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="which to run, comma-separated (default: all)")
    parser.add_argument("--runs", type=int, default=1, help="runs per system; each figure is the median over the runs")
    parser.add_argument("--no-pin", action="store_true", help="leave the server and the clients where Linux puts them")
    args = parser.parse_args()
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    if not systems or args.runs < 1:
        parser.error(f"--systems takes some of {', '.join(SYSTEMS)}; --runs is at least 1")
    console = Console(stderr=args.json)
    seconds = 4.0 if args.quick else 10.0
    result: dict[str, Any] = {
        "scale": "quick" if args.quick else "full",
        "machine": machine(),
        "rate_msgs_per_s": RATE,
        "seconds": seconds,
        "runs": args.runs,
        "pinned": not args.no_pin,
    }
    samples: dict[str, list[float]] = {}
    with progress(console) as bar:
        task = bar.add_task("latency", total=len(systems) * args.runs)
        for system in systems:
            bar.update(task, description=system)
            runs = []
            for _ in range(args.runs):
                samples[system] = run(system, seconds, pin=not args.no_pin)
                runs.append(_figures(samples[system]))
                bar.advance(task)
            for key in runs[0]:
                result[f"{system}_{key}"] = round(statistics.median(r[key] for r in runs), 3)
    if "ours" in systems:
        result["p50_ms"], result["p99_ms"] = result["ours_p50_ms"], result["ours_p99_ms"]
    # (ours, peer, key prefix): ours against both JetStreams; ours_nosync against the default one.
    pairs = [("ours", peer, "") for peer in ("jetstream", "jetstream_sync", "stan")]
    pairs.append(("ours_nosync", "jetstream", "nosync_"))
    pairs = [(mine, peer, prefix) for mine, peer, prefix in pairs if mine in systems and peer in systems]
    rows = [(f"{s}: {q}", f"{result[f'{s}_{q}']:.3f}", "") for s in systems for q in ("p50_ms", "p99_ms", "max_ms")]
    for mine, peer, prefix in pairs:
        for q in ("p50", "p99"):
            key = f"{prefix}{q}_ratio_vs_{peer}"
            result[key] = round(result[f"{mine}_{q}_ms"] / result[f"{peer}_{q}_ms"], 3)
            rows.append((key, f"{result[key]:.2f}", "<= 1" if key.startswith("p") and peer == "jetstream" else ""))
    print_report(console, f"publish -> deliver latency at {RATE:,} msgs/s ({result['scale']})", rows, result, args.json)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 4))
        for system, values in samples.items():
            ms = sorted(values)
            ax.plot(ms, [i / len(ms) for i in range(len(ms))], label=system)
        ax.set_xscale("log")
        ax.set_xlabel("publish -> deliver latency (ms, log)")
        ax.set_ylabel("fraction of messages")
        ax.set_title(f"latency at {RATE:,} msgs/s")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main()
