"""Publish group commit: every publish accepted from any connection while the store is busy goes into
the next single `Store.append` (one journal record, fsynced unless `file_sync` is off), then the engine
hears of the new messages (deliveries go out), then every publisher gets its PubAck, in arrival order
(as the reference server does).

A lone publish is committed at once (a batch of one), so sequential publishers are not delayed; under
load the batch grows by itself while the previous commit runs (small ones on the event loop, large ones
on the store thread). Accepted publishes beyond `high_water` make the publishing connections wait (TCP
back-pressure), so memory stays bounded.

When only one connection has been publishing lately and its reader has no more input waiting, that
reader commits its publishes itself at the end of its chunk (`after_span`), inside the broker's write
hold, so the deliveries and PubAcks are written before it yields: the hop to the publisher task was
~30 us of a publish's ~550. Otherwise the task commits:
- several connections publishing: the task runs after every reader Trio woke in the same batch, so
  their publishes share one commit (Trio's statistics cannot tell a reader that those readers are
  about to run: they are not on the run queue);
- a stream on one connection (a full read, or events left to parse): the task's batch grows while
  the reader reads on, and a large one goes to the store thread, overlapping the parsing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import TypeVar

import attrs
import trio

from storage import AppendResult, ChannelError, Message, NewMessage, Store, StoreError
from streaming.engine import Engine
from streaming.observers import ServerObserver
from streaming.runtime import EngineRuntime, call_store
from streaming.stan import errors as stan_errors
from streaming.stan.pb import protocol_pb2 as pb

log = logging.getLogger(__name__)
T = TypeVar("T")
_SHARED_WINDOW_S = 0.01  # publishes from two connections this close together: commit in the task


@attrs.define(slots=True)
class Publish:
    channel: str
    data: bytes
    reply: str  # PubMsg.reply, stored with the message
    guid: str
    ack_subject: str  # where the PubAck goes ("" = none wanted)


@attrs.frozen
class PublisherStatistics:
    queued: int
    commits: int
    messages: int
    largest_batch: int
    inline_commits: int  # commits made by a reader in `after_span`, not by the publisher task


class Publisher:
    def __init__(
        self,
        store: Store,
        engine: Engine,
        runtime: EngineRuntime,
        send: Callable[[str, bytes], None],
        send_many: Callable[[str, list[bytes]], None],
        *,
        store_in_thread: bool,
        max_batch: int = 8192,
        high_water: int = 65536,
        inline_batch: int = 16,
        observer: ServerObserver | None = None,
        hold: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        self._store = store
        self._engine = engine
        self._runtime = runtime
        self._send = send
        self._send_many = send_many
        self._in_thread = store_in_thread
        self._max_batch = max_batch
        self._high_water = high_water
        self._inline_batch = inline_batch
        self._observer = observer
        self._hold = hold  # the broker's write hold: a commit's deliveries and PubAcks leave together
        self._queue: list[Publish] = []
        self._work = trio.Event()
        self._room = trio.Event()
        self._room.set()
        self._committed = 0  # publishes done (acked or refused), counting from the first
        self._submitted = 0
        self._progress = trio.Event()
        self._paused = False
        self._busy = False  # the task is inside a commit (it may await): nothing may commit past it
        self._last_sender: str | None = None  # ack subject (one per connection) of the latest publish
        self._shared_at = -_SHARED_WINDOW_S  # when the latest publish came from another connection
        self.commits = 0
        self.refused_by_store = 0  # publishes refused since the store last took a commit
        self.inline_commits = 0
        self.largest_batch = 0

    def submit(self, publish: Publish, *, wake: bool = True) -> None:
        """Queue a publish; `wake=False` from a reader whose `after_span` will see to it."""
        self._queue.append(publish)
        self._submitted += 1
        if publish.ack_subject != self._last_sender:
            if self._last_sender is not None:
                self._shared_at = trio.current_time()
            self._last_sender = publish.ack_subject
        if wake and not self._paused:
            self._work.set()
        if len(self._queue) >= self._high_water and self._room.is_set():
            self._room = trio.Event()

    def after_span(self, *, more_input: bool = False) -> None:
        """Commit what is queued here and now when the reader has no more input waiting, no other
        connection has published lately, no await is needed and the batch is small; otherwise wake
        the publisher task. Never blocks but for a small commit's fsync, as the task would."""
        queue = self._queue
        if not queue or self._paused:
            return
        if (
            more_input  # a stream of publishes: the task's batches grow, and large ones overlap parsing
            or self._busy
            or len(queue) > (self._inline_batch if self._in_thread else self._max_batch)
            or trio.current_time() - self._shared_at < _SHARED_WINDOW_S
            or not self._channels_exist(queue)
        ):
            self._work.set()
            return
        self._queue = []
        self.inline_commits += 1
        try:
            self._commit_now(queue, queue, {})
        except Exception:
            self._refuse(queue)

    def _channels_exist(self, batch: list[Publish]) -> bool:
        try:
            return all(self._store.channel_info(name) is not None for name in {p.channel for p in batch})
        except (ChannelError, StoreError):  # the task's commit refuses these with the right error
            return False

    def has_room(self) -> bool:
        return self._room.is_set()

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

    def statistics(self) -> PublisherStatistics:
        return PublisherStatistics(
            len(self._queue), self.commits, self._committed, self.largest_batch, self.inline_commits
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
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
                        self._refuse(batch)
                        continue
                    finally:
                        self._busy = False
                    if self._queue:
                        # A small next batch is committed inline, holding the loop for its fsync:
                        # first let the connection writers send what of this one's deliveries and
                        # PubAcks the sockets did not take at once. They became runnable during this
                        # step; a task's order within Trio's next batch is a coin flip, so after two
                        # checkpoints they have run either way.
                        await trio.lowlevel.checkpoint()
                        await trio.lowlevel.checkpoint()
        finally:
            # Shutting down: what was accepted is still stored (clients may or may not get the PubAck).
            with trio.move_on_after(10, shield=True):
                while self._queue:
                    batch = self._queue[: self._max_batch]
                    del self._queue[: self._max_batch]
                    await self._commit(batch)

    def _refuse(self, batch: list[Publish]) -> None:
        # A bug must cost this batch (its publishers get an error), not the server.
        log.exception("publish commit failed; %d publishes refused", len(batch))
        for p in batch:
            if p.ack_subject:
                ack = pb.PubAck(guid=p.guid, error="stan: internal error (see the server log)")
                self._send(p.ack_subject, ack.SerializeToString())
        self._done(batch)

    async def _commit(self, batch: list[Publish]) -> None:
        refused = await self._create_channels({p.channel for p in batch})
        accepted = [p for p in batch if p.channel not in refused] if refused else batch
        if not (self._in_thread and len(accepted) > self._inline_batch):
            # A small batch means a lightly loaded server whose publishers wait on this commit: the
            # hop to a worker thread and back (~100 us here) would cost them more than holding the
            # loop for the fsync.
            self._commit_now(batch, accepted, refused)
            return
        # A large batch goes to the thread so that parsing overlaps the fsync.
        messages = [NewMessage(p.channel, p.data, p.reply) for p in accepted]
        started = time.perf_counter()
        outcome: AppendResult | StoreError
        try:
            outcome = await trio.to_thread.run_sync(self._store.append, messages)
        except StoreError as exc:
            outcome = exc
        with self._hold():
            self._finish(batch, accepted, refused, outcome, started)

    def _commit_now(self, batch: list[Publish], accepted: list[Publish], refused: dict[str, str]) -> None:
        """Store on the event loop and announce in the same step: no checkpoint in between."""
        with self._hold():
            started = time.perf_counter()
            outcome: AppendResult | StoreError | None = None
            if accepted:
                try:
                    outcome = self._store.append([NewMessage(p.channel, p.data, p.reply) for p in accepted])
                except StoreError as exc:
                    outcome = exc
            self._finish(batch, accepted, refused, outcome, started)

    def _finish(
        self,
        batch: list[Publish],
        accepted: list[Publish],
        refused: dict[str, str],
        outcome: AppendResult | StoreError | None,
        started: float,
    ) -> None:
        """Deliveries first, then every publisher's PubAck (or error), in arrival order."""
        errors: dict[int, str] = {}
        if isinstance(outcome, StoreError):
            # Once per failing spell (a full disk refuses every commit until space returns).
            if not self.refused_by_store:
                log.error("publishes are refused: %s", outcome)
            self.refused_by_store += len(accepted)
            self._runtime.store_refused(outcome)
            errors = {id(p): stan_errors.store_error(outcome) for p in accepted}
        elif outcome is not None:
            if self.refused_by_store:
                log.info("publishes are stored again (%d refused meanwhile)", self.refused_by_store)
                self.refused_by_store = 0
                self._runtime.store_writable()
            if self._observer is not None:
                self._observer.on_commit(time.perf_counter() - started, len(accepted))
            self._announce(accepted, outcome)
        self.commits += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        acks: dict[str, list[bytes]] = {}  # per ack subject (one per client), in order
        pub_ack = pb.PubAck()  # one message re-filled per publish: half the cost of a new one each
        for p in batch:
            if p.ack_subject:
                pub_ack.guid = p.guid
                pub_ack.error = refused.get(p.channel) or errors.get(id(p), "")
                ack = pub_ack.SerializeToString()
                subject_acks = acks.get(p.ack_subject)
                if subject_acks is None:
                    acks[p.ack_subject] = [ack]
                else:
                    subject_acks.append(ack)
        for subject, payloads in acks.items():
            self._send_many(subject, payloads)
        self._done(batch)

    def _done(self, batch: list[Publish]) -> None:
        self._committed += len(batch)
        self._progress.set()
        self._progress = trio.Event()
        if not self._room.is_set() and len(self._queue) < self._high_water // 2:
            self._room.set()

    def _announce(self, accepted: list[Publish], result: AppendResult) -> None:
        """Tell the engine (deliveries are queued before the PubAcks go out, as the reference does)."""
        engine = self._engine
        for channel, dropped in result.dropped.items():
            engine.on_dropped(channel, dropped)
        now = trio.current_time()
        by_channel: dict[str, list[Message]] = {}
        readers: dict[str, bool] = {}
        for p, (seq, timestamp) in zip(accepted, result.assigned, strict=True):
            messages = by_channel.get(p.channel)
            if messages is None:
                messages = by_channel[p.channel] = []
                readers[p.channel] = engine.has_readers(p.channel)
            if readers[p.channel]:  # handed over so the engine need not read them back
                messages.append(Message(seq, timestamp, p.channel, p.reply, p.data))
        if self._observer is not None:
            self._tell_observer(self._observer, accepted, result)
        for channel, messages in by_channel.items():
            engine.on_appended(channel, now, messages)
        self._runtime.sync()

    @staticmethod
    def _tell_observer(observer: ServerObserver, accepted: list[Publish], result: AppendResult) -> None:
        """One call per channel: the store numbers a channel's messages of one append consecutively."""
        runs: dict[str, list[int]] = {}  # channel -> [first seq, count, bytes]
        for p, (seq, _) in zip(accepted, result.assigned, strict=True):
            run = runs.get(p.channel)
            if run is None:
                run = runs[p.channel] = [seq, 0, 0]
            run[1] += 1
            run[2] += len(p.data)
        for channel, (first, count, nbytes) in runs.items():
            observer.on_published(channel, first, count, nbytes)

    async def _create_channels(self, names: set[str]) -> dict[str, str]:
        refused: dict[str, str] = {}
        for name in names:
            try:
                if self._store.channel_info(name) is None:  # raises for a name that clashes in case
                    await self._call(partial(self._store.ensure_channel, name))
            except ChannelError as exc:
                refused[name] = str(exc)
            except StoreError as exc:
                log.error("could not create channel %r: %s", name, exc)
                self._runtime.store_refused(exc)
                refused[name] = stan_errors.store_error(exc)
        return refused

    async def _call(self, fn: Callable[[], T]) -> T:
        return await call_store(fn, in_thread=self._in_thread)
