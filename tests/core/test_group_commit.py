"""The group commit's choices, without sockets or time (a memory store, the virtual clock): when the end
of an input span commits its publishes itself, when it leaves them to the commit task, and that
either way every publisher hears each outcome once, in order, by ticket."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import trio
import trio.testing

from storage import AppendResult, MemoryStore, MessageToAppend
from streaming.core import group_commit as gc
from streaming.core.door_api import DoorApi
from streaming.core.outbound import Publish
from streaming.core.service import Core
from tests.core.doors import RecordingDoor


async def start(nursery: trio.Nursery) -> tuple[Core, DoorApi]:
    core = Core(MemoryStore(), store_in_thread=False)
    api = DoorApi(core)
    api.add_door(RecordingDoor())
    await nursery.start(core.run)
    await api.wait_ready()
    return core, api


def span(api: DoorApi, publishes: list[Publish], source: object, *, more_input: bool) -> None:
    """What a door does with one read of a connection that brought `publishes`."""
    api.span_started()
    assert api.publish_many(publishes, source) is None
    api.span_ended(more_input=more_input)


async def test_a_lone_publishers_span_commits_at_its_end(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        core, api = await start(nursery)
        span(api, [Publish("orders", b"creates the channel")], "conn-1", more_input=False)  # the task's
        await api.flush_publishes()
        before = core.group_commit.statistics()
        await trio.sleep(1)  # long after: no other publisher lately
        span(api, [Publish("orders", b"one"), Publish("orders", b"two")], "conn-1", more_input=False)
        after = core.group_commit.statistics()
        assert after.inline_commits == before.inline_commits + 1 and after.messages == 3 and after.queued == 0
        nursery.cancel_scope.cancel()


async def test_a_span_with_more_input_behind_it_leaves_its_publishes_to_the_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stream on one connection: the task's batch grows while the reader reads on."""
    async with trio.open_nursery() as nursery:
        core, api = await start(nursery)
        await api.publish_and_wait([Publish("orders", b"creates the channel")])
        await trio.sleep(1)
        for n in range(3):
            span(api, [Publish("orders", b"%d" % n)], "conn-1", more_input=True)
        stats = core.group_commit.statistics()
        assert stats.inline_commits == 0 and stats.queued == 3
        await api.flush_publishes()
        stats = core.group_commit.statistics()
        assert stats.queued == 0 and stats.messages == 4 and stats.largest_batch == 3
        nursery.cancel_scope.cancel()


async def test_publishes_of_two_sources_together_are_left_to_the_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        core, api = await start(nursery)
        span(api, [Publish("orders", b"creates the channel")], "conn-1", more_input=False)
        await api.flush_publishes()
        await trio.sleep(1)
        span(api, [Publish("orders", b"a")], "conn-1", more_input=False)  # alone lately: committed here
        span(api, [Publish("orders", b"b")], "conn-2", more_input=False)  # another source at once: the task
        stats = core.group_commit.statistics()
        assert stats.inline_commits == 1 and stats.queued == 1
        await api.flush_publishes()
        await trio.sleep(1)
        span(api, [Publish("orders", b"c")], "conn-2", more_input=False)  # alone again, a while later
        assert core.group_commit.statistics().inline_commits == 2
        nursery.cancel_scope.cancel()


async def test_a_span_that_must_create_a_channel_leaves_it_to_the_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Creating a channel is a store write of its own (on the store thread in production)."""
    async with trio.open_nursery() as nursery:
        core, api = await start(nursery)
        span(api, [Publish("new.channel", b"x")], "conn-1", more_input=False)
        assert core.group_commit.statistics().inline_commits == 0
        await api.flush_publishes()
        assert core.store.channel_info("new.channel") is not None
        nursery.cancel_scope.cancel()


async def test_every_ticket_hears_its_outcomes_in_order_across_batches(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Tickets of runs interleaved in one queue, split over several commits (a small `max_batch`),
    each refused where its channel is refused, stored with consecutive sequences elsewhere."""
    async with trio.open_nursery() as nursery:
        core = Core(MemoryStore(), store_in_thread=False)
        api = DoorApi(core)
        api.add_door(RecordingDoor())
        await nursery.start(core.run)
        await api.wait_ready()
        core.group_commit._max_batch = 3  # commits of three: each ticket's run is split
        bad = "a" * 300  # longer than a channel name may be: refused by the store
        first = await api.submit([Publish("x", b"1"), Publish(bad, b"2"), Publish("x", b"3"), Publish("x", b"4")])
        second = await api.submit([Publish("y", b"1"), Publish("x", b"5")])
        one, two = await first.outcomes(), await second.outcomes()
        assert [o if isinstance(o, int) else "refused" for o in one] == [1, "refused", 2, 3]
        assert two == [1, 4]
        assert [m.data for m in core.store.read("x", 1, 10)] == [b"1", b"3", b"4", b"5"]
        nursery.cancel_scope.cancel()


