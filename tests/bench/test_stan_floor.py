"""`bench/stan_floor.py` really does what it is the floor of: a STAN client publishes through it and
gets every message back in order, MaxInflight holding back what is not acknowledged, a queue group's
members sharing the messages without a copy. A floor that skipped work would measure nothing."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest
import trio

from bench import peers
from streaming.client import Msg, StartPosition, Subscription, connect


@pytest.fixture(scope="module")
def floor_port() -> Iterator[int]:
    with peers.stan_floor() as server:
        yield server.port


async def _published(port: int, channel: str, n: int) -> None:
    async with connect("test-cluster", f"pub-{channel}", port=port) as sc:
        futures = [await sc.publish_async(channel, b"%d" % i) for i in range(n)]
        for future in futures:
            await future.wait()


async def _next(sub: Subscription) -> Msg:
    with anyio.fail_after(5):
        return await sub.next_msg()


async def test_every_message_comes_back_in_order_and_max_inflight_holds_back_the_rest(floor_port: int) -> None:
    await _published(floor_port, "solo", 500)
    async with connect("test-cluster", "solo-sub", port=floor_port) as sc:
        async with sc.subscribe("solo", manual_ack=True, max_inflight=50, start_at=StartPosition.FIRST) as sub:
            held = [await _next(sub) for _ in range(50)]
            with trio.move_on_after(0.3):  # nothing past the 50 in flight until one is acknowledged
                raise AssertionError(f"sent past MaxInflight: {(await sub.next_msg()).seq}")
            got = held
            for msg in held:
                msg.ack()
            while len(got) < 500:
                msg = await _next(sub)
                msg.ack()
                got.append(msg)
    assert [m.seq for m in got] == list(range(1, 501))
    assert [m.data for m in got] == [b"%d" % i for i in range(500)]


async def test_a_queue_groups_members_share_the_messages_without_a_copy(floor_port: int) -> None:
    await _published(floor_port, "shared", 400)
    seen: list[int] = []
    async with (
        connect("test-cluster", "member-a", port=floor_port) as a,
        connect("test-cluster", "member-b", port=floor_port) as b,
    ):
        first = StartPosition.FIRST
        async with (
            a.subscribe("shared", queue="workers", manual_ack=True, max_inflight=20, start_at=first) as sub_a,
            b.subscribe("shared", queue="workers", manual_ack=True, max_inflight=20, start_at=first) as sub_b,
        ):

            async def take(sub: Subscription, counts: list[int]) -> None:
                while len(seen) < 400:
                    with trio.move_on_after(0.5):
                        msg = await sub.next_msg()
                        msg.ack()
                        seen.append(msg.seq)
                        counts.append(msg.seq)

            counts_a: list[int] = []
            counts_b: list[int] = []
            with trio.fail_after(10):  # a floor that stopped sending fails here instead of hanging
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(take, sub_a, counts_a)
                    nursery.start_soon(take, sub_b, counts_b)
    assert sorted(seen) == list(range(1, 401))
    assert counts_a and counts_b
