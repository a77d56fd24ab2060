"""One wildcard subscription over 1,000 channels against 1,000 plain subscriptions, same messages.

    python bench/wildcard.py [--quick] [--json]

50,000 messages of 128 B (10,000 with --quick) are published round-robin over 1,000 channels
(`w.0` .. `w.999`) before anyone subscribes. Then, on a fresh connection, either
- wildcard: one subscription to `w.*` (DeliverAllAvailable, MaxInflight 1024 across the channels), or
- plain: 1,000 subscriptions, one per channel (DeliverAllAvailable, MaxInflight 1024 each),
takes every message and acks each. Measured from the first subscription request to the last
message: throughput, and the server process's CPU (user + system) per message over that span
(subscribing included: it is part of what following 1,000 channels costs). Each run has a server of
its own, pinned apart from the client (`peers.pin_apart`); the two alternate, `--rounds` pairs.

JSON keys: `<kind>_msgs_per_s`, `<kind>_server_us_per_msg` (medians), `wildcard_vs_plain_throughput`
and `wildcard_vs_plain_cpu` (wildcard / plain; the target is throughput >= 1.0x at CPU <= 1.0x).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.report import arguments, machine, print_report, progress  # noqa: E402
from streaming.client import StanClient, StartPosition, Subscription, connect  # noqa: E402

PAYLOAD = b"x" * 128
CHANNELS = 1000
LIMIT = 120.0
KINDS = ("wildcard", "plain")
SERVER_FLAGS = ("--max_channels", "0", "--max_subs", "0")


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def _publish(port: int, count: int) -> None:
    async with connect("test-cluster", "bench-wild-pub", port=port) as sc:
        for i in range(count):
            await sc.publish_async(f"w.{i % CHANNELS}", PAYLOAD)
        await sc.wait_pub_acks()


async def _drain(sub: Subscription, counter: list[int], total: int, done: trio.Event) -> None:
    async for msg in sub:
        msg.ack()
        counter[0] += 1
        if counter[0] >= total:
            done.set()


async def _consume(kind: str, port: int, pid: int, count: int) -> dict[str, float]:
    await _publish(port, count)
    counter = [0]
    done = trio.Event()
    async with connect("test-cluster", f"bench-wild-{kind}", port=port) as sc:
        cpu, started = _cpu(pid), time.perf_counter()
        async with trio.open_nursery() as nursery:
            subs = await _subscribe(sc, kind)
            for sub in subs:
                nursery.start_soon(_drain, sub, counter, count, done)
            with trio.move_on_after(LIMIT):
                await done.wait()
            elapsed, cpu = time.perf_counter() - started, _cpu(pid) - cpu
            nursery.cancel_scope.cancel()
    if counter[0] < count:
        raise RuntimeError(f"{kind}: {counter[0]} of {count} messages within {LIMIT:.0f} s")
    return {"msgs_per_s": round(count / elapsed), "server_us_per_msg": round(cpu / count * 1e6, 2)}


async def _subscribe(sc: StanClient, kind: str) -> list[Subscription]:
    options: dict[str, Any] = {"start_at": StartPosition.FIRST, "max_inflight": 1024, "manual_ack": True}
    if kind == "wildcard":
        return [await sc.open_subscription("w.*", **options)]
    return [await sc.open_subscription(f"w.{i}", **options) for i in range(CHANNELS)]


def run(kind: str, count: int) -> dict[str, float]:
    with peers.ours(*SERVER_FLAGS) as server:
        peers.pin_apart(server)
        return trio.run(_consume, kind, server.port, server.pid, count)


def main() -> None:
    parser = arguments(__doc__, quick="10,000 messages instead of 50,000")
    parser.add_argument("--rounds", type=int, default=3, help="alternated pairs of runs (default 3)")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    count = 10_000 if args.quick else 50_000
    result: dict[str, Any] = {"scale": "quick" if args.quick else "full", "machine": machine(), "messages": count}
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with progress(console) as bar:
        task = bar.add_task("wildcard", total=len(KINDS) * args.rounds)
        for _ in range(args.rounds):
            for kind in KINDS:
                bar.update(task, description=kind)
                runs[kind].append(run(kind, count))
                bar.advance(task)
    for kind in KINDS:
        for key in ("msgs_per_s", "server_us_per_msg"):
            values = [r[key] for r in runs[kind]]
            result[f"{kind}_{key}"] = statistics.median(values)
            result[f"{kind}_{key}_runs"] = values
    result["wildcard_vs_plain_throughput"] = round(result["wildcard_msgs_per_s"] / result["plain_msgs_per_s"], 3)
    result["wildcard_vs_plain_cpu"] = round(result["wildcard_server_us_per_msg"] / result["plain_server_us_per_msg"], 3)
    rows = [
        (f"{kind}: {key}", f"{result[f'{kind}_{key}']}", "")
        for kind in KINDS
        for key in ("msgs_per_s", "server_us_per_msg")
    ]
    rows += [
        ("wildcard_vs_plain_throughput", f"{result['wildcard_vs_plain_throughput']}", ">= 1.0"),
        ("wildcard_vs_plain_cpu", f"{result['wildcard_vs_plain_cpu']}", "<= 1.0"),
    ]
    title = f"{count:,} messages over {CHANNELS:,} channels, medians of {args.rounds}"
    print_report(console, title, rows, result, args.json)


if __name__ == "__main__":
    main()
