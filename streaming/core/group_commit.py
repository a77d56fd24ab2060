"""Publish group commit under Trio: every publish accepted from any front door while the store is busy
goes into the next single commit of the pipeline (`streaming.core.pipeline`: one `Store.append`, one
journal record, fsynced unless `file_sync` is off; then deliveries, then every publisher's
acknowledgement, in arrival order, as the reference server does).

A lone publish is committed at once (a batch of one), so sequential publishers are not delayed; under
load the batch grows by itself while the previous commit runs. Small batches (up to `inline_batch`
messages and `inline_bytes` of payload) are committed on the event loop; larger ones with the append on
the store thread, so that parsing overlaps it and the loop is never held long. Accepted publishes
beyond `high_water` make the publishing connections wait (TCP back-pressure), so memory stays bounded.

When only one connection has been publishing lately and its input span is over with no more input
waiting, the span's end commits its publishes there and then (`after_span`), inside the doors' write
hold, so the deliveries and acknowledgements are written before the reader yields (the hop to the
commit task costs about a twentieth of a publish's round trip). Otherwise the task commits:
- several connections publishing: the task runs after every reader Trio woke in the same batch, so
  their publishes share one commit (Trio's statistics cannot tell a reader that those readers are
  about to run: they are not on the run queue);
- a stream on one connection (a full read, or events left to parse): the task's batch grows while
  the reader reads on, and a large one goes to the store thread, overlapping the parsing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial

import attrs
import trio

from storage import AppendResult, StoreError
from streaming.core.outbound import Publish
from streaming.core.pipeline import Pipeline
from streaming.core.store_calls import call_store

log = logging.getLogger(__name__)
_SHARED_WINDOW_S = 0.01  # publishes from two origins this close together: commit in the task


@attrs.frozen
class GroupCommitStatistics:
    queued: int
    commits: int
    messages: int
    largest_batch: int
    inline_commits: int  # commits made at the end of an input span, not by the commit task
    thread_commits: int  # commits whose append ran on the store thread (batches too large to hold the loop)


class _Outcomes:
    """The origin of the server's own publishes (dead letters): keeps each one's error, if any."""

    def __init__(self) -> None:
        self.errors: dict[int, Exception] = {}

    def published(self, publishes: Sequence[Publish], errors: dict[int, Exception]) -> None:
        for p in publishes:
            error = errors.get(id(p))
            if error is not None:
                self.errors[id(p)] = error


class GroupCommit:
    def __init__(
        self,
        pipeline: Pipeline,
        *,
        store_in_thread: bool,
        max_batch: int = 8192,
        high_water: int = 65536,
        inline_batch: int = 128,
        inline_bytes: int = 64 * 1024,
    ) -> None:
        self._pipeline = pipeline
        self._in_thread = store_in_thread
        self._max_batch = max_batch
        self._high_water = high_water
        self._inline_batch = inline_batch
        self._inline_bytes = inline_bytes
        self._queue: list[Publish] = []
        self._work = trio.Event()
        self._room = trio.Event()
        self._room.set()
        self._committed = 0  # publishes done (acked or refused), counting from the first
        self._submitted = 0
        self._progress = trio.Event()
        self._paused = False
        self._busy = False  # the task is inside a commit (it may await): nothing may commit past it
        self._running = False
        self._in_span = False  # a front door is handling input: its span's end commits or wakes the task
        self._last_origin: str | None = None  # ack address (one per connection) of the latest publish
        self._shared_at = -_SHARED_WINDOW_S  # when the latest publish came from another origin
        self.inline_commits = 0
        self.thread_commits = 0

    def submit(self, publish: Publish) -> bool:
        """Queue a publish; committed at the end of the current input span, or by the task. False when
        the queue is past its high water: wait for `wait_room` before accepting more."""
        return self.submit_many([publish], publish.ack_to)

    def submit_many(self, publishes: list[Publish], ack_to: str) -> bool:
        """`submit` of each of `publishes` from one origin (`ack_to`, every one's): a run of them."""
        self._queue += publishes
        self._submitted += len(publishes)
        if ack_to != self._last_origin:
            if self._last_origin is not None:
                self._shared_at = trio.current_time()
            self._last_origin = ack_to
        if not self._in_span and not self._paused:
            self._work.set()
        if len(self._queue) >= self._high_water and self._room.is_set():
            self._room = trio.Event()
            return False
        return self._room.is_set()

    def span_started(self) -> None:
        self._in_span = True

    def after_span(self, *, more_input: bool = False) -> None:
        """Commit what is queued here and now when the door has no more input waiting, no other
        origin has published lately, no await is needed and the batch is small; otherwise wake
        the commit task. Never blocks but for a small commit's fsync, as the task would."""
        self._in_span = False
        queue = self._queue
        if not queue or self._paused:
            return
        if (
            more_input  # a stream of publishes: the task's batches grow, and large ones overlap parsing
            or self._busy
            or len(queue) > self._max_batch
            or not self._on_loop(queue)
            or trio.current_time() - self._shared_at < _SHARED_WINDOW_S
            or not self._pipeline.channels_exist(queue)
        ):
            self._work.set()
            return
        self._queue = []
        self.inline_commits += 1
        try:
            self._pipeline.commit(queue, {})  # its channels exist: checked above
        except Exception:
            self._pipeline.refuse(queue)
        self._done(queue)

    async def wait_room(self) -> None:
        await self._room.wait()

    def pause(self) -> None:
        """Hold commits (accepting and queueing still work): used while recovery waits for clients."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._work.set()

    async def flush(self) -> None:
        """Wait until every publish submitted so far is committed and acknowledged."""
        target = self._submitted
        while self._committed < target:
            await self._progress.wait()
        await trio.lowlevel.checkpoint()

    async def wait_commit(self, within: float) -> None:
        """Return when the next commit is done (acknowledged or refused), or after `within` seconds."""
        with trio.move_on_after(within):
            await self._progress.wait()

    async def store_own(self, publishes: list[Publish]) -> dict[int, Exception]:
        """Commit the server's own messages (dead letters) with everyone's, and wait for it: the
        errors by `id()` of the publishes refused (none: all stored). With the commit task gone
        (shutting down), they are committed here."""
        outcomes = _Outcomes()
        for p in publishes:
            p.origin = outcomes
        if not self._running:
            try:
                self._pipeline.commit(publishes)
            except Exception:
                self._pipeline.refuse(publishes)
            await trio.lowlevel.checkpoint()
            return outcomes.errors
        for p in publishes:
            self.submit(p)
        await self.flush()
        return outcomes.errors

    def statistics(self) -> GroupCommitStatistics:
        pipeline = self._pipeline
        return GroupCommitStatistics(
            len(self._queue),
            pipeline.commits,
            self._committed,
            pipeline.largest_batch,
            self.inline_commits,
            self.thread_commits,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._running = True
        task_status.started()
        try:
            while True:
                await self._work.wait()
                self._work = trio.Event()
                while self._queue and not self._paused:
                    batch = self._queue[: self._max_batch]
                    del self._queue[: self._max_batch]
                    self._busy = True
                    try:
                        await self._commit(batch)
                    except Exception:
                        self._pipeline.refuse(batch)
                    finally:
                        self._busy = False
                        self._done(batch)
                    if self._queue:
                        # A small next batch is committed inline, holding the loop for its fsync:
                        # first let the connection writers send what of this one's deliveries and
                        # acknowledgements the sockets did not take at once. They became runnable
                        # during this step; a task's order within Trio's next batch is a coin flip,
                        # so after two checkpoints they have run either way.
                        await trio.lowlevel.checkpoint()
                        await trio.lowlevel.checkpoint()
        finally:
            self._running = False
            # Shutting down: what was accepted is still stored (clients may or may not get the ack).
            with trio.move_on_after(10, shield=True):
                while self._queue:
                    batch = self._queue[: self._max_batch]
                    del self._queue[: self._max_batch]
                    await self._commit(batch)
                    self._done(batch)

    async def _commit(self, batch: list[Publish]) -> None:
        pipeline = self._pipeline
        missing, refused = pipeline.missing_channels(batch)
        for name in missing:
            await call_store(partial(pipeline.create_channel, name, refused), in_thread=self._in_thread)
        accepted = pipeline.accepted(batch, refused)
        if self._on_loop(accepted):
            # A small batch means a lightly loaded server whose publishers wait on this commit: the
            # hop to a worker thread and back would cost them more than holding the loop for the
            # fsync. (Channels were created above, so this does not await.)
            pipeline.commit(batch, refused)
            return
        # A large batch goes to the thread so that parsing overlaps the fsync.
        self.thread_commits += 1
        started = time.perf_counter()
        outcome: AppendResult | StoreError
        try:
            outcome = await trio.to_thread.run_sync(pipeline.append, accepted)
        except StoreError as exc:
            outcome = exc
        with pipeline.outbound.holding():
            pipeline.finish(batch, accepted, refused, outcome, started)

    def _on_loop(self, batch: list[Publish]) -> bool:
        """Whether to append `batch` on the event loop: always without a store thread; with one, when
        the batch is small enough that the hop to the thread and back (~0.1 ms of CPU) would cost more
        than the loop is held (see bench/README.md, *Figures behind choices*)."""
        if not self._in_thread:
            return True
        return len(batch) <= self._inline_batch and sum(len(p.data) for p in batch) <= self._inline_bytes

    def _done(self, batch: list[Publish]) -> None:
        self._committed += len(batch)
        self._progress.set()
        self._progress = trio.Event()
        if not self._room.is_set() and len(self._queue) < self._high_water // 2:
            self._room.set()
