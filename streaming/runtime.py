"""Runs the delivery engine under Trio: timers, store flushing, and handing deliveries to the sender.

- One task per subscription sleeps in a CancelScope whose deadline is reassigned to the
  subscription's earliest AckWait deadline (plus a grace of 50 ms, see below); there is never a task,
  scope or timer per message. When it fires it queues its subscription for the expiry worker.
- The expiry worker handles queued subscriptions `scan_limit` messages at a time with a checkpoint in
  between, so acks and publishes are not starved by a large expiry, and calls `sync()` once per chunk.
  It also keeps the subscriptions' deadlines in a heap and sleeps until the earliest: when a message
  fanned out to many subscriptions expires everywhere at once, it handles them all in one pass and
  re-arms their timers before they fire. That matters because a cancel-scope expiry costs ~20 us in
  Trio and all expiries due at one instant run in one scheduler batch, with no I/O in between (1,000
  subscriptions sharing a deadline: a 20 ms stall). The per-subscription timers are the backstop:
  they fire whenever the worker is more than the grace behind.
- One flusher task writes what the engine queued: dead letters first (published to their channel
  and delivered like any message), then subscription/pending updates in one `Store.apply` per burst;
  with `flush_linger` a burst is what gathers that long after the first write is queued (group commit).
  A `before_state_write` hook is awaited before each write: the server's waits (briefly) for the end
  of a publish commit, so that the write's fsync does not queue ahead of the next publish's.
- Callers change the engine and then call `sync()` (never blocks): deliveries go to `deliver` in
  order, timers are re-armed, the flusher is woken.

With `store_in_thread=True` store writes run on a worker thread (LMDB, in production), but for large
subscription-state writes (`_INLINE_STATE_WRITE`). Tests under MockClock keep it False: virtual time
jumps while a thread runs.
"""

from __future__ import annotations

import gc
import heapq
import logging
import math
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

import attrs
import trio

from storage import ChannelError, NewMessage, Store, StoreError, SubUpdate, net_effect
from streaming.engine import DeadLetter, Delivery, Engine, dead_letter_payload
from streaming.observers import ServerObserver

log = logging.getLogger(__name__)
_INLINE_APPLY = 2000  # updates per store call when the store runs on the Trio thread
# A subscription-state write this large runs on the Trio thread even when the store has a worker
# thread: py-lmdb lets go of the interpreter lock around every put and delete, so on a worker each
# update costs two lock handoffs with a busy event loop (consume with acks: +8% here, +15% with the
# event log on). Inline, 256 updates cost ~0.3 ms, fsync included. Smaller writes (a lightly loaded
# server, where latency matters more) stay on the worker, so their fsync never holds up the loop.
_INLINE_STATE_WRITE = 256
_FLUSH_HOLD_S = 0.2  # the longest subscription writes wait for a redelivery pass
_RETRY_FIRST_S = 0.5  # after a refused state write (a full disk), the first retry; doubled up to
_RETRY_MAX_S = 5.0
T = TypeVar("T")


