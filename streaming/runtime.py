"""Runs the delivery engine under Trio: timers, store flushing, and handing deliveries to the sender.

- One task per subscription sleeps in a CancelScope whose deadline is reassigned to the
  subscription's earliest AckWait deadline; there is never a task, scope or timer per message.
  When it fires, expired messages are handled `scan_limit` at a time with a checkpoint in between,
  so acks and publishes are not starved by a large expiry.
- One flusher task writes what the engine queued: dead letters first (published to their channel
  and delivered like any message), then subscription/pending updates in one `Store.apply` per burst.
- Callers change the engine and then call `sync()` (never blocks): deliveries go to `deliver` in
  order, timers are re-armed, the flusher is woken.

With `store_in_thread=True` store writes run on a worker thread (LMDB, in production). Tests under
MockClock keep it False: virtual time jumps while a thread runs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import attrs
import trio

from storage import ChannelError, NewMessage, Store, StoreError, SubUpdate
from streaming.engine import DeadLetter, Delivery, Engine, dead_letter_payload

log = logging.getLogger(__name__)
T = TypeVar("T")


@attrs.define
class _Timer:
    deadline: float = math.inf
    wake: trio.CancelScope | None = None
    task: trio.CancelScope = attrs.Factory(trio.CancelScope)


@attrs.frozen
class RuntimeStatistics:
    timer_tasks: int
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
        scan_limit: int = 1000,
    ) -> None:
        self.engine = engine
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
        self._expiry_passes = 0
        self._longest_chunk = 0.0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the timer tasks and the flusher until cancelled; then flush what is left."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._flusher)
                task_status.started()
                self.sync()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.move_on_after(5, shield=True):
                await self._flush_once()

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
            self._work.set()
            self._idle = trio.Event() if self._idle.is_set() else self._idle
        for sub_id in engine.take_timer_changes():
            self._arm(sub_id)

    async def flush(self) -> None:
        """Wait until everything queued so far is written to the store."""
        self.sync()
        if self._updates or self._dead:
            await self._idle.wait()
        else:
            await trio.lowlevel.checkpoint()

    def statistics(self) -> RuntimeStatistics:
        return RuntimeStatistics(len(self._timers), len(self._updates), self._expiry_passes, self._longest_chunk)

    # -- timers ----------------------------------------------------------------------------------

    def _arm(self, sub_id: int) -> None:
        timer = self._timers.get(sub_id)
        if self.engine.subscription(sub_id) is None:
            if timer is not None:
                timer.task.cancel()
                del self._timers[sub_id]
            return
        deadline = self.engine.next_deadline(sub_id)
        deadline = math.inf if deadline is None else deadline
        if timer is None:
            if deadline == math.inf or self._nursery is None:
                return  # a task is started the first time there is something to wait for
            timer = self._timers[sub_id] = _Timer(deadline)
            self._nursery.start_soon(self._timer_task, sub_id, timer)
            return
        timer.deadline = deadline
        if timer.wake is not None:
            timer.wake.deadline = deadline

    async def _timer_task(self, sub_id: int, timer: _Timer) -> None:
        with timer.task:
            while True:
                with trio.CancelScope(deadline=timer.deadline) as wake:
                    timer.wake = wake
                    await trio.sleep_forever()
                timer.wake = None
                await self._expire(sub_id)
                deadline = self.engine.next_deadline(sub_id)
                timer.deadline = math.inf if deadline is None else deadline

    async def _expire(self, sub_id: int) -> None:
        self._expiry_passes += 1
        more = True
        while more:
            started = trio.current_time()
            more = self.engine.expire(sub_id, trio.current_time(), self._scan_limit)
            self.sync()
            self._longest_chunk = max(self._longest_chunk, trio.current_time() - started)
            await trio.lowlevel.checkpoint()  # let acks and publishes in between long scans

    # -- store writes ----------------------------------------------------------------------------

    async def _flusher(self) -> None:
        while True:
            await self._work.wait()
            self._work = trio.Event()
            await self._flush_once()

    async def _flush_once(self) -> None:
        while self._dead or self._updates:
            dead, self._dead = self._dead, []
            if dead:
                await self._publish_dead_letters(dead)
            updates, self._updates = self._updates, []
            if updates:
                try:
                    await self._call(partial(self.store.apply, updates))
                except StoreError:
                    # Losing these only causes redeliveries; the next burst retries with fresh state.
                    log.exception("could not write %d subscription updates", len(updates))
        self._idle.set()

    async def _publish_dead_letters(self, dead: list[DeadLetter]) -> None:
        # Published before the updates that drop them from pending, so a crash in between
        # can only repeat a dead letter, never lose one.
        messages = []
        for letter in dead:
            try:
                self.store.ensure_channel(letter.channel)
            except ChannelError as exc:
                log.error("dead letter of %s seq %d dropped: %s", letter.origin_channel, letter.seq, exc)
                continue
            messages.append(NewMessage(letter.channel, dead_letter_payload(letter)))
        if not messages:
            return
        result = await self._call(partial(self.store.append, messages))
        now = trio.current_time()
        appended: dict[str, list[int]] = {}
        for message, (seq, _) in zip(messages, result.assigned, strict=True):
            appended.setdefault(message.channel, []).append(seq)
        for channel, dropped in result.dropped.items():
            self.engine.on_dropped(channel, dropped)
        for channel in appended:
            self.engine.on_appended(channel, now)
        self.sync()

    async def _call(self, fn: Callable[[], T]) -> T:
        if self._store_in_thread:
            return await trio.to_thread.run_sync(fn)
        result = fn()
        await trio.lowlevel.checkpoint()
        return result
