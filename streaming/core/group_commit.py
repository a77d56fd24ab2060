"""Publish group commit under Trio: every publish accepted from any front door while the store is busy
goes into the next single commit of the pipeline (`Pipeline.commit_steps`: one `Store.append`, one journal
record, fsynced unless `file_sync` is off; then deliveries, then every publisher's acknowledgement,
in arrival order, as the reference server does).

It decides only *when* a batch is committed and *on which thread* its store calls run; the sequence
itself is the pipeline's, driven here step by step: by the commit task (`_drive`) or, at the end of an
input span, inline on the loop (`after_span`).

When: a lone publish is committed at once (a batch of one), so sequential publishers are not delayed;
under load the batch grows by itself while the previous commit runs. When only one publisher has been
publishing lately and its input span is over with no more input waiting, the span's end commits its
publishes there and then (`after_span`), inside the doors' write hold, so the deliveries and
acknowledgements are written before the reader yields (the hop to the commit task costs about a
twentieth of a publish's round trip). Otherwise the task commits:
- several publishers: the task runs after every reader Trio woke in the same batch, so their
  publishes share one commit (Trio's statistics cannot tell a reader that those readers are about to
  run: they are not on the run queue);
- a stream from one publisher (a full read, or events left to parse): the task's batch grows while
  the reader reads on, and a large one goes to the store thread, overlapping the parsing.

Where: small appends (up to `inline_batch` messages and `inline_bytes` of payload) run on the event
loop, where they cost less than the hop to the store thread and back; larger ones, and channel
creation, on the store thread. Accepted publishes beyond `high_water` make the publishing connections
wait (TCP back-pressure), so memory stays bounded.

That holds while the disk is quick. An append on the loop holds every connection for as long as its
fsync takes. A stalled one of 160 ms froze every client of a server here. With a disk that takes
3-8 ms a sync, a publisher sending 200 frames a second over WebSocket fell further behind with every
frame (bench/README.md): each frame waited for an fsync of its own, one after the other. So appends
also go to the store thread while their running average (`SLOW_APPEND_S`, wherever they ran) says the
disk is slow, or right after one stall (one append of 20 ms or more is enough). The loop then goes on
delivering, acknowledging and reading while the disk works, and the publishes that arrive meanwhile
share the next commit. Once the average is quick again, appends come back to the loop. The first
slow append of a spell still holds the loop: nothing tells it is coming.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Sequence

import attrs
import trio

from streaming.core.outbound import Outcome, Publish
from streaming.core.pipeline import CommitSteps, Pipeline, StoreStep

log = logging.getLogger(__name__)
_SHARED_WINDOW_S = 0.01  # publishes from two sources this close together: commit in the task
# Appends averaging this long hold every client for several times a usual fsync (0.07-0.5 ms on the
# machines measured, p99 up to 4 ms: bench/README.md), where the hop to the store thread costs their
# publishers ~0.1 ms: the disk is slow, and they go to the store thread.
SLOW_APPEND_S = 0.002
APPEND_WEIGHT = 0.1  # the newest append's weight in the running average: one of 20 ms tips it
_WARN_EVERY_S = 60.0  # a slow disk is said in the log at most this often


@attrs.frozen
class GroupCommitStatistics:
    queued: int
    commits: int
    messages: int
    largest_batch: int
    inline_commits: int  # commits made at the end of an input span, not by the commit task
    thread_commits: int  # commits whose append ran on the store thread (a large batch, or a slow disk)
    slow_disk_commits: int  # of those, small ones sent there because appends were slow (SLOW_APPEND_S)
    append_average_s: float  # the running average of a small append's time, on the loop or the store thread


class Ticket:
    """The outcomes of a run of publishes handed in together: the origin the core tells (in their
    order, perhaps over several commits), and what their publisher awaits."""

    __slots__ = ("_done", "_expected", "_outcomes")

    def __init__(self, expected: int) -> None:
        self._expected = expected
        self._outcomes: list[Outcome] = []
        self._done = trio.Event()
        if not expected:
            self._done.set()

    def published(self, publishes: Sequence[Publish], outcomes: Sequence[Outcome]) -> None:
        self._outcomes += outcomes
        if len(self._outcomes) >= self._expected:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def result(self) -> list[Outcome]:
        """The outcomes, once `done`."""
        return self._outcomes

    async def outcomes(self) -> list[Outcome]:
        """Once every publish is done: for each, in order, its sequence or why it was refused."""
        await self._done.wait()
        return self._outcomes


class _Task(enum.Enum):
    STOPPED = "stopped"  # no commit task (not started yet, or shutting down): commits run on the caller
    IDLE = "idle"
    COMMITTING = "committing"  # inside a commit that may await: nothing may be committed past it


class _Sources:
    """Who published lately: the span's end commits inline only for a lone publisher."""

    __slots__ = ("_last", "_shared_at")

    def __init__(self) -> None:
        self._last: object = None  # the latest publish's source (one per publisher connection or request)
        self._shared_at = -_SHARED_WINDOW_S  # when the latest publish came from another source

    def saw(self, source: object) -> None:
        if source != self._last:
            if self._last is not None:
                self._shared_at = trio.current_time()
            self._last = source

    def shared(self, now: float) -> bool:
        return now - self._shared_at < _SHARED_WINDOW_S


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
        appends_on_loop: bool = True,
    ) -> None:
        self._pipeline = pipeline
        self._in_thread = store_in_thread
        self._max_batch = max_batch
        self._high_water = high_water
        self._inline_batch = inline_batch
        self._inline_bytes = inline_bytes
        self._appends_on_loop = appends_on_loop  # False: each append waits for a replicated log
        self._queue: list[Publish] = []
        self._work = trio.Event()
        self._room = trio.Event()
        self._room.set()
        self._committed = 0  # publishes done (acked or refused), counting from the first
        self._submitted = 0
        self._progress = trio.Event()
        self._task = _Task.STOPPED
        self._held = False  # commits wait (recovery); publishes are still accepted and queued
        self._in_span = False  # a front door is handling input: its span's end commits or wakes the task
        self._sources = _Sources()
        self.inline_commits = 0
        self.thread_commits = 0
        self.slow_disk_commits = 0
        self._append_s = 0.0  # running average of an append's time, wherever it ran
        self._warned_at = -_WARN_EVERY_S

    def submit(self, publish: Publish, source: object) -> bool:
        """Queue a publish; committed at the end of the current input span, or by the task. False when
        the queue is past its high water: wait for `wait_room` before accepting more. `source`: who
        published it (any value that tells one publisher from another)."""
        return self.submit_many([publish], source)

    def submit_many(self, publishes: list[Publish], source: object) -> bool:
        """`submit` of each of `publishes`, from one source: a run of them."""
        self._queue += publishes
        self._submitted += len(publishes)
        self._sources.saw(source)
        if not self._in_span and not self._held:
            self._work.set()
        if len(self._queue) >= self._high_water and self._room.is_set():
            self._room = trio.Event()
            return False
        return self._room.is_set()

    def span_started(self) -> None:
        self._in_span = True

    def after_span(self, *, more_input: bool = False) -> None:
        """Commit what is queued here and now when that is quickest (`_commit_here`), else wake the
        commit task. Never blocks but for a small commit's fsync, as the task would."""
        self._in_span = False
        queue = self._queue
        if not queue or self._held:
            return
        if not self._commit_here(queue, more_input=more_input):
            self._work.set()
            return
        self._queue = []
        self.inline_commits += 1
        try:
            for step in self._pipeline.commit_steps(queue, channels_checked=True):  # `_commit_here` checked them
                self._run_on_loop(step)
        except Exception:
            self._pipeline.refuse(queue)
        self._done(queue)

    def _commit_here(self, queue: list[Publish], *, more_input: bool) -> bool:
        """Whether the end of a span commits `queue` itself: a lone publisher's small batch with no
        more input behind it, no commit of the task's under way, and no channel to create (that is
        a write of its own, on the store thread)."""
        return (
            not more_input  # a stream of publishes: the task's batches grow, and large ones overlap parsing
            and self._task is not _Task.COMMITTING
            and len(queue) <= self._max_batch
            and self._append_on_loop(queue)
            and not self._sources.shared(trio.current_time())
            and self._pipeline.channels_exist(queue)
        )

    async def wait_room(self) -> None:
        await self._room.wait()

    def pause(self) -> None:
        """Hold commits (accepting and queueing still work): used while recovery waits for clients."""
        self._held = True

    def resume(self) -> None:
        self._held = False
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

    async def store_own(self, publishes: list[Publish]) -> list[Outcome]:
        """Commit the server's own messages (dead letters) with everyone's, and wait for it: each one's
        outcome. With the commit task gone (shutting down), they are committed here."""
        ticket = Ticket(len(publishes))
        run = [p._replace(origin=ticket) for p in publishes]
        if self._task is _Task.STOPPED:
            await self._commit(run)
            self._done(run)
        else:
            self.submit_many(run, ticket)
        return await ticket.outcomes()

    def statistics(self) -> GroupCommitStatistics:
        pipeline = self._pipeline
        return GroupCommitStatistics(
            len(self._queue),
            pipeline.commits,
            self._committed,
            pipeline.largest_batch,
            self.inline_commits,
            self.thread_commits,
            self.slow_disk_commits,
            self._append_s,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._task = _Task.IDLE
        task_status.started()
        try:
            while True:
                await self._work.wait()
                self._work = trio.Event()
                while self._queue and not self._held:
                    batch = self._take()
                    self._task = _Task.COMMITTING
                    try:
                        await self._commit(batch)
                    finally:
                        self._task = _Task.IDLE
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
            self._task = _Task.STOPPED
            # Shutting down: what was accepted is still stored (clients may or may not get the ack).
            with trio.move_on_after(10, shield=True):
                while self._queue:
                    batch = self._take()
                    await self._commit(batch)
                    self._done(batch)

    def _take(self) -> list[Publish]:
        batch = self._queue[: self._max_batch]
        del self._queue[: self._max_batch]
        return batch

    async def _commit(self, batch: list[Publish]) -> None:
        try:
            await self._drive(self._pipeline.commit_steps(batch))
        except Exception:
            self._pipeline.refuse(batch)

    async def _drive(self, steps: CommitSteps) -> None:
        """Run a commit's store calls where they belong: on the loop when small, else on the store
        thread (channel creation always there: an fsynced write of its own)."""
        for step in steps:
            if self._on_loop(step):
                # A small batch means a lightly loaded server whose publishers wait on this commit: the
                # hop to a worker thread and back would cost them more than holding the loop for the
                # fsync.
                self._run_on_loop(step)
                if step.appending is None:
                    await trio.lowlevel.checkpoint()
            elif step.appending is None:
                await trio.to_thread.run_sync(step.run)
            else:
                # A large batch goes to the thread so that parsing overlaps the fsync; so does any
                # while the disk is slow, so that the loop is not held for it.
                self.thread_commits += 1
                took = await trio.to_thread.run_sync(_timed_run, step)
                if self._small(step.appending):  # the average is of small appends: the disk's, not the batch's
                    self.slow_disk_commits += 1
                    self._timed(took)

    def _run_on_loop(self, step: StoreStep) -> None:
        """Make a store call on the loop, timing an append on the loop's clock."""
        if step.appending is None or not self._in_thread:
            step.run()
            return
        started = trio.current_time()
        step.run()
        self._timed(trio.current_time() - started)

    def _timed(self, seconds: float) -> None:
        """An append took `seconds`: into the running average, and a slow disk said in the log."""
        was_slow = self._append_s >= SLOW_APPEND_S
        self._append_s += APPEND_WEIGHT * (seconds - self._append_s)
        if was_slow or self._append_s < SLOW_APPEND_S:
            return
        now = trio.current_time()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "the disk is slow (an append took %.1f ms, %.1f ms on average): appends run on the store "
                "thread until they are quick again, so that they do not hold every client (said at most "
                "once a minute)",
                seconds * 1000,
                self._append_s * 1000,
            )

    def _on_loop(self, step: StoreStep) -> bool:
        if not self._in_thread:
            return True
        return step.appending is not None and self._append_on_loop(step.appending)

    def _append_on_loop(self, batch: list[Publish]) -> bool:
        """Whether to append `batch` on the event loop: always without a store thread; with one, when
        the batch is small enough that the hop to the thread and back (~0.1 ms of CPU) would cost more
        than the loop is held (see bench/README.md, *Figures behind choices*)."""
        if not self._in_thread:
            return True
        return self._append_s < SLOW_APPEND_S and self._small(batch)

    def _small(self, batch: list[Publish]) -> bool:
        """Whether `batch` is small enough to hold the loop for while the disk is quick."""
        return (
            self._appends_on_loop
            and len(batch) <= self._inline_batch
            and sum(len(p.data) for p in batch) <= self._inline_bytes
        )

    def _done(self, batch: list[Publish]) -> None:
        self._committed += len(batch)
        self._progress.set()
        self._progress = trio.Event()
        if not self._room.is_set() and len(self._queue) < self._high_water // 2:
            self._room.set()


def _timed_run(step: StoreStep) -> float:
    """`step.run()` on the store thread; how long it took there."""
    started = time.perf_counter()
    step.run()
    return time.perf_counter() - started
