"""Putting messages into each system as its users do (pipelined, confirmed), and timing one-at-a-time
publishes: what the benchmarks share before and while they measure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel

from streaming.client import PubAckFuture, StanClient

# Publishes queued between checkpoints. Without any, a loop queues the whole PubAck window (16,384,
# ~100 ms of client CPU) before its first byte leaves, and the server idles meanwhile: 87-92k/s
# against 100-118k/s with a checkpoint every 64-256 (`python -m streaming`, 100,000 publishes x 3).
YIELD_EVERY = 128


async def publish_pipelined(sc: StanClient, channel: str, count: int, payload: bytes) -> list[PubAckFuture]:
    """Ours: queue without blocking while the PubAck window has room, letting the connection's writer
    send every `YIELD_EVERY` (one write each), and wait for room when it has not. The caller waits
    for the PubAcks (`sc.wait_pub_acks()`)."""
    futures: list[PubAckFuture] = []
    for i in range(count):
        try:
            futures.append(sc.publish_nowait(channel, payload))
        except anyio.WouldBlock:
            futures.append(await sc.publish_async(channel, payload))
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await anyio.lowlevel.checkpoint()
    return futures


async def jetstream_publish(js: Any, subject: str, count: int, payload: bytes, window: int = 10_000) -> None:
    """JetStream (nats-py): `publish_async` in windows, each awaited until every ack is back."""
    for first in range(0, count, window):
        futures = [await js.publish_async(subject, payload) for _ in range(min(window, count - first))]
        await asyncio.gather(*futures)


async def redis_xadd(r: Any, stream: str, count: int, payload: bytes, pipeline: int = 1000) -> None:
    """Redis (redis-py): XADDs in pipelines of `pipeline` commands."""
    for first in range(0, count, pipeline):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(pipeline, count - first)):
            pipe.xadd(stream, {"d": payload})
        await pipe.execute()


async def sequential_rate(publish_one: Callable[[], Awaitable[object]], count: int, seconds: float) -> float:
    """Publishes per second, one at a time (each awaited), for `count` or `seconds`, whichever ends first.
    Works under Trio and asyncio alike: it only awaits what it is given."""
    started = time.perf_counter()
    done = 0
    while done < count and time.perf_counter() - started < seconds:
        await publish_one()
        done += 1
    return done / (time.perf_counter() - started)
