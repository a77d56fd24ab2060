"""The engine's clock and the state writer under Trio: AckWait timers, expiry passes, MaxInactivity,
and the subscription-state writes the commit pipeline queues.

- One task per subscription sleeps in a CancelScope whose deadline is reassigned to the
  subscription's earliest AckWait deadline (plus a grace of 50 ms, see below); there is never a task,
  scope or timer per message. When it fires it queues its subscription for the expiry worker.
- The expiry worker handles queued subscriptions `scan_limit` messages at a time with a checkpoint in
  between, so acks and publishes are not starved by a large expiry, and has the commit pipeline carry
  out each chunk's effects (`Pipeline.settle`).
  It also keeps the subscriptions' deadlines in a heap and sleeps until the earliest: when a message
  fanned out to many subscriptions expires everywhere at once, it handles them all in one pass and
  re-arms their timers before they fire. That matters because each cancel-scope expiry costs Trio
  real time and all expiries due at one instant run in one scheduler batch, with no I/O in between
  (a thousand subscriptions sharing a deadline stall the loop). The per-subscription timers are the backstop:
  they fire whenever the worker is more than the grace behind.
- One flusher task writes what the pipeline queued (`queue`): dead letters first (committed through
  the publish group commit, like any publish, and delivered like any message), then
  subscription/pending updates in one `Store.apply` per burst; with `flush_linger` a burst is what
  gathers that long after the first write is queued (group commit). With `align_writes` each write
  waits (briefly) for the end of a publish commit, so that its fsync does not queue ahead of the next
  publish's.

With `store_in_thread=True` store writes run on a worker thread (LMDB, in production), but for large
subscription-state writes (`_INLINE_STATE_WRITE`). Tests under MockClock keep it False: virtual time
jumps while a thread runs.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import TypeVar

import attrs
import trio

from storage import ChannelError, ClearPendingRun, SetPendingRun, StoreError, SubUpdate, net_effect, split_at
from streaming.core.engine import DeadLetter, Engine, dead_letter_payload
from streaming.core.group_commit import GroupCommit
from streaming.core.outbound import Publish
from streaming.core.pipeline import Pipeline, StateWriter
from streaming.core.store_calls import call_store

log = logging.getLogger(__name__)
_INLINE_APPLY = 2000  # store entries per call (about) when the store runs on the Trio thread
# A subscription-state write this large runs on the Trio thread even when the store has a worker
# thread: py-lmdb lets go of the interpreter lock around every put and delete, so on a worker each
# update costs two lock handoffs with a busy event loop (bench/README.md, **consume**). Inline, a write
# of this size takes a fraction of a millisecond, fsync included. Smaller writes (a lightly loaded
# server, where latency matters more) stay on the worker, so their fsync never holds up the loop.
_INLINE_STATE_WRITE = 256
_FLUSH_HOLD_S = 0.2  # the longest subscription writes wait for a redelivery pass
_RETRY_FIRST_S = 0.5  # after a refused state write (a full disk), the first retry; doubled up to
_RETRY_MAX_S = 5.0
# With `align_writes`, a state write starts at the end of a publish commit if one ends within this: its
# fsync is then done before the next publish's, which otherwise queued behind it on the disk.
_STATE_WRITE_ALIGN_S = 0.003
T = TypeVar("T")


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
    unwritten: int  # state writes queued and not yet stored (acks, positions, client records): 0 = all stored


class EngineRuntime(StateWriter):
    def __init__(
        self,
        engine: Engine,
        *,
        store_in_thread: bool = False,
        scan_limit: int = 500,
        grace: float = 0.05,
        flush_linger: float = 0.0,
        align_writes: bool = False,
        writes_in_thread: bool = False,
    ) -> None:
        self.engine = engine
        self._writes_in_thread = writes_in_thread  # even large ones (each waits for a replicated log)
        self._align = align_writes
        self.store = engine.store
        self._pipeline: Pipeline | None = None
        self._commit: GroupCommit | None = None
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
        self._more_work = trio.Event()  # the engine has more to send than one step sent
        self._pass_done = trio.Event()  # set whenever the expiry worker has nothing queued
        self._deadlines: list[tuple[float, int]] = []  # (due, sub id) heap; stale entries skipped
        self._sweep_wake: trio.CancelScope | None = None
        self._grace = grace
        self._linger = flush_linger
        self._expiry_passes = 0
        self._timer_fires = 0
        self._longest_chunk = 0.0
        self._queued = 0  # generation of the queue: counts the additions to it
        self._written = 0  # the generation the last write attempt took in
        self._written_ok = True
        self._stored = 0  # the generation stored last (what a refused write took in is not)
        self._write_done = trio.Event()  # set after every write attempt
        self._urgent = False  # a caller waits for the next write (write_now): no linger before it
        self._linger_scope: trio.CancelScope | None = None
        self._retry_s = _RETRY_FIRST_S
        self._retry_scope: trio.CancelScope | None = None
        # While the store refuses writes (a full disk), the last refusal: state writes' and publishes'.
        self.write_error: StoreError | None = None
        self._state_failing = False

    def bind(self, pipeline: Pipeline, group_commit: GroupCommit) -> None:
        """The pipeline whose effects this writes, and the group commit that stores dead letters."""
        self._pipeline = pipeline
        self._commit = group_commit

    @property
    def pipeline(self) -> Pipeline:
        assert self._pipeline is not None, "bind() first"
        return self._pipeline

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the timer tasks and the flusher until cancelled; then flush what is left."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._flusher)
                nursery.start_soon(self._expiry_worker)
                nursery.start_soon(self._more_worker)
                limits = self.store.limits
                if limits.channel.max_inactivity_s > 0 or any(
                    c.max_inactivity_s > 0 for c in limits.per_channel.values()
                ):
                    nursery.start_soon(self._inactivity_task)
                task_status.started()
                self.pipeline.settle()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.move_on_after(5, shield=True):
                await self._drain()

    def queue(self, dead_letters: list[DeadLetter], updates: list[SubUpdate]) -> None:
        """Queue what the pipeline carried out for writing: dead letters first, then the updates."""
        self._dead += dead_letters
        self._updates += updates
        self._queued += 1
        self._work.set()
        self._idle = trio.Event() if self._idle.is_set() else self._idle

    def rearm(self, sub_ids: Iterable[int]) -> None:
        for sub_id in sub_ids:
            self._arm(sub_id)

    def queue_updates(self, updates: list[SubUpdate]) -> None:
        """Queue state updates of the server's own (client records) behind the engine's, in order."""
        self.pipeline.settle()
        self.queue([], updates)

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

    def more(self) -> bool:
        if self._nursery is None:  # not running (stopping): the pipeline sends it all now
            return False
        self._more_work.set()
        return True

    async def _more_worker(self) -> None:
        """Sends what the engine's pumps left, a step at a time (`Engine.pump_more`), yielding in
        between: the deliveries of each step go out, and other clients are served, before the next."""
        while True:
            await self._more_work.wait()
            self._more_work = trio.Event()
            await trio.lowlevel.checkpoint()
            self.pipeline.pump_more()

    def write_soon(self) -> None:
        """Write what is queued without waiting for the linger, and without waiting for the write: a
        subscription made or removed is stored about as soon as it is answered, not a linger later."""
        self.pipeline.settle()
        self._hurry(self._linger_scope)

    def _hurry(self, *scopes: trio.CancelScope | None) -> None:
        """The next write goes without a linger; `scopes` (a linger, a retry's back-off) end now."""
        self._urgent = True
        self._work.set()
        for scope in scopes:
            if scope is not None:
                scope.cancel()

    async def write_now(self) -> bool:
        """Write everything queued at once (no linger) and wait for it: True once it is stored; False
        if the store refused (a full disk), in which case it stays queued and is written later."""
        self.pipeline.settle()
        target = self._queued
        if self._written >= target:
            await trio.lowlevel.checkpoint()
            return self._written_ok
        self._hurry(self._linger_scope, self._retry_scope)  # someone waits: now, not after a back-off
        while self._written < target:
            await self._write_done.wait()
        return self._written_ok

    async def flush(self) -> None:
        """Wait until everything queued so far is written to the store."""
        self.pipeline.settle()
        if self._updates or self._dead:
            await self._idle.wait()
        else:
            await trio.lowlevel.checkpoint()

    def statistics(self) -> RuntimeStatistics:
        return RuntimeStatistics(
            len(self._timers),
            self._timer_fires,
            len(self._updates),
            self._expiry_passes,
            self._longest_chunk,
            self._queued - self._stored,
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
        (through the pipeline's settle) once it has handled what was due."""
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
                self.pipeline.settle()
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
                try:
                    with self.pipeline.deleting(name):
                        await self._call(partial(self.store.delete_channel, name))
                except StoreError:
                    log.exception("could not delete inactive channel %r", name)
                    continue
                self.pipeline.channel_deleted(name)
                log.info("deleted channel %r after its MaxInactivity", name)
            due = self.engine.next_inactivity_check(trio.current_time())
            await trio.sleep_until(min(due if due is not None else math.inf, trio.current_time() + 1.0))

    # -- store writes ----------------------------------------------------------------------------

    async def _flusher(self) -> None:
        while True:
            await self._work.wait()
            # Group commit: every ack of a busy subscriber queues an update, and a transaction per
            # wake-up would be an fsync per ack, queueing on the disk beside the publish commits
            # that PubAcks and deliveries wait for. Nothing waits for these writes (a crash loses
            # at most the last linger and a half's worth, which only causes redeliveries), so they
            # gather; but for a caller of `write_now` (a connecting client), which cuts the linger
            # short and has everything written. Otherwise what was queued halfway through the linger
            # is written at its end, but for the first deliveries acknowledged meanwhile
            # (`split_at`), and the rest waits for the next write: a write then stores the messages
            # that stayed unacknowledged for half a linger, not every message in flight at its end
            # only for the next write to delete them.
            cut: tuple[int, int] | None = None  # (queue length, generation) at the cut
            if self._linger > 0 and not self._urgent and await self._linger_for(self._linger / 2):
                cut = (len(self._updates), self._queued)
                if not await self._linger_for(self._linger / 2):
                    cut = None
            # While a redelivery pass is under way its subscription writes wait for it (bounded):
            # a worker thread applying them takes the interpreter lock from the pass, and what
            # waits is written once (`net_effect`: a redelivery acked meanwhile is one delete).
            if self._expired and not self._urgent:
                with trio.move_on_after(_FLUSH_HOLD_S):
                    await self._pass_done.wait()
            self._work = trio.Event()
            urgent, self._urgent = self._urgent, False
            if urgent:
                cut = None
            if self._align and not urgent and self._commit is not None:
                await self._commit.wait_commit(_STATE_WRITE_ALIGN_S)
            taken, ok = await self._write_queued(cut)
            self._written, self._written_ok = taken, ok
            if ok:
                self._stored = taken
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
            if self._updates:
                self._work.set()  # what came after the cut goes in the next write
            elif not self._dead:
                self._idle.set()

    async def _drain(self) -> None:
        """Write everything queued, including what arrives meanwhile (shutdown)."""
        while self._dead or self._updates:
            if not (await self._write_queued())[1]:
                log.error(
                    "%d subscription updates could not be written before stopping: after the restart, the "
                    "messages they acknowledged may be delivered again",
                    len(self._updates),
                )
                break
        self._idle.set()

    async def _linger_for(self, seconds: float) -> bool:
        """Let updates gather for `seconds`; False if a `write_now` cut it short."""
        with trio.move_on_after(seconds) as self._linger_scope:
            await trio.sleep_forever()
        self._linger_scope = None
        return not self._urgent

    async def _write_queued(self, cut: tuple[int, int] | None = None) -> tuple[int, bool]:
        """Write one snapshot of the queue: dead letters, then the net effect of the updates (with a
        `cut` (queue length, generation), of those before it, and the rest stays queued:
        `split_at`). Returns the generation the write takes in, and False if the store refused: then
        nothing after the failure is written (order matters: a dead letter is stored before the
        update that drops it from pending), and it is all queued again, first."""
        taken = self._queued
        dead, self._dead = self._dead, []
        if cut is None:
            updates, self._updates = net_effect(self._updates), []
        else:
            updates, self._updates = split_at(self._updates, cut[0])
            if self._updates:  # else what came after the cut cancelled out: it is all taken in
                taken = cut[1]
        if dead and not await self._publish_dead_letters(dead):
            self._dead = dead + self._dead
            self._updates = updates + self._updates
            return taken, False
        # On a worker thread one transaction takes the lot; on the Trio thread slices keep the
        # loop responsive (each slice is still applied in order, so the result is the same). Sizes
        # count store entries: a run of first deliveries or acks is one update of many entries.
        sizes = [len(u.seqs) if type(u) is SetPendingRun or type(u) is ClearPendingRun else 1 for u in updates]
        in_thread = self._store_in_thread and (self._writes_in_thread or sum(sizes) < _INLINE_STATE_WRITE)
        start = 0
        while start < len(updates):
            end, entries = start, 0
            while end < len(updates) and (in_thread or entries < _INLINE_APPLY):
                entries += sizes[end]
                end += 1
            try:
                await call_store(partial(self.store.apply, updates[start:end]), in_thread=in_thread)
            except StoreError as exc:
                self._updates = updates[start:] + self._updates
                self._failed(exc)
                return taken, False
            start = end
        self._recovered()
        return taken, True

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
        assert self._commit is not None, "bind() first"
        outcomes = await self._commit.store_own([Publish(d.channel, dead_letter_payload(d)) for d in dead])
        for letter, outcome in zip(dead, outcomes, strict=True):
            if isinstance(outcome, StoreError) and not isinstance(outcome, ChannelError):
                self._failed(outcome)
                return False
            if isinstance(outcome, Exception):
                log.error("dead letter of %s seq %d dropped: %s", letter.origin_channel, letter.seq, outcome)
        return True

    async def _call(self, fn: Callable[[], T]) -> T:
        return await call_store(fn, in_thread=self._store_in_thread)