def tune_gc() -> None:
    """The collector policy for a long-running server process; call it once after recovery.

    With the default thresholds a full collection walks every live object every ~700 x 10 x 10
    allocations, and on this workload that is a 20-50 ms pause in the middle of a redelivery pass.
    Freezing what exists after startup (recovered state, imported code) takes it out of every later
    scan, and larger thresholds make young and full collections rarer. Cycles are still collected.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


@attrs.define
class _Timer:
    deadline: float = math.inf  # when this timer task wakes: the subscription's deadline + grace
    due: float = math.inf  # the subscription's earliest deadline, as the engine says
    wake: trio.CancelScope | None = None
    task: trio.CancelScope = attrs.Factory(trio.CancelScope)


@attrs.frozen
class RuntimeStatistics:
    timer_tasks: int
    timer_fires: int  # per-subscription timers that had to wake (the worker was behind)
    queued_updates: int
    expiry_passes: int
    longest_expiry_chunk_s: float


class EngineRuntime:
    def __init__(
        self,
        engine: Engine,
        deliver: Callable[[list[Delivery]], None],
        *,
        store_in_thread: bool = False,
        scan_limit: int = 500,
        grace: float = 0.05,
        flush_linger: float = 0.0,
        before_state_write: Callable[[], Awaitable[None]] | None = None,
        observer: ServerObserver | None = None,
    ) -> None:
        self.engine = engine
        self._before_write = before_state_write
        self._observer = observer
        self.store: Store = engine.store
        self._deliver = deliver
        self._store_in_thread = store_in_thread
        self._scan_limit = scan_limit
        self._timers: dict[int, _Timer] = {}
        self._updates: list[SubUpdate] = []
        self._dead: list[DeadLetter] = []
        self._work = trio.Event()
        self._idle = trio.Event()
        self._idle.set()
        self._nursery: trio.Nursery | None = None
        self._expired: dict[int, None] = {}  # subscriptions whose deadline passed, in order
        self._expiry_work = trio.Event()
        self._pass_done = trio.Event()  # set whenever the expiry worker has nothing queued
        self._deadlines: list[tuple[float, int]] = []  # (due, sub id) heap; stale entries skipped
        self._sweep_wake: trio.CancelScope | None = None
        self._grace = grace
        self._linger = flush_linger
        self.deleting: set[str] = set()  # channels being deleted for MaxInactivity (publishes refused)
        self._expiry_passes = 0
        self._timer_fires = 0
        self._longest_chunk = 0.0
        self._queued = 0  # generation of the queue: counts sync()s and queue_updates() that added to it
        self._written = 0  # the generation the last write attempt took in
        self._written_ok = True
        self._write_done = trio.Event()  # set after every write attempt
        self._urgent = False  # a caller waits for the next write (write_now): no linger before it
        self._linger_scope: trio.CancelScope | None = None
        self._retry_s = _RETRY_FIRST_S
        self._retry_scope: trio.CancelScope | None = None
        # While the store refuses writes (a full disk), the last refusal: state writes' and publishes'.
        self.write_error: StoreError | None = None
        self._state_failing = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the timer tasks and the flusher until cancelled; then flush what is left."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._flusher)
                nursery.start_soon(self._expiry_worker)
                limits = self.store.limits
                if limits.channel.max_inactivity_s > 0 or any(
                    c.max_inactivity_s > 0 for c in limits.per_channel.values()
                ):
                    nursery.start_soon(self._inactivity_task)
                task_status.started()
                self.sync()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.move_on_after(5, shield=True):
                await self._drain()

    def sync(self) -> None:
        """Take everything the engine queued since the last call and act on it. Never blocks."""
        engine = self.engine
        deliveries = engine.take_deliveries()
        if deliveries:
            self._deliver(deliveries)
        dead = engine.take_dead_letters()
        updates = engine.take_updates()
        if dead or updates:
            self._dead += dead
            self._updates += updates
            self._queued += 1
            self._work.set()
            self._idle = trio.Event() if self._idle.is_set() else self._idle
        for sub_id in engine.take_timer_changes():
            self._arm(sub_id)

    def queue_updates(self, updates: list[SubUpdate]) -> None:
        """Queue state updates of the server's own (client records) behind the engine's, in order."""
        self.sync()
        self._updates += updates
        self._queued += 1
        self._work.set()
        self._idle = trio.Event() if self._idle.is_set() else self._idle

    def store_refused(self, exc: StoreError) -> None:
        """The store refused a write of someone else's (a publish commit): the server is degraded."""
        self.write_error = exc

    def store_writable(self) -> None:
        """The store took a write again (a publish commit after refusals): retry the state now."""
        if self._retry_scope is not None:
            self._retry_s = _RETRY_FIRST_S
            self._retry_scope.cancel()
        if not (self._updates or self._dead):
            self.write_error = None  # else the retry it wakes says whether the state lands

    async def write_now(self) -> bool:
        """Write everything queued at once (no linger) and wait for it: True once it is stored; False
        if the store refused (a full disk), in which case it stays queued and is written later."""
        self.sync()
        target = self._queued
        if self._written >= target:
            await trio.lowlevel.checkpoint()
            return self._written_ok
        self._urgent = True
        self._work.set()
        for scope in (self._linger_scope, self._retry_scope):  # someone waits: now, not after a back-off
            if scope is not None:
                scope.cancel()
        while self._written < target:
            await self._write_done.wait()
        return self._written_ok

    async def flush(self) -> None:
        """Wait until everything queued so far is written to the store."""
        self.sync()
        if self._updates or self._dead:
            await self._idle.wait()
        else:
            await trio.lowlevel.checkpoint()

    def statistics(self) -> RuntimeStatistics:
        return RuntimeStatistics(
            len(self._timers), self._timer_fires, len(self._updates), self._expiry_passes, self._longest_chunk
        )

    # -- timers ----------------------------------------------------------------------------------

    def _arm(self, sub_id: int) -> None:
        timer = self._timers.get(sub_id)
        if not self.engine.has_subscription(sub_id):
            if timer is not None:
                timer.task.cancel()
                del self._timers[sub_id]
            return
        deadline = self.engine.next_deadline(sub_id)
        deadline = math.inf if deadline is None else deadline
        if timer is None:
            if deadline == math.inf or self._nursery is None:
                return  # a task is started the first time there is something to wait for
            timer = self._timers[sub_id] = _Timer()
            self._set_deadline(sub_id, timer, deadline)
            self._nursery.start_soon(self._timer_task, sub_id, timer)
            return
        self._set_deadline(sub_id, timer, deadline)

    def _set_deadline(self, sub_id: int, timer: _Timer, due: float) -> None:
        if due == timer.due:
            return  # unchanged (the common case: a subscription's earliest deadline rarely moves)
        timer.due = due
        timer.deadline = due + self._grace if due != math.inf else math.inf
        if timer.wake is not None:
            timer.wake.deadline = timer.deadline
        if due != math.inf:
            heapq.heappush(self._deadlines, (due, sub_id))
            if self._sweep_wake is not None and due < self._sweep_wake.deadline:
                self._sweep_wake.deadline = due

    async def _timer_task(self, sub_id: int, timer: _Timer) -> None:
        with timer.task:
            while True:
                with trio.CancelScope(deadline=timer.deadline) as wake:
                    timer.wake = wake
                    await trio.sleep_forever()
                timer.wake = None
                self._timer_fires += 1
                self._queue(sub_id, timer)
                self._expiry_work.set()

    def _queue(self, sub_id: int, timer: _Timer) -> None:
        """Hand a due subscription to the expiry worker and disarm its timer; the worker re-arms it
        (through sync()) once it has handled what was due."""
        timer.deadline = timer.due = math.inf
        if timer.wake is not None:
            timer.wake.deadline = math.inf
        self._expired[sub_id] = None

    async def _expiry_worker(self) -> None:
        """Handles expired subscriptions `scan_limit` messages at a time, yielding in between.

        One worker rather than each timer task doing its own work: when many subscriptions expire at
        once, their timer tasks all wake in one scheduler batch, and Trio only looks at the network
        between batches. Here a batch holds at most one chunk.
        """
        while True:
            with trio.CancelScope(deadline=self._deadlines[0][0] if self._deadlines else math.inf) as wake:
                self._sweep_wake = wake
                await self._expiry_work.wait()
            self._sweep_wake = None
            self._expiry_work = trio.Event()
            self._sweep(trio.current_time())
            while self._expired:
                self._expiry_passes += 1
                started = time.perf_counter()
                now = trio.current_time()
                budget = self._scan_limit
                while self._expired and budget > 0:
                    sub_id = next(iter(self._expired))
                    handled = self.engine.expire(sub_id, now, budget)
                    budget -= handled
                    if budget > 0:  # this subscription is done for now
                        del self._expired[sub_id]
                        self.engine.mark_timer(sub_id)
                self.sync()
                self._longest_chunk = max(self._longest_chunk, time.perf_counter() - started)
                await trio.lowlevel.checkpoint()  # let acks and publishes in between chunks
                self._sweep(trio.current_time())
            self._pass_done.set()
            self._pass_done = trio.Event()

    def _sweep(self, now: float) -> None:
        """Queue every subscription whose deadline has passed, earliest first, before its own timer
        task has to wake for it (see the module docstring)."""
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            due, sub_id = heapq.heappop(heap)
            timer = self._timers.get(sub_id)
            if timer is not None and timer.due == due:  # else a stale entry: re-armed since
                self._queue(sub_id, timer)

    async def _inactivity_task(self) -> None:
        """Deletes channels idle for their MaxInactivity. Publishes and departures move the deadlines,
        so it looks again at least once a second (one scan of the channel list, not per message)."""
        while True:
            now = trio.current_time()
            for name in self.engine.inactive_channels(now):
                self.deleting.add(name)
                try:
                    await self._call(partial(self.store.delete_channel, name))
                except StoreError:
                    log.exception("could not delete inactive channel %r", name)
                    continue
                finally:
                    self.deleting.discard(name)
                self.engine.drop_channel(name)
                log.info("deleted channel %r after its MaxInactivity", name)
            self.sync()
            due = self.engine.next_inactivity_check(trio.current_time())
            await trio.sleep_until(min(due if due is not None else math.inf, trio.current_time() + 1.0))

    # -- store writes ----------------------------------------------------------------------------

    async def _flusher(self) -> None:
        while True:
            await self._work.wait()
            # Group commit: every ack of a busy subscriber queues an update, and a transaction per
            # wake-up would be an fsync per ack, queueing on the disk beside the publish commits
            # that PubAcks and deliveries wait for. Nothing waits for these writes (a crash loses
            # at most the last linger's worth, which only causes redeliveries), so they gather;
            # but for a caller of `write_now` (a connecting client), which cuts the linger short.
            if self._linger > 0 and not self._urgent:
                with trio.move_on_after(self._linger) as self._linger_scope:
                    await trio.sleep_forever()
                self._linger_scope = None
            # While a redelivery pass is under way its subscription writes wait for it (bounded):
            # a worker thread applying them takes the interpreter lock from the pass, and what
            # waits is written once (`net_effect`: a redelivery acked meanwhile is one delete).
            if self._expired and not self._urgent:
                with trio.move_on_after(_FLUSH_HOLD_S):
                    await self._pass_done.wait()
            self._work = trio.Event()
            urgent, self._urgent = self._urgent, False
            if self._before_write is not None and not urgent:
                await self._before_write()
            taken = self._queued
            ok = await self._write_queued()
            self._written, self._written_ok = taken, ok
            self._write_done.set()
            self._write_done = trio.Event()
            if not ok:
                # The store refuses writes (a full disk): what failed is queued again, in order, and
                # tried again later (or as soon as `store_writable` says a commit went through);
                # meanwhile deliveries and acks go on in memory.
                with trio.move_on_after(self._retry_s) as self._retry_scope:
                    await trio.sleep_forever()
                self._retry_scope = None
                self._retry_s = min(self._retry_s * 2, _RETRY_MAX_S)
                self._work.set()
                continue
            self._retry_s = _RETRY_FIRST_S
            if not (self._dead or self._updates):
                self._idle.set()

    async def _drain(self) -> None:
        """Write everything queued, including what arrives meanwhile (shutdown)."""
        while self._dead or self._updates:
            if not await self._write_queued():
                log.error(
                    "%d subscription updates could not be written before stopping: after the restart, the "
                    "messages they acknowledged may be delivered again",
                    len(self._updates),
                )
                break
        self._idle.set()

    async def _write_queued(self) -> bool:
        """Write one snapshot of the queue: dead letters, then the net effect of the updates. False if
        the store refused: then nothing after the failure is written (order matters: a dead letter is
        stored before the update that drops it from pending), and it is all queued again, first."""
        dead, self._dead = self._dead, []
        updates, self._updates = net_effect(self._updates), []
        if dead and not await self._publish_dead_letters(dead):
            self._dead = dead + self._dead
            self._updates = updates + self._updates
            return False
        # On a worker thread one transaction takes the lot; on the Trio thread slices keep the
        # loop responsive (each slice is still applied in order, so the result is the same).
        in_thread = self._store_in_thread and len(updates) < _INLINE_STATE_WRITE
        step = len(updates) if in_thread else _INLINE_APPLY
        for start in range(0, len(updates), step or 1):
            try:
                await call_store(partial(self.store.apply, updates[start : start + step]), in_thread=in_thread)
            except StoreError as exc:
                self._updates = updates[start:] + self._updates
                self._failed(exc)
                return False
        self._recovered()
        return True

    def _failed(self, exc: StoreError) -> None:
        if not self._state_failing:
            self._state_failing = True
            log.error(
                "subscription state cannot be written (%s): positions, acks and client registrations are "
                "kept in memory and written when the store takes them again; a crash meanwhile can only "
                "cause redeliveries",
                exc,
            )
        self.write_error = exc

    def _recovered(self) -> None:
        if self._state_failing:
            self._state_failing = False
            log.info("subscription state is written again")
        self.write_error = None

    async def _publish_dead_letters(self, dead: list[DeadLetter]) -> bool:
        """Store dead letters (False if the store refused). They go before the updates that drop
        them from pending, so a crash in between can only repeat a dead letter, never lose one."""
        messages = []
        for letter in dead:
            try:
                self.store.ensure_channel(letter.channel)
            except ChannelError as exc:
                log.error("dead letter of %s seq %d dropped: %s", letter.origin_channel, letter.seq, exc)
                continue
            except StoreError as exc:
                self._failed(exc)
                return False
            messages.append(NewMessage(letter.channel, dead_letter_payload(letter)))
        if not messages:
            return True
        started = time.perf_counter()
        try:
            result = await self._call(partial(self.store.append, messages))
        except StoreError as exc:
            self._failed(exc)
            return False
        if self._observer is not None:
            self._observer.on_commit(time.perf_counter() - started, len(messages))
            for message, (seq, _) in zip(messages, result.assigned, strict=True):
                self._observer.on_published(message.channel, seq, 1, len(message.data))
        now = trio.current_time()
        for channel, dropped in result.dropped.items():
            self.engine.on_dropped(channel, dropped)
        for channel in {m.channel for m in messages}:
            self.engine.on_appended(channel, now)
        self.sync()
        return True

    async def _call(self, fn: Callable[[], T]) -> T:
        return await call_store(fn, in_thread=self._store_in_thread)


async def call_store(fn: Callable[[], T], *, in_thread: bool) -> T:
    """Run one store call: on a worker thread (LMDB in production, so the event loop never waits for
    an fsync), or inline followed by a checkpoint (memory store; tests under MockClock)."""
    if in_thread:
        return await trio.to_thread.run_sync(fn)
    result = fn()
    await trio.lowlevel.checkpoint()
    return result
