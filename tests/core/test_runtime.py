"""The Trio runtime under a virtual clock (autojump_clock): timers, yielding, store flushing.

Store work stays on the Trio thread here (store_in_thread=False): under MockClock virtual time would
jump while a worker thread runs.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from storage import (
    AppendResult,
    ClientRecord,
    MemoryStore,
    MessageToAppend,
    SaveClient,
    StoreFullError,
    SubOptions,
    SubUpdate,
)
from streaming.core.door_api import DoorApi
from streaming.core.engine import Engine, Reason, SubscribeRequest
from streaming.core.engine.engine import PUMP_STEP
from streaming.core.outbound import Publish
from streaming.core.pipeline import Pipeline
from streaming.core.runtime import EngineRuntime
from streaming.core.service import Core
from tests.core.doors import RecordingDoor


class World:
    """The delivery core over a memory store, recording when each delivery went out."""

    def __init__(self, store: MemoryStore | None = None, **options: Any) -> None:
        self.store = store if store is not None else MemoryStore()
        self.store.register_client(ClientRecord("c", "_HB"))
        self.core = Core(self.store, store_in_thread=False, **options)
        self.door = RecordingDoor()
        self.core.doors.add(self.door)
        self.sent = self.door.sent

    @property
    def engine(self) -> Engine:
        return self.core.engine

    @property
    def runtime(self) -> EngineRuntime:
        return self.core.runtime

    @property
    def pipeline(self) -> Pipeline:
        return self.core.pipeline

    async def start(self, nursery: trio.Nursery) -> None:
        await nursery.start(self.core.run)
        await self.core.ready.wait()

    def subscribe(self, ack_wait_s: float = 1, max_inflight: int = 1024, **options: object) -> int:
        n = len(self.engine.subscriptions())
        request = SubscribeRequest(
            "c",
            "foo",
            f"_INBOX.{n}",
            f"_ACK.{n}",
            int(ack_wait_s * 1000),
            max_inflight,
            options=SubOptions(**options),  # type: ignore[arg-type]
        )
        return self.pipeline.subscribe(request, lambda sub_id: None)

    def ack(self, sub_id: int, seq: int) -> bool:
        return self.pipeline.ack(sub_id, seq)

    def record_writes(self, record: Callable[[int], None]) -> None:
        """Call `record(number of updates)` at each `Store.apply`, before it runs."""
        apply = self.store.apply

        def recording_apply(updates: Iterable[SubUpdate]) -> None:
            batch = list(updates)
            record(len(batch))
            apply(batch)

        self.store.apply = recording_apply  # type: ignore[method-assign]

    def write_times(self) -> list[tuple[float, int]]:
        """(when, updates in the call) of every `Store.apply` from now on."""
        writes: list[tuple[float, int]] = []
        self.record_writes(lambda n: writes.append((trio.current_time(), n)))
        return writes

    def publish(self, count: int) -> None:
        """Commit `count` messages to "foo" through the pipeline, as the group commit does."""
        self.pipeline.commit([Publish("foo", b"x", "", "", "") for _ in range(count)])


def count_tasks() -> int:
    """Every task in this Trio run."""
    root = trio.lowlevel.current_root_task()
    assert root is not None
    stack, seen = [root], 0
    while stack:
        task = stack.pop()
        seen += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return seen


@pytest.mark.parametrize("grace", [0.05, 0.0])
async def test_redelivery_fires_exactly_at_ack_wait(autojump_clock: trio.testing.MockClock, grace: float) -> None:
    """With no grace the per-subscription timers fire together with the expiry worker (the backstop
    path); either way each redelivery happens once, exactly at its deadline."""
    w = World(grace=grace)
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        sub = w.subscribe(ack_wait_s=2)
        start = trio.current_time()
        w.publish(1)
        await trio.sleep(7)
        times = [round(t - start, 6) for t, d in w.sent if d.sub_id == sub]
        assert times == [0.0, 2.0, 4.0, 6.0]
        assert [d.attempt for _, d in w.sent] == [1, 2, 3, 4]
        if grace == 0.0:
            assert w.runtime.statistics().timer_fires > 0, "the backstop path really ran"
        w.ack(sub, 1)
        await trio.sleep(10)
        assert len(w.sent) == 4, "nothing after the ack"
        nursery.cancel_scope.cancel()


async def test_one_timer_task_per_subscription_not_per_message(autojump_clock: trio.testing.MockClock) -> None:
    w = World()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        await trio.sleep(0.1)
        before = count_tasks()
        subs = [w.subscribe(ack_wait_s=1 + i) for i in range(3)]
        w.publish(5000)
        await trio.sleep(0.5)
        assert w.runtime.statistics().timer_tasks == 3
        assert count_tasks() - before == 3, "5000 pending messages, three subscriptions: three timer tasks"
        w.pipeline.unsubscribe(subs[0])
        await trio.lowlevel.checkpoint()
        assert w.runtime.statistics().timer_tasks == 2, "a removed subscription's timer task ends"
        nursery.cancel_scope.cancel()


async def test_a_long_expiry_yields_so_acks_are_not_starved(autojump_clock: trio.testing.MockClock) -> None:
    w = World(scan_limit=1000)
    progress_seen: list[int] = []
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        sub = w.subscribe(ack_wait_s=1, max_inflight=100_000)
        w.publish(20_000)
        await trio.sleep(0.999)
        before = len(w.sent)

        async def acker() -> None:
            # Runs at the same moment the timer fires: it must get a turn during the scan.
            await trio.sleep(0.001)
            for _ in range(50):
                progress_seen.append(len(w.sent) - before)
                w.ack(sub, 20_000)
                await trio.lowlevel.checkpoint()

        nursery.start_soon(acker)
        await trio.sleep(0.5)
        assert len(w.sent) - before == 20_000 - 1, "every expired message was redelivered but the acked one"
        assert min(progress_seen) < 20_000 - 1, "the ack task ran while the expiry was in progress"
        assert w.runtime.statistics().expiry_passes >= 1
        nursery.cancel_scope.cancel()


async def test_a_large_backlog_goes_out_a_step_at_a_time(autojump_clock: trio.testing.MockClock) -> None:
    """A subscription that may take 20,000 at once, and 20,000 messages committed together: the first
    step's deliveries go out (and other tasks run) before the rest is prepared; all arrive in order."""
    w = World()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        seen: list[int] = []

        async def observer() -> None:  # another task, scheduled while the backlog goes out
            while len(seen) < 100:
                seen.append(len(w.sent))
                await trio.lowlevel.checkpoint()

        sub = w.subscribe(max_inflight=20_000)
        nursery.start_soon(observer)
        w.publish(20_000)
        assert w.engine.has_more(), "one step's worth at once"
        await trio.sleep(0.1)
        assert [d.message.seq for _, d in w.sent if d.sub_id == sub] == list(range(1, 20_001))
        assert not w.engine.has_more()
        between = sorted(set(seen) - {0, 20_000})
        assert between == [PUMP_STEP * i for i in range(1, 5)], f"other tasks ran between the steps: {seen[:20]}"
        nursery.cancel_scope.cancel()


