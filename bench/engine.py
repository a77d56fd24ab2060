"""Benchmark of the delivery engine in-process: deliver+ack throughput, redelivery timeliness, memory.

    python bench/engine.py [--quick] [--json]

Figures (with --json the last line is one JSON object with these keys):
- deliver_ack_per_s (1 subscription) and deliver_ack_per_s_1000_subs: deliver what was just published,
  ack every message, and write the resulting subscription updates to the store, in one thread (the
  append itself is timed by bench/storage.py, not here).
  The memory store is the engine's figure; *_lmdb is the same with LMDB files (one transaction per burst).
- redelivery_lateness_p99_ms / _max_ms and max_loop_stall_ms: 100,000 unacked messages across 1,000
  subscriptions, run by the delivery core (commit pipeline, runtime) on the real clock (memory store
  on the Trio thread).
  Lateness is the time from a message's deadline (the `now` the engine was given when it first sent
  it, + AckWait) to its first redelivery; loop stall is the longest a 1 ms ticker task waited beyond its
  wake-up time during the redelivery phase. Default figures ("stream"): one message every 20 ms,
  each fanned out to all 1,000 subscriptions (100 messages, 100,000 deliveries in 2 s), AckWait 3 s
  so that redelivery does not overlap publishing. "burst_*": all 100 published in one call with
  AckWait 1 s, so all 100,000 deadlines are the same instant: the last redeliveries then necessarily
  wait for all the work before them (about 100,000 x one redelivery; ~0.2 s here).
  The process runs with the server's collector policy (`streaming.collector`).
- bytes_per_pending: Python memory the engine holds per pending message (LMDB store, so the messages
  themselves are not on the Python heap).
"""

from __future__ import annotations

import gc
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import trio
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ is first on sys.path and bench/storage.py would shadow the `storage` package.
sys.path.insert(0, str(ROOT))

from bench.report import arguments, machine, print_report  # noqa: E402
from storage import ClientRecord, LmdbStore, MemoryStore, Message, NewMessage, Store  # noqa: E402
from streaming import collector  # noqa: E402
from streaming.core.engine import Delivery, Engine, SubscribeRequest  # noqa: E402
from streaming.core.outbound import Publish  # noqa: E402
from streaming.core.service import Core  # noqa: E402

PAYLOAD = b"x" * 128


def _engine(store: Store, subs: int, max_inflight: int, ack_wait_ms: int = 30_000) -> tuple[Engine, list[int]]:
    engine = Engine(store)
    store.register_client(ClientRecord("bench", "_HB"))
    engine.add_client("bench")
    ids = []
    for i in range(subs):
        request = SubscribeRequest("bench", "ch", f"_INBOX.{i}", f"_ACK.{i}", ack_wait_ms, max_inflight)
        ids.append(engine.subscribe(request, 0.0, time.time_ns()))
    store.apply(engine.take_effects().updates)
    return engine, ids


def bench_deliver_ack(store: Store, subs: int, total: int) -> float:
    """Deliveries+acks per second: deliver a burst, ack every delivery, write the updates to the store.

    The append of each burst is outside the timed part (bench/storage.py measures publishing).
    """
    store.ensure_channel("ch")
    burst = 1024 if subs == 1 else 10
    engine, _ = _engine(store, subs, max_inflight=max(burst, 1024))
    done = 0
    elapsed = 0.0
    while done < total:
        result = store.append([NewMessage("ch", PAYLOAD)] * burst)
        messages = [Message(seq, ts, "ch", "", PAYLOAD) for seq, ts in result.assigned]
        started = time.perf_counter()
        engine.on_appended("ch", started, messages)
        deliveries = engine.take_effects().deliveries
        ack = engine.ack
        for d in deliveries:
            ack(d.sub_id, d.message.seq, started)
        store.apply(engine.take_effects().updates)
        elapsed += time.perf_counter() - started
        done += len(deliveries)
    return done / elapsed


