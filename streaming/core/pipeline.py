"""The commit pipeline: the one place where what the engine decides is carried out, in a fixed order.

Sans-IO (no Trio): it takes time from the clocks it is given and acts through the ports it is given,
so the Trio server and the engine tests drive the same code.

A publish commit runs: append to the store (one transaction for the whole batch) → tell the engine
of messages the store dropped for its limits → announce the new messages to the engine → deliver
(through the front doors' `Outbound` port) → acknowledge the publishers (through the same port, after
their deliveries, as the reference server does) → queue the subscription-state write (the
`StateWriter`, which stores dead letters first, then the updates).

Every other engine call a front door makes (subscribe, ack, a client gone, ...) goes through here
too, and its effects are carried out the same way, at once, or at the end of the current input span
(`defer()` ... `settle()`): a front door that handles a burst of acks from one read settles once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

from storage import AppendResult, ChannelError, Message, Store, StoreError, SubUpdate
from streaming.core import errors as texts
from streaming.core.engine import DeadLetter, Engine, SubscribeRequest
from streaming.core.errors import RequestError
from streaming.core.observers import ServerObserver
from streaming.core.outbound import Outbound, Publish

log = logging.getLogger(__name__)


class StateWriter:
    """Where the pipeline hands what must be written after deliveries (the Trio runtime; a test's
    synchronous writer), and whom it tells when the store refuses or takes writes again."""

    def queue(self, dead_letters: list[DeadLetter], updates: list[SubUpdate]) -> None:
        raise NotImplementedError

    def rearm(self, sub_ids: Iterable[int]) -> None:
        """These subscriptions' next deadlines may have moved (or they are gone)."""

    def store_refused(self, exc: StoreError) -> None:
        """A publish commit was refused (a full disk): the server is degraded."""

    def store_writable(self) -> None:
        """A publish commit went through after refusals."""