async def test_updates_reach_the_store(autojump_clock: trio.testing.MockClock) -> None:
    w = World()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        sub = w.subscribe(ack_wait_s=1)
        w.publish(3)
        await w.runtime.flush()
        (recovered,) = w.store.recover().subscriptions
        assert dict(recovered.pending) == {1: 1, 2: 1, 3: 1}
        assert recovered.record.last_sent == 3
        w.ack(sub, 2)
        await trio.sleep(1.01)  # past the redeliveries due at 1 s, whichever task runs first then
        await w.runtime.flush()
        (recovered,) = w.store.recover().subscriptions
        assert dict(recovered.pending) == {1: 2, 3: 2}, "attempt counts are written as they grow"
        nursery.cancel_scope.cancel()


async def test_subscription_writes_wait_for_a_redelivery_pass_and_land_once_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    w = World(scan_limit=100)
    applied: list[tuple[bool, int]] = []  # (a pass was under way, updates written)
    w.record_writes(lambda n: applied.append((bool(w.runtime._expired), n)))
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        sub = w.subscribe(ack_wait_s=1, max_inflight=10_000)
        w.publish(1_000)
        await w.runtime.flush()
        applied.clear()
        await trio.sleep(0.999)

        async def acker() -> None:
            # Acks arriving while the 1,000 redeliveries go out in chunks of 100.
            await trio.sleep(0.001)
            for seq in range(1, 1_001):
                w.ack(sub, seq)
                if seq % 50 == 0:
                    await trio.lowlevel.checkpoint()

        nursery.start_soon(acker)
        await trio.sleep(0.5)
        await w.runtime.flush()
        assert applied, "the writes were made"
        assert not any(during for during, _ in applied), "nothing was written while the pass ran"
        # 1,000 deletes at most, plus the redelivery puts of messages not acked by the end of the pass
        # (each redelivery acked in the same flush is one delete, not a put and a delete).
        assert sum(n for _, n in applied) < 2_000
        (recovered,) = w.store.recover().subscriptions
        assert dict(recovered.pending) == {}
        nursery.cancel_scope.cancel()


