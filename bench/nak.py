"""Negative acks with a delay against JetStream's: how close to its delay a nak'd message comes back.

    python bench/nak.py [--quick] [--json]

10,000 messages (2,000 with --quick) are published; one subscriber gives each back on its first
arrival with a nak of 1 s and acks it when it comes again. Lateness = the second arrival - (the
nak + 1 s), measured in the subscriber's process (it includes one trip to the client). Server CPU is
the server process's user + system time over the consuming phase (naks, redeliveries and acks),
per message.
- ours: a STAN subscription (AckWait 30 s, MaxInflight above the count), `msg.nak(delay=1.0)` (our
  extension; docs/protocol.md);
- jetstream: a push consumer (ack_wait 30 s, max_ack_pending above the count), nats-py's
  `msg.nak(delay=1.0)` (`-NAK {"delay": ns}`).
Each server runs on the last CPU and the clients on the others (`peers.pin_apart`).

JSON keys: `<system>_lateness_p50_ms/_p99_ms/_max_ms`, `<system>_back_once_fraction` (each nak'd message
came back exactly once), `<system>_server_us_per_msg`; `lateness_p99_ratio_vs_jetstream` and
`server_cpu_ratio_vs_jetstream` = ours / theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.load import jetstream_publish, publish_pipelined  # noqa: E402
from bench.node_clients import ServerCpu  # noqa: E402
from bench.report import arguments, machine, print_report, progress, spread_ms  # noqa: E402
from streaming.client import StartPosition, connect  # noqa: E402

PAYLOAD = b"x" * 128
DELAY = 1.0
LINGER = 1.5  # after the last one came back: long enough for a third arrival to show up
LIMIT = 60.0
SYSTEMS = ("ours", "jetstream")


class Tally:
    """When each message was nak'd, how late it came back, and any arrival past the second."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.naked: dict[Any, float] = {}
        self.lateness: list[float] = []
        self.arrivals: Counter[Any] = Counter()

    def arrived(self, key: Any) -> bool:
        """Note an arrival; True when it is the first (to be nak'd: call `naked` right after)."""
        self.arrivals[key] += 1
        if self.arrivals[key] == 1:
            return True
        if self.arrivals[key] == 2:
            self.lateness.append(time.perf_counter() - (self.naked[key] + DELAY))
        return False

    def nak(self, key: Any) -> None:
        self.naked[key] = time.perf_counter()

    @property
    def all_back(self) -> bool:
        return len(self.lateness) >= self.count

    def figures(self) -> dict[str, float]:
        return {
            **spread_ms("lateness", (x * 1000 for x in self.lateness)),
            "early": sum(1 for x in self.lateness if x < 0),
            "back_once_fraction": round(sum(1 for n in self.arrivals.values() if n == 2) / self.count, 4),
        }


async def _ours(port: int, pid: int, count: int) -> dict[str, float]:
    tally = Tally(count)
    async with connect("test-cluster", "bench-nak", port=port) as sc:
        await publish_pipelined(sc, "naks", count, PAYLOAD)
        await sc.wait_pub_acks()
        cpu = ServerCpu(pid)
        cpu.start()
        async with sc.subscribe(
            "naks", start_at=StartPosition.FIRST, ack_wait=30, max_inflight=count + 1, manual_ack=True
        ) as sub:
            with trio.move_on_after(LIMIT):
                while not tally.all_back:
                    msg = await sub.next_msg()
                    if tally.arrived(msg.seq):
                        tally.nak(msg.seq)
                        msg.nak(DELAY)
                    else:
                        msg.ack()
            cpu.stop()
            with trio.move_on_after(LINGER):
                while True:
                    msg = await sub.next_msg()
                    tally.arrived(msg.seq)
                    msg.ack()
    return {**tally.figures(), "server_us_per_msg": round(cpu.seconds / count * 1e6, 2)}


async def _jetstream(port: int, pid: int, count: int) -> dict[str, float]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

    tally = Tally(count)
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(name="NAKS", subjects=["naks"], storage=StorageType.FILE)
    await jetstream_publish(js, "naks", count, PAYLOAD)
    back = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        key = msg.metadata.sequence.stream
        if tally.arrived(key):
            tally.nak(key)
            await msg.nak(delay=DELAY)
        else:
            await msg.ack()
        if tally.all_back:
            back.set()

    config = ConsumerConfig(
        ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_ack_pending=count + 1, deliver_policy=DeliverPolicy.ALL
    )
    cpu = ServerCpu(pid)
    cpu.start()
    sub = await js.subscribe("naks", durable="n", config=config, cb=on_msg, manual_ack=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(back.wait(), LIMIT)
    cpu.stop()
    await asyncio.sleep(LINGER)
    await sub.unsubscribe()
    await nc.close()
    return {**tally.figures(), "server_us_per_msg": round(cpu.seconds / count * 1e6, 2)}


def run(system: str, count: int) -> dict[str, float]:
    with peers.start(system) as server:
        peers.pin_apart(server)
        if system == "ours":
            return trio.run(_ours, server.port, server.pid, count)
        return asyncio.run(_jetstream(server.port, server.pid, count))


def main() -> None:
    args = arguments(__doc__, quick="2,000 messages instead of 10,000").parse_args()
    console = Console(stderr=args.json)
    count = 2_000 if args.quick else 10_000
    result: dict[str, Any] = {"scale": "quick" if args.quick else "full", "machine": machine(), "messages": count}
    with progress(console) as bar:
        task = bar.add_task("naks", total=len(SYSTEMS))
        for system in SYSTEMS:
            bar.update(task, description=system)
            for key, value in run(system, count).items():
                result[f"{system}_{key}"] = value
            bar.advance(task)
    result["lateness_p99_ratio_vs_jetstream"] = round(
        result["ours_lateness_p99_ms"] / result["jetstream_lateness_p99_ms"], 3
    )
    result["server_cpu_ratio_vs_jetstream"] = round(
        result["ours_server_us_per_msg"] / result["jetstream_server_us_per_msg"], 3
    )
    rows = []
    for system in SYSTEMS:
        for key, target in [
            ("lateness_p50_ms", ""),
            ("lateness_p99_ms", ""),
            ("lateness_max_ms", ""),
            ("early", "0"),
            ("back_once_fraction", "1.0"),
            ("server_us_per_msg", ""),
        ]:
            rows.append((f"{system}: {key}", f"{result[f'{system}_{key}']}", target))
    rows += [
        (key, f"{result[key]}", "") for key in ("lateness_p99_ratio_vs_jetstream", "server_cpu_ratio_vs_jetstream")
    ]
    print_report(console, f"{count:,} messages each nak'd once with a 1 s delay", rows, result, args.json)


if __name__ == "__main__":
    main()