class Pipeline:
    def __init__(
        self,
        store: Store,
        engine: Engine,
        outbound: Outbound,
        state: StateWriter,
        *,
        clock: Callable[[], float],
        wall_clock_ns: Callable[[], int] = time.time_ns,
        observer: ServerObserver | None = None,
    ) -> None:
        self.store = store
        self.engine = engine
        self.outbound = outbound
        self.state = state
        self.clock = clock
        self._wall_ns = wall_clock_ns
        self.observer = observer
        self._deferring = False
        self.deleting: set[str] = set()  # channels being deleted for MaxInactivity (publishes refused)
        self.commits = 0
        self.largest_batch = 0
        self.refused_by_store = 0  # publishes refused since the store last took a commit

    # -- carrying out the engine's effects --------------------------------------------------------

    def settle(self) -> None:
        """Carry out everything the engine queued: deliveries go out, dead letters and state updates
        are queued for the writer, timers are re-armed. Never blocks."""
        self._deferring = False
        if not self.engine.has_effects():  # most input spans and many commits leave nothing to do
            return
        effects = self.engine.take_effects()
        if effects.deliveries:
            self.outbound.deliver(effects.deliveries)
        if effects.dead_letters or effects.updates:
            self.state.queue(effects.dead_letters, effects.updates)
        if effects.timer_changes:
            self.state.rearm(effects.timer_changes)

    def defer(self) -> None:
        """Until `settle()`, engine calls made through here leave their effects queued (an input span
        of a front door: one settle for a read's worth of acks)."""
        self._deferring = True

    def _changed(self) -> None:
        if not self._deferring:
            self.settle()

    # -- what front doors ask of the engine -------------------------------------------------------

    def start(self) -> None:
        """After recovery: redeliver what was pending, then let new messages flow."""
        self.engine.start(self.clock())
        self.settle()

    def add_client(self, client_id: str) -> None:
        self.engine.add_client(client_id)

    def client_closed(self, client_id: str) -> None:
        self.engine.client_closed(client_id, self.clock())
        self._changed()

    def set_heartbeat_failed(self, client_id: str, failed: bool) -> None:
        self.engine.set_heartbeat_failed(client_id, failed, self.clock())
        self._changed()

    def subscribe(self, request: SubscribeRequest, answer: Callable[[int], None]) -> int:
        """Add a subscription; `answer(sub_id)` (the door's response to the request) runs before any
        of its deliveries go out."""
        if request.channel in self.deleting:
            raise RequestError(texts.CHANNEL_BEING_DELETED)
        sub_id = self.engine.subscribe(request, self.clock(), self._wall_ns())
        answer(sub_id)
        self._changed()
        return sub_id

    def unsubscribe(self, sub_id: int, *, close: bool = False) -> None:
        """Remove a subscription (`close`: keep a durable's position for its return)."""
        if close:
            self.engine.close_subscription(sub_id, self.clock())
        else:
            self.engine.unsubscribe(sub_id, self.clock())
        self._changed()

    def ack(self, sub_id: int, seq: int) -> bool:
        acked = self.engine.ack(sub_id, seq, self.clock())
        if not self._deferring:  # the hot path: inlined `_changed`
            self.settle()
        return acked

    def ack_many(self, sub_id: int, seqs: list[int]) -> int:
        """`ack` of each of `seqs` on one subscription, settled once; how many counted."""
        acked = self.engine.ack_many(sub_id, seqs, self.clock())
        if not self._deferring:
            self.settle()
        return acked

    def set_window(self, sub_id: int, window: int) -> None:
        """Deliveries on demand: how many pending messages the subscription may hold (see
        `Engine.set_window`); what a wider window lets through is delivered before this returns."""
        self.engine.set_window(sub_id, window, self.clock())
        self._changed()

    def ack_progress(self, sub_id: int, seq: int) -> bool:
        """The client is still working on `seq`: restart its AckWait."""
        moved = self.engine.ack_progress(sub_id, seq, self.clock())
        self._changed()
        return moved

    def dropped(self, dropped: dict[str, range]) -> None:
        """The store removed these messages for its limits (MaxAge)."""
        for channel, seqs in dropped.items():
            self.engine.on_dropped(channel, seqs)
        self._changed()

    def channel_deleted(self, channel: str) -> None:
        self.engine.drop_channel(channel)
        self._changed()

    # -- publishing --------------------------------------------------------------------------------

    def channels_exist(self, batch: Sequence[Publish]) -> bool:
        try:
            return all(
                name not in self.deleting and self.store.channel_info(name) is not None
                for name in {p.channel for p in batch}
            )
        except (ChannelError, StoreError):  # `missing_channels` refuses these with the right error
            return False

    def missing_channels(self, batch: Sequence[Publish]) -> tuple[list[str], dict[str, Exception]]:
        """The batch's channels the store has not got yet (to create), and those it refuses."""
        missing: list[str] = []
        refused: dict[str, Exception] = {}
        for name in {p.channel for p in batch}:
            if name in self.deleting:
                refused[name] = RequestError(texts.CHANNEL_BEING_DELETED)
                continue
            try:
                if self.store.channel_info(name) is None:  # raises for a name that clashes in case
                    missing.append(name)
            except ChannelError as exc:
                refused[name] = exc
        return missing, refused

    def create_channel(self, name: str, refused: dict[str, Exception]) -> None:
        """Create a channel (an fsynced write: the Trio side runs it on the store's thread)."""
        try:
            self.store.ensure_channel(name)
        except ChannelError as exc:
            refused[name] = exc
        except StoreError as exc:
            log.error("could not create channel %r: %s", name, exc)
            self.state.store_refused(exc)
            refused[name] = exc

    def commit(self, batch: list[Publish], refused: dict[str, Exception] | None = None) -> None:
        """The whole commit on this thread: create channels (unless the caller did and says which it
        could not: `refused`), append, announce, deliver, acknowledge."""
        if refused is None:
            missing, refused = self.missing_channels(batch)
            for name in missing:
                self.create_channel(name, refused)
        accepted = self.accepted(batch, refused)
        with self.outbound.holding():
            started = time.perf_counter()
            outcome: AppendResult | StoreError | None = None
            if accepted:
                try:
                    outcome = self.append(accepted)
                except StoreError as exc:
                    outcome = exc
            self.finish(batch, accepted, refused, outcome, started)

    @staticmethod
    def accepted(batch: list[Publish], refused: dict[str, Exception]) -> list[Publish]:
        return [p for p in batch if p.channel not in refused] if refused else batch

    def append(self, accepted: list[Publish]) -> AppendResult:
        """The store append of a commit, stamped with the pipeline's wall clock (thread-safe). The
        publishes go to the store as they are (each is a `storage.MessageToAppend`)."""
        return self.store.append(accepted, now_unix_ns=self._wall_ns())

    def finish(
        self,
        batch: list[Publish],
        accepted: list[Publish],
        refused: dict[str, Exception],
        outcome: AppendResult | StoreError | None,
        started: float,
    ) -> None:
        """After the append: announce and deliver, then acknowledge every publisher, in arrival order.
        Call it inside `outbound.holding()`, so that the deliveries and acknowledgements leave together."""
        errors: dict[int, Exception] = {}
        if isinstance(outcome, StoreError):
            # Once per failing spell (a full disk refuses every commit until space returns).
            if not self.refused_by_store:
                log.error("publishes are refused: %s", outcome)
            self.refused_by_store += len(accepted)
            self.state.store_refused(outcome)
            errors = {id(p): outcome for p in accepted}
        elif outcome is not None:
            if self.refused_by_store:
                log.info("publishes are stored again (%d refused meanwhile)", self.refused_by_store)
                self.refused_by_store = 0
                self.state.store_writable()
            if self.observer is not None:
                self.observer.on_commit(time.perf_counter() - started, len(accepted))
            self._announce(accepted, outcome)
        if refused:
            for p in batch:
                error = refused.get(p.channel)
                if error is not None:
                    errors[id(p)] = error
        self.commits += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        self.outbound.published(batch, errors)

    def refuse(self, batch: list[Publish]) -> None:
        """A bug must cost this batch (its publishers get an error), not the server."""
        log.exception("publish commit failed; %d publishes refused", len(batch))
        error = RequestError(texts.INTERNAL_ERROR)
        self.outbound.published(batch, {id(p): error for p in batch})

    def _announce(self, accepted: list[Publish], result: AppendResult) -> None:
        """Tell the engine, and carry out what it decides (deliveries go before the acknowledgements)."""
        engine = self.engine
        for channel, dropped in result.dropped.items():
            engine.on_dropped(channel, dropped)
        now = self.clock()
        by_channel: dict[str, list[Message]] = {}
        channel, messages, read = "", [], False  # a commit's publishes come in runs to one channel
        for p, (seq, timestamp) in zip(accepted, result.assigned, strict=True):
            p.seq = seq
            if p.channel != channel:
                channel = p.channel
                if channel not in by_channel:
                    by_channel[channel] = []
                messages, read = by_channel[channel], engine.has_readers(channel)
            if read:  # handed over so the engine need not read them back
                messages.append(Message(seq, timestamp, channel, p.reply, p.data, p.content_type))
        if self.observer is not None:
            self._tell_observer(self.observer, accepted, result)
        for channel, messages in by_channel.items():
            engine.on_appended(channel, now, messages)
        self.settle()

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