async def test_subscription_writes_gather_for_the_flush_linger(autojump_clock: trio.testing.MockClock) -> None:
    """One ack a millisecond for 100 ms: with a 10 ms linger about ten transactions carry them all,
    each written once, and `flush()` still returns only when everything is stored."""
    w = World(flush_linger_s=0.01)
    writes = w.write_times()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        sub = w.subscribe(ack_wait_s=30, max_inflight=1_000)
        w.publish(100)
        await w.runtime.flush()
        writes.clear()
        start = trio.current_time()
        for seq in range(1, 101):
            await trio.sleep(0.001)
            assert w.ack(sub, seq)
        await w.runtime.flush()
        assert trio.current_time() - start < 0.125, "the last acks waited one linger, not more"
        assert 8 <= len(writes) <= 12, writes
        assert sum(n for _, n in writes) == 100, "each ack's delete written once"
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(writes)]
        assert min(gaps) >= 0.01 - 1e-9
        (recovered,) = w.store.recover().subscriptions
        assert dict(recovered.pending) == {}
        nursery.cancel_scope.cancel()


async def test_a_subscription_made_or_removed_is_written_without_waiting_for_the_linger(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Acks wait for the linger; a subscription's record, made or removed through the door API, does
    not: a crash soon after its answer must not undo it."""
    w = World(flush_linger_s=1.0)
    api = DoorApi(w.core)
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        await w.runtime.flush()
        request = SubscribeRequest("c", "foo", "_INBOX.d", "_ACK.d", 30_000, 1024, durable_name="d")
        sub = api.subscribe(request, lambda sub_id: None)
        await trio.sleep(0.01)
        assert [r.record.sub_id for r in w.store.recover().subscriptions] == [sub]
        w.publish(1)
        await trio.sleep(0.01)
        assert api.ack(sub, 1)
        await trio.sleep(0.5)
        (recovered,) = w.store.recover().subscriptions
        assert recovered.record.last_sent == 0, "a position waits for the linger"
        await trio.sleep(1.0)
        (recovered,) = w.store.recover().subscriptions
        assert recovered.record.last_sent == 1 and dict(recovered.pending) == {}
        api.unsubscribe(sub)
        await trio.sleep(0.01)
        assert w.store.recover().subscriptions == []
        nursery.cancel_scope.cancel()


async def test_first_deliveries_acked_soon_after_a_flush_cut_are_never_written(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A message a millisecond for 100 ms, each acked (as a run, as doors ack a read's burst) 2 ms
    after it went out: with a 10 ms linger, whatever is in flight at a flush was delivered after its
    cut and is acked before the next, so no pending entry is written (nor deleted), only positions;
    everything is stored in the end."""
    w = World(flush_linger_s=0.01)
    written: list[SubUpdate] = []
    apply = w.store.apply

    def recording_apply(updates: Iterable[SubUpdate]) -> None:
        batch = list(updates)
        written.extend(batch)
        apply(batch)

    w.store.apply = recording_apply  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        sub = w.subscribe(ack_wait_s=30, max_inflight=1_000)
        await w.runtime.flush()
        written.clear()
        for seq in range(1, 101):
            w.publish(1)
            await trio.sleep(0.001)
            if seq > 2:
                assert w.pipeline.ack_many(sub, [seq - 2]) == 1
        await trio.sleep(0.002)
        assert w.pipeline.ack_many(sub, [99, 100]) == 2
        await w.runtime.flush()
        kinds = {type(u).__name__ for u in written}
        assert kinds == {"SetLastSent"}, written
        (recovered,) = w.store.recover().subscriptions
        assert dict(recovered.pending) == {}
        assert recovered.record.last_sent == 100
        nursery.cancel_scope.cancel()


async def test_a_write_whose_rest_cancels_out_leaves_nothing_unwritten(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Deliveries before a flush's cut, all acked after it: the write stores neither, nothing is left
    queued, and the runtime says everything is stored (what `state_writes_pending` shows)."""
    w = World(flush_linger_s=0.01)
    writes = w.write_times()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        sub = w.subscribe(ack_wait_s=30, max_inflight=1_000)
        await w.runtime.flush()
        writes.clear()
        w.publish(5)
        await trio.sleep(0.007)  # past the cut halfway through the linger
        assert w.pipeline.ack_many(sub, [1, 2, 3, 4, 5]) == 5
        await trio.sleep(0.005)  # the linger is over: written
        assert [n for _, n in writes] == [1], "only the position"
        assert w.runtime.statistics().unwritten == 0
        with trio.fail_after(0.001):
            await w.runtime.flush()
        (recovered,) = w.store.recover().subscriptions
        assert dict(recovered.pending) == {}
        assert recovered.record.last_sent == 5
        nursery.cancel_scope.cancel()


async def test_dead_letters_are_published(autojump_clock: trio.testing.MockClock) -> None:
    w = World()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        sub = w.subscribe(ack_wait_s=1, max_deliver=2, dead_letter_channel="poison")
        w.publish(1)
        await trio.sleep(5)
        await w.runtime.flush()
        assert [d.attempt for _, d in w.sent if d.sub_id == sub] == [1, 2]
        (letter,) = w.store.read("poison", 1, 10)
        body = json.loads(letter.data)
        assert (body["channel"], body["seq"], body["attempts"], body["sub_id"]) == ("foo", 1, 2, sub)
        assert w.engine.inspect.pending(sub) == {}
        nursery.cancel_scope.cancel()


async def test_ack_progress_and_backoff_move_the_timer(autojump_clock: trio.testing.MockClock) -> None:
    w = World()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        slow = w.subscribe(ack_wait_s=2)
        w.publish(1)
        start = trio.current_time()
        await trio.sleep(1.5)
        assert w.pipeline.ack_progress(slow, 1)
        await trio.sleep(1.9)
        assert len(w.sent) == 1, "ack-progress restarted the wait"
        await trio.sleep(0.2)
        assert [round(t - start, 6) for t, _ in w.sent] == [0.0, 3.5]
        w.ack(slow, 1)
        backoff = w.subscribe(ack_wait_s=30, backoff_ms=(100, 400, 1600))
        w.publish(1)
        start = trio.current_time()
        await trio.sleep(4)
        times = [round(t - start, 6) for t, d in w.sent if d.sub_id == backoff]
        assert times == [0.0, 0.1, 0.5, 2.1, 3.7], "delays follow the backoff list, then repeat the last"
        assert all(d.reason is Reason.ACK_TIMEOUT for _, d in w.sent[-4:])
        nursery.cancel_scope.cancel()


async def test_a_fan_out_wave_is_handled_without_waking_every_timer(autojump_clock: trio.testing.MockClock) -> None:
    """200 subscriptions share each deadline: the expiry worker handles them all in one pass and
    re-arms their timers, so none of the 200 timer tasks has to wake (a wake costs ~20 us in Trio)."""
    w = World()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        subs = [w.subscribe(ack_wait_s=1) for _ in range(200)]
        for _ in range(5):
            w.publish(1)
            await trio.sleep(0.1)
        await trio.sleep(1)
        redelivered = [d for _, d in w.sent if d.attempt == 2]
        assert len(redelivered) == 200 * 5
        assert w.runtime.statistics().timer_fires == 0
        assert w.runtime.statistics().timer_tasks == len(subs)
        nursery.cancel_scope.cancel()


async def test_idle_channels_are_deleted_after_max_inactivity(autojump_clock: trio.testing.MockClock) -> None:
    from storage import ChannelLimits, StoreLimits

    w = World(MemoryStore(limits=StoreLimits(per_channel={"foo": ChannelLimits(max_inactivity_s=30)})))
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        sub = w.subscribe()
        w.publish(3)
        await trio.sleep(100)
        assert w.store.channel_info("foo") is not None, "an active subscription keeps it"
        w.pipeline.unsubscribe(sub)
        await trio.sleep(29)
        assert w.store.channel_info("foo") is not None
        await trio.sleep(2)
        assert w.store.channel_info("foo") is None, "deleted 30 s after the last subscription left"
        nursery.cancel_scope.cancel()


async def test_subscription_writes_start_at_the_end_of_a_publish_commit(autojump_clock: trio.testing.MockClock) -> None:
    """With aligned writes each state write starts at the end of a publish commit, so its fsync does
    not queue ahead of the next publish's; with no commit in sight it waits a few ms at most."""
    w = World(flush_linger_s=0.01, align_state_writes=True)
    writes = w.write_times()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        sub = w.subscribe(ack_wait_s=30, max_inflight=1_000)
        w.publish(10)
        await w.runtime.flush()
        writes.clear()
        start = trio.current_time()
        for seq in range(1, 6):
            assert w.ack(sub, seq)
        await w.runtime.flush()
        assert [(round(t - start, 6), n) for t, n in writes] == [(0.013, 5)], "linger, then at most 3 ms"
        writes.clear()
        start = trio.current_time()
        for seq in range(6, 11):
            assert w.ack(sub, seq)
        await trio.sleep(0.011)  # the linger is over: the write waits for a commit...
        assert not writes
        assert DoorApi(w.core).publish_many([Publish("bar", b"x")], "test") is None
        await trio.lowlevel.checkpoint()
        await w.runtime.flush()
        assert [(round(t - start, 6), n) for t, n in writes] == [(0.011, 5)], "...and starts as it ends"
        (recovered,) = [s for s in w.store.recover().subscriptions if s.record.sub_id == sub]
        assert dict(recovered.pending) == {}
        nursery.cancel_scope.cancel()


class RefusingStore(MemoryStore):
    """A memory store that refuses state writes or appends while told to, as a full disk does (the
    real disk is in tests/faults; here the runtime's ordering is checked under the virtual clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing_state = self.refusing_appends = False
        self.refused = 0

    def apply(self, updates: Iterable[SubUpdate]) -> None:
        batch = list(updates)
        if self.refusing_state and batch:
            self.refused += 1
            raise StoreFullError("disk full (test)")
        super().apply(batch)

    def append(self, messages: Sequence[MessageToAppend], now_unix_ns: int | None = None) -> AppendResult:
        if self.refusing_appends:
            self.refused += 1
            raise StoreFullError("disk full (test)")
        return super().append(messages, now_unix_ns)


def refusing_world() -> tuple[World, RefusingStore]:
    store = RefusingStore()
    return World(store), store


async def test_refused_state_writes_are_kept_in_order_and_retried(autojump_clock: trio.testing.MockClock) -> None:
    """A later position must not land without the pending entries written before it: what the store
    refuses stays queued, in order, and is retried until it lands."""
    w, store = refusing_world()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        sub = w.subscribe(ack_wait_s=60)
        w.publish(3)
        await w.runtime.flush()
        store.refusing_state = True
        w.publish(2)  # delivered: pending 4 and 5, position 5
        for seq in (1, 2):
            w.ack(sub, seq)
        assert not await w.runtime.write_now()
        await trio.sleep(10)
        assert store.refused >= 4, "retried, less often each time"
        assert w.runtime.write_error is not None
        asked = trio.current_time()
        w.runtime.queue_updates([SaveClient(ClientRecord("late", "_HB.late"))])  # a connecting client...
        assert not await w.runtime.write_now()  # ...is answered now, not after the back-off
        assert trio.current_time() - asked < 0.1
        (recovered,) = store.recover().subscriptions
        assert (dict(recovered.pending), recovered.record.last_sent) == ({1: 1, 2: 1, 3: 1}, 3), "nothing yet"
        store.refusing_state = False
        w.runtime.store_writable()  # as a publish commit that lands says
        await w.runtime.flush()
        (recovered,) = store.recover().subscriptions
        assert (dict(recovered.pending), recovered.record.last_sent) == ({3: 1, 4: 1, 5: 1}, 5)
        assert w.runtime.write_error is None
        assert await w.runtime.write_now()
        nursery.cancel_scope.cancel()


async def test_a_refused_dead_letter_holds_back_the_updates_after_it(autojump_clock: trio.testing.MockClock) -> None:
    """The message must stay pending until its dead letter is stored: else a crash in between would
    lose it from both."""
    w, store = refusing_world()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        w.subscribe(ack_wait_s=1, max_deliver=1)
        w.publish(1)
        await w.runtime.flush()
        store.refusing_appends = True
        await trio.sleep(5)  # AckWait ends: a dead letter, refused again and again
        (recovered,) = store.recover().subscriptions
        assert dict(recovered.pending) == {1: 1}, "still pending: its dead letter is not stored"
        dead_channel = store.channel_info("foo.dead")
        assert dead_channel is None or dead_channel.msgs == 0
        store.refusing_appends = False
        await trio.sleep(6)  # the next retry lands it
        (recovered,) = store.recover().subscriptions
        assert dict(recovered.pending) == {}
        dead = store.read("foo.dead", 1, 10)
        assert len(dead) == 1 and json.loads(dead[0].data)["seq"] == 1
        nursery.cancel_scope.cancel()


async def test_the_store_is_writable_again_when_a_write_lands(autojump_clock: trio.testing.MockClock) -> None:
    """A refused publish makes the server degraded; a write that lands ends it, whoever made it."""
    w, _ = refusing_world()
    async with trio.open_nursery() as nursery:
        await w.start(nursery)
        w.subscribe(ack_wait_s=60)
        w.runtime.store_refused(StoreFullError("disk full (test)"))
        assert w.runtime.write_error is not None
        w.publish(1)  # its state write lands
        await w.runtime.flush()
        assert w.runtime.write_error is None
        w.runtime.store_refused(StoreFullError("disk full (test)"))
        w.runtime.store_writable()  # a publish commit that lands, with no state waiting
        assert w.runtime.write_error is None
        nursery.cancel_scope.cancel()