class SlowDiskStore(MemoryStore):
    """A memory store whose appends take `sync_s` more, as an fdatasync does on a slow or stalling disk:
    of the virtual clock on the event loop (no real time passes there), of real time on the store
    thread."""

    def __init__(self, clock: trio.testing.MockClock) -> None:
        super().__init__()
        self.clock = clock
        self.sync_s = 0.0
        self.on_loop: list[bool] = []  # for each append: whether it ran on the event loop

    def append(self, messages: Sequence[MessageToAppend], now_unix_ns: int | None = None) -> AppendResult:
        on_loop = threading.current_thread() is threading.main_thread()
        self.on_loop.append(on_loop)
        if self.sync_s and on_loop:
            self.clock.jump(self.sync_s)
        elif self.sync_s:
            time.sleep(self.sync_s)
        return super().append(messages, now_unix_ns)


async def start_on(store: MemoryStore, nursery: trio.Nursery) -> tuple[Core, DoorApi]:
    """A core with a store thread, its channel "orders" made, and no publisher seen lately."""
    core = Core(store, store_in_thread=True)
    api = DoorApi(core)
    api.add_door(RecordingDoor())
    await nursery.start(core.run)
    await api.wait_ready()
    span(api, [Publish("orders", b"creates the channel")], "conn-1", more_input=False)  # the task's
    await api.flush_publishes()
    await trio.sleep(1)
    return core, api


async def lone_publish(api: DoorApi, data: bytes) -> None:
    """One publisher's publish, alone: committed at its span's end or by the task, and done."""
    span(api, [Publish("orders", data)], "conn-1", more_input=False)
    await api.flush_publishes()


async def test_after_a_stalled_append_appends_run_on_the_store_thread_until_quick_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stalled fsync on the loop holds every client: after one, the next appends go to the store
    thread, and once their average is quick again they come back to the loop."""
    store = SlowDiskStore(autojump_clock)
    async with trio.open_nursery() as nursery:
        core, api = await start_on(store, nursery)
        store.sync_s = 0.15
        await lone_publish(api, b"stalls")
        assert store.on_loop[-1] and core.group_commit.statistics().append_average_s >= gc.SLOW_APPEND_S
        store.sync_s = 0.0
        sent = 0
        while not store.on_loop[-1] or sent == 0:
            sent += 1
            await lone_publish(api, b"%d" % sent)
            assert sent < 40, "appends never came back to the loop"
        stats = core.group_commit.statistics()
        # 0.15 s at a weight of 0.1 stays over the threshold for ~20 quick appends.
        assert 15 <= sent - 1 == stats.slow_disk_commits == stats.thread_commits <= 25
        assert stats.append_average_s < gc.SLOW_APPEND_S
        assert [m.data for m in store.read("orders", 2, 3)] == [b"stalls", b"1", b"2"]
        nursery.cancel_scope.cancel()


async def test_a_slow_disk_keeps_appends_on_the_store_thread(autojump_clock: trio.testing.MockClock) -> None:
    """Each sync 3 ms: no one stall, but an average that stays slow."""
    store = SlowDiskStore(autojump_clock)
    async with trio.open_nursery() as nursery:
        core, api = await start_on(store, nursery)
        store.sync_s = 0.003
        for n in range(40):
            await lone_publish(api, b"%d" % n)
        assert store.on_loop[-15:] == [False] * 15
        assert core.group_commit.statistics().append_average_s >= gc.SLOW_APPEND_S
        nursery.cancel_scope.cancel()


async def test_a_quick_disk_with_a_spike_keeps_appends_on_the_loop(autojump_clock: trio.testing.MockClock) -> None:
    """A sync of a few ms now and then (a usual p99) moves nothing."""
    store = SlowDiskStore(autojump_clock)
    async with trio.open_nursery() as nursery:
        core, api = await start_on(store, nursery)
        for n in range(30):
            store.sync_s = 0.004 if n % 10 == 0 else 0.0003
            await lone_publish(api, b"%d" % n)
        stats = core.group_commit.statistics()
        assert all(store.on_loop[-30:]) and stats.slow_disk_commits == 0 and stats.inline_commits == 30
        nursery.cancel_scope.cancel()
