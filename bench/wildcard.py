"""Wildcard subscriptions and ordered queue groups, each against what it replaces, same messages.

    python bench/wildcard.py [--quick] [--json] [--rounds N]

**One pattern against 1,000 subscriptions.**
50,000 messages of 128 B (10,000 with --quick) are published round-robin over 1,000 channels
(`w.0` .. `w.999`) before anyone subscribes. Then, on a fresh connection, either
- wildcard: one subscription to `w.*` (DeliverAllAvailable, MaxInflight 1,024,000: as many in flight
  as the 1,000 subscriptions may hold together), or
- wildcard_shared: the same with MaxInflight 1,024 across all the channels (below the backlog: each
  ack lets one more message out, a store read and a state update each, as on any subscription held at
  its MaxInflight), or
- plain: 1,000 subscriptions, one per channel (DeliverAllAvailable, MaxInflight 1024 each),
takes every message and acks each. Measured from the first subscription request to the last
message: throughput, and the server process's CPU (user + system) per message over that span
(subscribing included: it is part of what following 1,000 channels costs). Each run has a server of
its own, pinned apart from the client (`peers.pin_apart`); the kinds alternate, `--rounds` rounds.

**An ordered queue group against a plain one.** 20,000 messages (8,000 with --quick) published
round-robin over 200 channels (`o.0` .. `o.199`); then a queue group of 8 members on `o.*`
(MaxInflight 64 each, each member its own connection), ordered or not, takes them all. Each member
works 0-2 ms on a message (a random sleep) and then acks it, and counts an *order violation* when it
finishes a message of a channel after a later message of that channel was finished (by any member).
Measured from the first subscription request to the last message.

JSON keys: `<kind>_msgs_per_s`, `<kind>_server_us_per_msg` (medians; kinds `wildcard`,
`wildcard_shared`, `plain`, `ordered`, `unordered`), `wildcard_vs_plain_throughput` and
`wildcard_vs_plain_cpu` (the target: throughput >= 1.0x at CPU <= 1.0x), `wildcard_shared_vs_plain_cpu`,
`ordered_vs_unordered_throughput` (the target: >= 0.8x) and
`<kind>_order_violations` (the target for `ordered`: 0).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.node_clients import ServerCpu  # noqa: E402
from bench.report import arguments, machine, print_report, progress  # noqa: E402
from streaming.client import StanClient, StartPosition, Subscription, connect  # noqa: E402

PAYLOAD = b"x" * 128
CHANNELS = 1000
GROUP_CHANNELS = 200
MEMBERS = 8
LIMIT = 120.0
KINDS = ("wildcard", "wildcard_shared", "plain", "ordered", "unordered")
SERVER_FLAGS = ("--max_channels", "0", "--max_subs", "0")


async def _publish(port: int, count: int, prefix: str, channels: int) -> None:
    async with connect("test-cluster", "bench-wild-pub", port=port) as sc:
        for i in range(count):
            await sc.publish_async(f"{prefix}.{i % channels}", PAYLOAD)
        await sc.wait_pub_acks()


async def _drain(sub: Subscription, counter: list[int], total: int, done: trio.Event) -> None:
    async for msg in sub:
        msg.ack()
        counter[0] += 1
        if counter[0] >= total:
            done.set()


async def _consume(kind: str, port: int, pid: int, count: int) -> dict[str, float]:
    await _publish(port, count, "w", CHANNELS)
    counter = [0]
    done = trio.Event()
    async with connect("test-cluster", f"bench-wild-{kind}", port=port) as sc:
        cpu, started = ServerCpu(pid), time.perf_counter()
        cpu.start()
        async with trio.open_nursery() as nursery:
            subs = await _subscribe(sc, kind)
            for sub in subs:
                nursery.start_soon(_drain, sub, counter, count, done)
            with trio.move_on_after(LIMIT):
                await done.wait()
            elapsed = time.perf_counter() - started
            cpu.stop()
            nursery.cancel_scope.cancel()
    if counter[0] < count:
        raise RuntimeError(f"{kind}: {counter[0]} of {count} messages within {LIMIT:.0f} s")
    return {"msgs_per_s": round(count / elapsed), "server_us_per_msg": round(cpu.seconds / count * 1e6, 2)}


async def _subscribe(sc: StanClient, kind: str) -> list[Subscription]:
    options: dict[str, Any] = {"start_at": StartPosition.FIRST, "max_inflight": 1024, "manual_ack": True}
    if kind.startswith("wildcard"):
        # As many in flight as the 1,000 subscriptions together may hold (or, shared, 1,024 in all).
        inflight = 1024 if kind == "wildcard_shared" else 1024 * CHANNELS
        return [await sc.open_subscription("w.*", **{**options, "max_inflight": inflight})]
    return [await sc.open_subscription(f"w.{i}", **options) for i in range(CHANNELS)]


class Order:
    """What the members finished, per channel: the highest sequence, and the violations seen."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}
        self.violations = 0
        self.count = 0

    def finished(self, channel: str, seq: int) -> None:
        if self.done.get(channel, 0) > seq:
            self.violations += 1
        else:
            self.done[channel] = seq
        self.count += 1


