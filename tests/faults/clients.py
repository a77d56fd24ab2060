"""What the fault tests do as clients: publish and note what was acknowledged, read a channel back."""

from __future__ import annotations

import trio

from streaming.client import StanError, StartPosition, connect

CID = "test-cluster"
FILLER = b"." * 1000


def payload(n: int) -> bytes:
    return b"%d:" % n + FILLER


def number(data: bytes) -> int:
    return int(data.split(b":", 1)[0])


async def publish(port: int, channel: str, first: int, count: int, acked: set[int], client: str = "pub") -> int:
    """Publish `count` numbered messages (pipelined); note those that got a PubAck; return how many
    were refused. Reconnects are the client's business: a publish that fails for good is refused."""
    refused = 0
    async with connect(CID, client, port=port, reconnect_wait_s=0.1, max_reconnect_attempts=5) as sc:
        for start in range(first, first + count, 100):
            futures = [
                await sc.publish_async(channel, payload(n)) for n in range(start, min(start + 100, first + count))
            ]
            for future in futures:
                try:
                    await future.wait()
                except StanError:
                    refused += 1
                    continue
                acked.add(number(future.payload))
    return refused


async def read_channel(port: int, channel: str, client: str = "reader", quiet: float = 1.0) -> dict[int, bytes]:
    """Every message of the channel (DeliverAll), by its number; stops after `quiet` s without one."""
    got: dict[int, bytes] = {}
    async with (
        connect(CID, client, port=port) as sc,
        sc.subscribe(channel, start_at=StartPosition.FIRST, max_inflight=20_000) as sub,
    ):
        while True:
            with trio.move_on_after(quiet) as idle:
                msg = await sub.next_msg()
            if idle.cancelled_caught:
                return got
            got[number(msg.data)] = msg.data
