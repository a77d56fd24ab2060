"""The delivery core assembled: the store, the engine, the commit pipeline, the publish group commit
and the runtime, recovered and run as one.

Front doors never touch this: they use its door API (`Core.api`, streaming.core.door_api), which
is all they may call. The server, monitoring and tests of the core itself see the parts here.

After a restart, commits and deliveries wait (up to `recovery_hold_s`) until the subscribers that had
messages pending are reachable again, so that those messages are redelivered before anything new.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

import attrs
import trio

from storage import DamagedStoreError, RecoveredState, RecoveredSubscription, Store, StoreError
from storage.integrity import beyond_channels
from streaming.core.engine import Engine, Observer, recover
from streaming.core.group_commit import GroupCommit
from streaming.core.observers import ServerObserver
from streaming.core.outbound import Doors
from streaming.core.pipeline import Pipeline
from streaming.core.runtime import EngineRuntime
from streaming.core.store_calls import call_store

log = logging.getLogger(__name__)
# Subscription-state writes (acks, positions) gather this long into one fsynced transaction; a
# crash loses at most that much of them and a half, which only causes redeliveries. Long enough that a
# busy subscriber's deliveries are mostly acked within it, so that neither is written: with ten
# subscribers of MaxInflight 1,024 a message is in flight ~0.1 s (bench/README.md, *Figures behind
# choices*). Subscriptions made or removed do not wait for it (`EngineRuntime.write_soon`).
_STATE_FLUSH_LINGER_S = 0.1
# An FT group's active: its state writes are what a standby takes over with, and a takeover is an
# event the group is built for, not a crash: there a write lingers a third as long, so that a
# takeover redelivers no more than it did.
_REPLICATED_FLUSH_LINGER_S = 0.03


class Core:
    def __init__(
        self,
        store: Store,
        *,
        store_in_thread: bool,
        engine_observers: Sequence[Observer] = (),
        observer: ServerObserver | None = None,
        recovery_hold_s: float = 5.0,
        scan_limit: int = 500,
        grace: float = 0.05,
        flush_linger_s: float | None = None,
        align_state_writes: bool | None = None,
        remote_store: bool = False,
    ) -> None:
        self.store = store
        self.in_thread = store_in_thread  # store calls that may fsync run on a worker thread
        self._engine_observers = list(engine_observers)
        self._observer = observer
        self._hold_s = recovery_hold_s
        self._scan_limit = scan_limit
        self._grace = grace
        # With the store on a worker thread (LMDB), state writes linger and wait for a publish commit's
        # end; a memory store's writes cost nothing, so they go at once.
        if flush_linger_s is not None:
            self._linger = flush_linger_s
        elif not store_in_thread:
            self._linger = 0.0
        else:
            self._linger = _REPLICATED_FLUSH_LINGER_S if remote_store else _STATE_FLUSH_LINGER_S
        self._align = align_state_writes if align_state_writes is not None else store_in_thread
        # Every write waits for a replicated log's quorum (an FT group's active): never on the loop.
        self._remote = remote_store
        self.doors = Doors()
        self.recovered: RecoveredState
        self.engine: Engine
        self.runtime: EngineRuntime
        self.pipeline: Pipeline
        self.group_commit: GroupCommit
        self.ready = trio.Event()  # recovery finished: commits and deliveries flow

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover, then run the runtime and the group commit until cancelled."""
        state: RecoveredState = await call_store(self.store.recover, in_thread=self.in_thread)
        state = self._check_positions(state)
        self.engine = recover(self.store, state, time.time_ns())
        for engine_observer in self._engine_observers:
            self.engine.add_observer(engine_observer)
        self.runtime = EngineRuntime(
            self.engine,
            store_in_thread=self.in_thread,
            scan_limit=self._scan_limit,
            grace=self._grace,
            flush_linger=self._linger,
            align_writes=self._align,
            writes_in_thread=self._remote,
        )
        self.pipeline = Pipeline(
            self.store, self.engine, self.doors, self.runtime, clock=trio.current_time, observer=self._observer
        )
        self.group_commit = GroupCommit(self.pipeline, store_in_thread=self.in_thread, appends_on_loop=not self._remote)
        self.runtime.bind(self.pipeline, self.group_commit)
        clients = {c.client_id for c in state.clients}
        held = [s.record.inbox for s in state.subscriptions if s.pending and s.record.client_id in clients]
        # The engine holds the pending messages now (100,000 are ~10 MB): the doors read only who
        # was there, and this frame lives as long as the server.
        state = attrs.evolve(state, subscriptions=[RecoveredSubscription(s.record, {}) for s in state.subscriptions])
        self.recovered = state
        if held:
            self.group_commit.pause()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.runtime.run)
            await nursery.start(self.group_commit.run)
            if self._expiry_configured():
                nursery.start_soon(self._age_sweeper)
            nursery.start_soon(self._start_after_recovery, held)
            task_status.started()

    def _check_positions(self, state: RecoveredState) -> RecoveredState:
        """Refuse a store whose subscribers were sent messages it no longer holds (see
        `beyond_channels`); without file sync that is what a machine crash may do: say so, go on."""
        state, problems = beyond_channels(state)
        if problems and self.store.synced:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise DamagedStoreError(
                f"{problems[0]}{more}: acknowledged messages are missing from the store's journal "
                "(its last record is damaged, or a journal file was replaced)"
            )
        for problem in problems:
            log.warning("%s (file_sync is off: a machine crash loses what was written since the last flush)", problem)
        return state

    async def _start_after_recovery(self, inboxes: list[str]) -> None:
        """Recovered pending messages go out before new ones: wait (bounded) until the subscribers
        that have some are reachable through their doors, then redeliver, then let commits through."""
        if inboxes:
            with trio.move_on_after(self._hold_s):
                await self.doors.wait_reachable(inboxes)
        self.pipeline.start()
        self.group_commit.resume()
        self.ready.set()

    # -- limits ----------------------------------------------------------------------------------

    def _expiry_configured(self) -> bool:
        limits = self.store.limits
        return limits.channel.max_age_s > 0 or any(c.max_age_s > 0 for c in limits.per_channel.values())

    async def _age_sweeper(self) -> None:
        """Removes messages past MaxAge; the store says when the next one expires."""
        while True:
            try:
                result = await call_store(self.store.expire, in_thread=self.in_thread)
            except StoreError:
                log.exception("MaxAge sweep failed")
                await trio.sleep(1)
                continue
            self.pipeline.dropped(result.dropped)
            delay = 1.0
            if result.next_expiry_unix_ns is not None:
                delay = (result.next_expiry_unix_ns - time.time_ns()) / 1e9
            await trio.sleep(min(max(delay, 0.005), 1.0) if not math.isnan(delay) else 1.0)