async def _redelivery_run(subs: int, messages: int, burst: bool, ack_wait_ms: int = 1000) -> dict[str, float]:
    """Deliver `messages` to each of `subs` subscriptions (AckWait 1 s, nothing acked), then time the
    first redelivery of each against its own deadline (its first delivery + 1 s)."""
    store = MemoryStore()
    store.ensure_channel("ch")
    store.register_client(ClientRecord("bench", "_HB"))
    first: dict[tuple[int, int], float] = {}
    lateness: list[float] = []
    all_redelivered = trio.Event()
    total = subs * messages

    given = [0.0]  # the `now` the engine was given for the publish being delivered

    class Door:
        """The front door's port: the time each first delivery and redelivery went out."""

        def deliver(self, deliveries: Sequence[Delivery]) -> None:
            deliver(deliveries)

        def published(self, publishes: Sequence[Publish], errors: dict[int, Exception]) -> None:
            pass

        def holding(self) -> AbstractContextManager[None]:
            return nullcontext()

        async def wait_reachable(self, inboxes: list[str]) -> None:
            pass

    def deliver(deliveries: Sequence[Delivery]) -> None:
        now = trio.current_time()
        for d in deliveries:
            key = (d.sub_id, d.message.seq)
            if d.attempt == 1:
                first[key] = given[0]  # its deadline is that + AckWait, however long the call took
            elif d.attempt == 2:
                lateness.append(now - (first[key] + ack_wait_ms / 1000))
                if len(lateness) >= total:
                    all_redelivered.set()

    core = Core(store, store_in_thread=False)
    core.doors.add(Door())
    stall = 0.0

    async def ticker() -> None:
        nonlocal stall
        while True:
            wanted = trio.current_time() + 0.001
            await trio.sleep_until(wanted)
            stall = max(stall, trio.current_time() - wanted)

    async with trio.open_nursery() as nursery:
        await nursery.start(core.run)
        await core.ready.wait()
        runtime = core.runtime
        for i in range(subs):
            request = SubscribeRequest("bench", "ch", f"_INBOX.{i}", f"_ACK.{i}", ack_wait_ms, messages + 1)
            core.pipeline.subscribe(request, lambda sub_id: None)
        publish_started = trio.current_time()
        if burst:
            given[0] = trio.current_time()
            core.pipeline.commit([Publish("ch", PAYLOAD, "", "", "")] * messages)  # every deadline at once
        else:
            for _ in range(messages):  # a steady stream: one message every 20 ms, fanned out
                given[0] = trio.current_time()
                core.pipeline.commit([Publish("ch", PAYLOAD, "", "", "")])
                await trio.sleep_until(given[0] + 0.02)
        publish_s = trio.current_time() - publish_started
        await trio.sleep(0.5)
        nursery.start_soon(ticker)  # the stall of the redelivery phase
        with trio.move_on_after(30):
            await all_redelivered.wait()
        redeliver_s = trio.current_time() - publish_started - ack_wait_ms / 1000
        nursery.cancel_scope.cancel()
    lateness.sort()
    return {
        "redelivered": len(lateness),
        "p50_ms": 1000 * lateness[len(lateness) // 2],
        "p99_ms": 1000 * lateness[int(len(lateness) * 0.99)],
        "max_ms": 1000 * lateness[-1],
        "stall_ms": 1000 * stall,
        "publish_phase_s": publish_s,
        "longest_chunk_ms": 1000 * runtime.statistics().longest_expiry_chunk_s,
        "timer_fires": runtime.statistics().timer_fires,
        "redelivery_phase_s": redeliver_s,
    }


def bench_bytes_per_pending(directory: Path, count: int) -> float:
    store = LmdbStore(directory)
    store.ensure_channel("ch")
    engine, (sub,) = _engine(store, 1, max_inflight=count + 1)
    for _ in range(count // 10_000):
        store.append([NewMessage("ch", PAYLOAD)] * 10_000)
    store.apply(engine.take_effects().updates)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    engine.on_appended("ch", 1.0)  # delivers `count` messages from the store: all stay pending
    engine.take_effects()
    while engine.has_more():  # a step at a time, as the runtime sends a large backlog
        engine.pump_more(1.0)
        engine.take_effects()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(engine.inspect.pending(sub)) == count
    store.close()
    return (after - before) / count


def main() -> int:
    parser = arguments(__doc__, quick="a shorter run, under 30 s")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    total = 200_000 if args.quick else 1_000_000
    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    collector.settle()  # the collector policy the server process runs with
    try:
        with console.status("deliver+ack throughput"):
            one = bench_deliver_ack(MemoryStore(), 1, total)
            many = bench_deliver_ack(MemoryStore(), 1000, total)
            one_lmdb = bench_deliver_ack(LmdbStore(tmp / "a"), 1, total // 2)
            many_lmdb = bench_deliver_ack(LmdbStore(tmp / "b"), 1000, total // 2)
        with console.status("redelivery of 100,000 messages across 1,000 subscriptions"):
            spread = trio.run(_redelivery_run, 1000, 100, False, 3000)
            burst = trio.run(_redelivery_run, 1000, 100, True, 1000)
        spread_fires = spread.pop("timer_fires")
        burst.pop("timer_fires")
        with console.status("memory per pending message"):
            per_pending = bench_bytes_per_pending(tmp / "c", 100_000 if args.quick else 500_000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    result: dict[str, Any] = {
        "scale": "quick" if args.quick else "full",
        "deliver_ack_per_s": round(one),
        "deliver_ack_per_s_1000_subs": round(many),
        "deliver_ack_per_s_lmdb": round(one_lmdb),
        "deliver_ack_per_s_1000_subs_lmdb": round(many_lmdb),
        "redelivery_lateness_p99_ms": round(spread["p99_ms"], 2),
        "redelivery_lateness_max_ms": round(spread["max_ms"], 2),
        "max_loop_stall_ms": round(spread["stall_ms"], 2),
        "redelivered": spread["redelivered"],
        "per_subscription_timer_fires": spread_fires,
        "burst_redelivery_lateness_p50_ms": round(burst["p50_ms"], 2),
        "burst_redelivery_lateness_p99_ms": round(burst["p99_ms"], 2),
        "burst_max_loop_stall_ms": round(burst["stall_ms"], 2),
        "burst_redelivered": burst["redelivered"],
        "bytes_per_pending": round(per_pending, 1),
        "machine": machine(),
    }
    spread_lateness = f"{spread['p99_ms']:.2f} / {spread['max_ms']:.2f}"
    burst_lateness = f"{burst['p50_ms']:.1f} / {burst['p99_ms']:.1f}"
    rows = [
        ("deliver+ack/s, 1 subscription (memory store)", f"{one:,.0f}", ">= 300,000"),
        ("deliver+ack/s, 1000 subscriptions (memory store)", f"{many:,.0f}", ">= 300,000"),
        ("deliver+ack/s, 1 subscription (LMDB store)", f"{one_lmdb:,.0f}", ""),
        ("deliver+ack/s, 1000 subscriptions (LMDB store)", f"{many_lmdb:,.0f}", ""),
        ("redelivery lateness p99 / max (ms), stream", spread_lateness, "<= 20"),
        ("max loop stall (ms), stream", f"{spread['stall_ms']:.2f}", "<= 20"),
        ("redelivery lateness p50 / p99 (ms), burst", burst_lateness, "(worst case)"),
        ("max loop stall (ms), burst", f"{burst['stall_ms']:.2f}", "<= 20"),
        ("bytes per pending message", f"{per_pending:.1f}", "<= 150"),
    ]
    print_report(console, f"engine benchmark ({result['scale']})", rows, result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
