"""A scripted run against a real server, shared by the monitoring tests: publishes on three channels,
a plain subscription, an AckWait redelivery, a queue member leaving with unacknowledged messages, and
a dead letter. It leaves two clients connected with known subscriptions (`Final`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from streaming.client import StanClient, StartPosition, Subscription, connect

CID = "test-cluster"
ORDERS, AUDIT, JOBS, DLQ = 20, 5, 1, 1  # messages published per channel


@attrs.define
class Final:
    """What is left when the script is done."""

    publisher: StanClient
    watcher: StanClient
    durable: Subscription  # watcher's durable "d1" on orders, every message acked
    audit: Subscription  # watcher's plain subscription on audit, every message acked


async def _take(sub: Subscription, n: int) -> list[int]:
    with trio.fail_after(10):
        seqs = []
        for _ in range(n):
            msg = await sub.next_msg()
            seqs.append(msg.seq)
            if msg.attempt > 1 or sub.channel != "orders" or msg.seq != 1 or sub.durable != "d1":
                msg.ack()
        return seqs


@asynccontextmanager
async def scripted_run(port: int) -> AsyncIterator[Final]:
    async with (
        connect(CID, "mon-pub", port=port) as pub,
        connect(CID, "mon-watch", port=port) as watch,
    ):
        for i in range(ORDERS):
            await pub.publish("orders", b"order %d" % i)
        for i in range(AUDIT):
            await pub.publish("audit", b"audit %d" % i)

        audit = await watch.open_subscription("audit", start_at=StartPosition.FIRST, manual_ack=True)
        assert await _take(audit, AUDIT) == list(range(1, AUDIT + 1))

        # Durable d1 leaves orders #1 unacked once: one AckWait expiry, one redelivery (then acked).
        durable = await watch.open_subscription(
            "orders", durable="d1", start_at=StartPosition.FIRST, manual_ack=True, ack_wait=0.2
        )
        assert sorted(await _take(durable, ORDERS + 1)) == [1, *range(1, ORDERS + 1)]

        # A queue member takes messages and leaves without acking: they go to the other member.
        async with connect(CID, "mon-q1", port=port) as q1, connect(CID, "mon-q2", port=port) as q2:
            leaver = await q1.open_subscription(
                "orders", queue="workers", start_at=StartPosition.FIRST, manual_ack=True, ack_wait=60, max_inflight=5
            )
            with trio.fail_after(10):
                for _ in range(5):
                    await leaver.next_msg()  # not acked
            stayer = await q2.open_subscription(
                "orders", queue="workers", manual_ack=True, ack_wait=60, max_inflight=100
            )
            await leaver.close()
            got = await _take(stayer, ORDERS)  # its own share plus the leaver's five
            assert sorted(set(got)) == list(range(1, ORDERS + 1))

        # A poison message: two attempts, then the dead-letter channel.
        dead = await watch.open_subscription(DLQ_CHANNEL, start_at=StartPosition.FIRST)
        jobs = await watch.open_subscription(
            "jobs", manual_ack=True, ack_wait=0.1, max_deliver=2, dead_letter_channel=DLQ_CHANNEL
        )
        await pub.publish("jobs", b"poison")
        with trio.fail_after(10):
            await jobs.next_msg()
            await jobs.next_msg()
            await dead.next_msg()
        await jobs.unsubscribe()
        await dead.unsubscribe()

        # A message given back with a nak comes again after its delay, and is acked then.
        retry = await watch.open_subscription(RETRY, manual_ack=True, ack_wait=60)
        await pub.publish(RETRY, b"not yet")
        with trio.fail_after(10):
            (await retry.next_msg()).nak(delay=0.05)
            (await retry.next_msg()).ack()
        await retry.unsubscribe()
        yield Final(pub, watch, durable, audit)


DLQ_CHANNEL = "jobs.dead"
RETRY = "retry"  # one message, nak'd once