async def _member(sub: Subscription, order: Order, total: int, done: trio.Event) -> None:
    async for msg in sub:
        await trio.sleep(random.uniform(0, 0.002))  # the work: up to 2 ms
        order.finished(msg.subject, msg.seq)
        msg.ack()
        if order.count >= total:
            done.set()


async def _group(kind: str, port: int, pid: int, count: int) -> dict[str, float]:
    await _publish(port, count, "o", GROUP_CHANNELS)
    order, done = Order(), trio.Event()
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(connect("test-cluster", f"m{i}", port=port)) for i in range(MEMBERS)]
        cpu, started = ServerCpu(pid), time.perf_counter()
        cpu.start()
        async with trio.open_nursery() as nursery:
            for sc in clients:
                sub = await sc.open_subscription(
                    "o.*",
                    queue="workers",
                    ordered=kind == "ordered",
                    start_at=StartPosition.FIRST,
                    max_inflight=64,
                    manual_ack=True,
                )
                nursery.start_soon(_member, sub, order, count, done)
            with trio.move_on_after(LIMIT):
                await done.wait()
            elapsed = time.perf_counter() - started
            cpu.stop()
            nursery.cancel_scope.cancel()
    if order.count < count:
        raise RuntimeError(f"{kind}: {order.count} of {count} messages within {LIMIT:.0f} s")
    return {
        "msgs_per_s": round(count / elapsed),
        "server_us_per_msg": round(cpu.seconds / count * 1e6, 2),
        "order_violations": order.violations,
    }


def run(kind: str, count: int, group_count: int) -> dict[str, float]:
    with peers.ours(*SERVER_FLAGS) as server:
        peers.pin_apart(server)
        if kind in ("ordered", "unordered"):
            return trio.run(_group, kind, server.port, server.pid, group_count)
        return trio.run(_consume, kind, server.port, server.pid, count)


def main() -> None:
    parser = arguments(__doc__, quick="10,000 messages instead of 50,000")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternated runs (default 3)")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    count = 10_000 if args.quick else 50_000
    group_count = 8_000 if args.quick else 20_000
    result: dict[str, Any] = {"scale": "quick" if args.quick else "full", "machine": machine(), "messages": count}
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with progress(console) as bar:
        task = bar.add_task("wildcard", total=len(KINDS) * args.rounds)
        for _ in range(args.rounds):
            for kind in KINDS:
                bar.update(task, description=kind)
                runs[kind].append(run(kind, count, group_count))
                bar.advance(task)
    for kind in KINDS:
        for key in (
            "msgs_per_s",
            "server_us_per_msg",
            *(("order_violations",) if kind in ("ordered", "unordered") else ()),
        ):
            values = [r[key] for r in runs[kind]]
            result[f"{kind}_{key}"] = statistics.median(values)
            result[f"{kind}_{key}_runs"] = values
    result["wildcard_vs_plain_throughput"] = round(result["wildcard_msgs_per_s"] / result["plain_msgs_per_s"], 3)
    result["wildcard_vs_plain_cpu"] = round(result["wildcard_server_us_per_msg"] / result["plain_server_us_per_msg"], 3)
    result["ordered_vs_unordered_throughput"] = round(result["ordered_msgs_per_s"] / result["unordered_msgs_per_s"], 3)
    rows = [
        (f"{kind}: {key}", f"{result[f'{kind}_{key}']}", "")
        for kind in KINDS
        for key in ("msgs_per_s", "server_us_per_msg")
    ]
    result["wildcard_shared_vs_plain_cpu"] = round(
        result["wildcard_shared_server_us_per_msg"] / result["plain_server_us_per_msg"], 3
    )
    rows += [
        ("wildcard_vs_plain_throughput", f"{result['wildcard_vs_plain_throughput']}", ">= 1.0"),
        ("wildcard_vs_plain_cpu", f"{result['wildcard_vs_plain_cpu']}", "<= 1.0"),
        ("ordered_vs_unordered_throughput", f"{result['ordered_vs_unordered_throughput']}", ">= 0.8"),
        ("ordered_order_violations", f"{result['ordered_order_violations']}", "0"),
        ("unordered_order_violations", f"{result['unordered_order_violations']}", ""),
    ]
    title = (
        f"{count:,} messages over {CHANNELS:,} channels; {group_count:,} over {GROUP_CHANNELS} channels to a"
        f" group of {MEMBERS}; medians of {args.rounds}"
    )
    print_report(console, title, rows, result, args.json)


if __name__ == "__main__":
    main()
