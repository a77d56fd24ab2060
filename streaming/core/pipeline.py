"""The commit pipeline: the one place where what the engine decides is carried out, in a fixed order.

Sans-IO (no Trio): it takes time from the clocks it is given and acts through the ports it is given,
so the Trio server and the engine tests drive the same code.

A publish commit (`commit`, the one place the sequence is written) runs: create the channels the
batch needs → append to the store (one transaction for the whole batch) → tell the engine of messages
the store dropped for its limits → announce the new messages to the engine → deliver (through the
front doors' `Outbound` port) → acknowledge the publishers (through the same port, after their
deliveries, as the reference server does) → queue the subscription-state write (the `StateWriter`,
which stores dead letters first, then the updates). It is a generator of the store calls it needs:
its driver decides where they run (`run_now`: here, as `commit` does; `streaming.core.group_commit`:
on the event loop or the store's thread), never what happens around them.

Every other engine call (subscribe, ack, a client gone, ...) goes through here too, and its effects
are carried out the same way, at once, or at the end of the current input span (`defer()` ...
`settle()`): a front door that handles a burst of acks from one read settles once. Carrying them
out may call back into a door (a delivery); what a door changes from there is carried out by the same
settle, after the deliveries at hand, never in a nested one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from operator import itemgetter
from typing import cast

from storage import AppendResult, ChannelError, Message, Store, StoreError, SubUpdate
from streaming.core import errors as texts
from streaming.core.engine import DeadLetter, Engine, SubscribeRequest
from streaming.core.errors import ChannelBeingDeleted, RequestError
from streaming.core.observers import ServerObserver
from streaming.core.outbound import Outcome, Publish, ToDoors
from streaming.wire.subjects import has_wildcard, matches

log = logging.getLogger(__name__)
_first = itemgetter(0)


class StoreStep:
    """A store call the commit sequence needs made. Its driver chooses where `call` runs and puts what
    it returned in `result`, or what it raised in `error`, before taking the next step; the commit
    reads them when it resumes. (The driver iterates the steps, which costs less than sending the
    results in: a commit may be of one message.)"""

    __slots__ = ("appending", "call", "error", "result")

    def __init__(self, call: Callable[[], object], appending: list[Publish] | None = None) -> None:
        self.call = call
        self.appending = appending  # the messages, when the call is the batch's append
        self.result: object = None
        self.error: Exception | None = None

    def run(self) -> None:
        """Make the call here, and keep what came of it."""
        try:
            self.result = self.call()
        except Exception as exc:
            self.error = exc


CommitSteps = Iterator[StoreStep]


def run_now(steps: CommitSteps) -> None:
    """Drive a commit to its end on this thread, every store call inline. An exception the commit
    does not handle (a bug) propagates: the caller refuses the batch (`Pipeline.refuse`)."""
    for step in steps:
        step.run()


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

    def more(self) -> bool:
        """The engine has more to send than a step sends (`Engine.pump_more`). True: this writer will
        call `Pipeline.pump_more` soon, after other work had its turn; False (here): the pipeline
        sends it all now."""
        return False


class Pipeline:
    def __init__(
        self,
        store: Store,
        engine: Engine,
        outbound: ToDoors,
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
        self._settling = False
        self._deleting: set[str] = set()  # channels being deleted for MaxInactivity (publishes refused)
        self.commits = 0
        self.largest_batch = 0
        self.refused_by_store = 0  # publishes refused since the store last took a commit

    # -- carrying out the engine's effects --------------------------------------------------------

    def settle(self) -> None:
        """Carry out everything the engine queued: deliveries go out, dead letters and state updates
        are queued for the writer, timers are re-armed. Never blocks. Called while it runs (from a
        door's `deliver`), it returns at once: the running one carries out what was added."""
        self._deferring = False
        engine = self.engine
        if self._settling or not engine.has_effects():  # most spans and many commits leave nothing to do
            return
        self._settling = True
        try:
            while True:
                while engine.has_effects():
                    effects = engine.take_effects()
                    if effects.deliveries:
                        self.outbound.deliver(effects.deliveries)
                    if effects.dead_letters or effects.updates:
                        self.state.queue(effects.dead_letters, effects.updates)
                    if effects.timer_changes:
                        self.state.rearm(effects.timer_changes)
                if not engine.has_more() or self.state.more():
                    break
                engine.pump_more(self.clock())
        finally:
            self._settling = False

    def pump_more(self) -> None:
        """Send the next step's worth of what the engine's pumps left (its state writer's call)."""
        if self.engine.has_more():
            self.engine.pump_more(self.clock())
        self.settle()

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
        if request.channel in self._deleting or (self._deleting and self._matches_deleting(request.channel)):
            raise ChannelBeingDeleted()
        sub_id = self.engine.subscribe(request, self.clock(), self._wall_ns())
        answer(sub_id)
        self._changed()
        return sub_id

    def _matches_deleting(self, channel: str) -> bool:
        """Whether `channel` is a pattern that matches a channel being deleted (it would follow a
        channel whose subscriptions are being removed: refused, as a subscription to that channel is,
        for the moment the deletion takes)."""
        if not has_wildcard(channel):
            return False
        pattern = channel.split(".")
        return any(matches(pattern, name.split(".")) for name in self._deleting)

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
        `Engine.set_window`); what a wider window lets through is delivered before this returns, or,
        called from a door's `deliver`, right after the deliveries at hand."""
        self.engine.set_window(sub_id, window, self.clock())
        self._changed()

    def nak(self, sub_id: int, seq: int, delay: float) -> bool:
        """The client gives `seq` back, to come again after `delay` seconds (see `Engine.nak`)."""
        naked = self.engine.nak(sub_id, seq, delay, self.clock(), self._wall_ns())
        self._changed()
        return naked

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

    def is_deleting(self, channel: str) -> bool:
        """Whether `channel` is being deleted (for its MaxInactivity): publishes and new subscriptions
        to it are refused meanwhile."""
        return channel in self._deleting

    @property
    def deleting_any(self) -> bool:
        return bool(self._deleting)

    @contextmanager
    def deleting(self, channel: str) -> Iterator[None]:
        """While the store deletes `channel` (the block may await), it takes no publishes."""
        self._deleting.add(channel)
        try:
            yield
        finally:
            self._deleting.discard(channel)

    def channels_exist(self, batch: Sequence[Publish]) -> bool:
        """Whether committing `batch` needs no channel created (so no store call but the append)."""
        try:
            return all(
                name not in self._deleting and self.store.channel_info(name) is not None
                for name in {p.channel for p in batch}
            )
        except (ChannelError, StoreError):  # the commit refuses these with the right error
            return False

    def commit(self, batch: list[Publish], *, channels_checked: bool = False) -> None:
        """The whole commit of `batch` on this thread, every store call inline (`commit_steps`)."""
        run_now(self.commit_steps(batch, channels_checked=channels_checked))

    def commit_steps(self, batch: list[Publish], *, channels_checked: bool = False) -> CommitSteps:
        """The commit sequence of one batch, written once: create the channels it needs → append →
        announce → deliver → acknowledge, every publisher in arrival order.

        A generator of the store calls it needs made (`StoreStep`): whoever drives it chooses when and
        on which thread each call runs (`run_now`, inline; the group commit under Trio), and leaves
        the outcome in the step. It never blocks otherwise.
        `channels_checked`: the caller has just checked that every channel it names exists
        (`channels_exist()`), so none is looked up again.
        """
        refused: dict[str, Exception] = {}
        for name in () if channels_checked else self._missing_channels(batch, refused):
            step = StoreStep(partial(self.store.ensure_channel, name))
            yield step
            if isinstance(step.error, ChannelError):
                refused[name] = step.error
            elif isinstance(step.error, StoreError):
                log.error("could not create channel %r: %s", name, step.error)
                self.state.store_refused(step.error)
                refused[name] = step.error
            elif step.error is not None:
                raise step.error
        accepted = [p for p in batch if p.channel not in refused] if refused else batch
        started = time.perf_counter()
        outcome: AppendResult | StoreError | None = None
        if accepted:
            # The publishes go to the store as they are (each is a `storage.MessageToAppend`).
            step = StoreStep(partial(self.store.append, accepted, now_unix_ns=self._wall_ns()), accepted)
            yield step
            if step.error is None:
                outcome = cast("AppendResult", step.result)
            elif isinstance(step.error, StoreError):
                outcome = step.error
            else:
                raise step.error
        with self.outbound.holding():  # the deliveries and acknowledgements leave together
            self._finish(batch, accepted, refused, outcome, started)

    def _missing_channels(self, batch: Sequence[Publish], refused: dict[str, Exception]) -> list[str]:
        """The batch's channels the store has not got yet (to create); those it refuses go in `refused`."""
        missing: list[str] = []
        for name in {p.channel for p in batch}:
            if name in self._deleting:
                refused[name] = ChannelBeingDeleted()
                continue
            try:
                if self.store.channel_info(name) is None:  # raises for a name that clashes in case
                    missing.append(name)
            except ChannelError as exc:
                refused[name] = exc
        return missing

    def _finish(
        self,
        batch: list[Publish],
        accepted: list[Publish],
        refused: dict[str, Exception],
        outcome: AppendResult | StoreError | None,
        started: float,
    ) -> None:
        """After the append: announce and deliver, then acknowledge every publisher, in arrival order."""
        outcomes: list[Outcome]
        if isinstance(outcome, StoreError):
            # Once per failing spell (a full disk refuses every commit until space returns).
            if not self.refused_by_store:
                log.error("publishes are refused: %s", outcome)
            self.refused_by_store += len(accepted)
            self.state.store_refused(outcome)
            outcomes = [outcome] * len(accepted)
        elif outcome is not None:
            if self.refused_by_store:
                log.info("publishes are stored again (%d refused meanwhile)", self.refused_by_store)
                self.refused_by_store = 0
                self.state.store_writable()
            if self.observer is not None:
                self.observer.on_commit(time.perf_counter() - started, len(accepted))
            outcomes = self._announce(accepted, outcome)
        else:
            outcomes = []
        if refused:  # the accepted ones' outcomes, in order, with the refused ones' in their places
            stored = iter(outcomes)
            outcomes = [refused[p.channel] if p.channel in refused else next(stored) for p in batch]
        self.commits += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        self.outbound.published(batch, outcomes)

    def refuse(self, batch: list[Publish]) -> None:
        """A bug must cost this batch (its publishers get an error), not the server."""
        log.exception("publish commit failed; %d publishes refused", len(batch))
        self.outbound.published(batch, [RequestError(texts.INTERNAL_ERROR)] * len(batch))

    def _announce(self, accepted: list[Publish], result: AppendResult) -> list[Outcome]:
        """Tell the engine, and carry out what it decides (deliveries go before the acknowledgements);
        the publishes' sequences."""
        engine = self.engine
        for channel, dropped in result.dropped.items():
            engine.on_dropped(channel, dropped)
        now = self.clock()
        by_channel: dict[str, list[Message]] = {}
        channel, messages, read = "", [], False  # a commit's publishes come in runs to one channel
        for p, (seq, timestamp) in zip(accepted, result.assigned, strict=True):
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
        return list(map(_first, result.assigned))

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
