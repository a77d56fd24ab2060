"""Drives the engine through the real commit pipeline, synchronously with a virtual clock, for engine
tests.

Publishes, acks and subscriptions go through `streaming.core.pipeline.Pipeline`, as the server's
front doors do; what it queues for writing is written at once (dead letters first, through the same
pipeline, then the net effect of the updates), as the runtime writes it. Timers are simulated
exactly: `advance(dt)` fires every subscription's deadline in deadline order at the deadline itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from storage import (
    ClientRecord,
    MemoryStore,
    Message,
    SetPending,
    SetPendingRun,
    StartPosition,
    Store,
    StoreLimits,
    SubOptions,
    SubUpdate,
    net_effect,
)
from streaming.core.engine import (
    DeadLetter,
    Delivery,
    Engine,
    Event,
    Reason,
    SubscribeRequest,
    dead_letter_payload,
    per_message,
    recover,
)
from streaming.core.outbound import Publish
from streaming.core.pipeline import Pipeline, StateWriter
from tests.core.doors import RecordingDoor
from tests.storage.pending_model import PendingEntries

S = 1_000_000_000


def check_fresh(store: Store, updates: Sequence[SubUpdate]) -> None:
    """The engine's promise behind `SetPending.fresh`, which lets `net_effect` drop a first delivery
    acked in the same batch: the entry is not pending at that point (in the store, after the updates
    before it)."""
    pending = PendingEntries({(s.record.sub_id, seq) for s in store.recover().subscriptions for seq in s.pending})
    for update in updates:
        if isinstance(update, SetPending) and update.fresh:
            assert (update.sub_id, update.seq) not in pending, f"{update}, but that entry is pending"
        elif isinstance(update, SetPendingRun):
            held = [seq for seq in update.seqs if (update.sub_id, seq) in pending]
            assert not held, f"first deliveries {held} of {update.sub_id}, but those entries are pending"
        pending.apply(update)


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def on_events(self, events: Sequence[Event]) -> None:
        self.events += per_message(events)


class SyncWriter(StateWriter):
    """Writes what the pipeline queues at once, in order: dead letters (committed through the
    pipeline, so they are delivered like any message), then the net effect of the updates."""

    def __init__(self, harness: Harness) -> None:
        self._harness = harness
        self._queued: list[tuple[list[DeadLetter], list[SubUpdate]]] = []
        self._writing = False

    def queue(self, dead_letters: list[DeadLetter], updates: list[SubUpdate]) -> None:
        self._queued.append((dead_letters, updates))
        if self._writing:  # a dead letter's commit queued more: written after what came before it
            return
        self._writing = True
        try:
            while self._queued:
                dead, batch = self._queued.pop(0)
                if dead:
                    self._harness.pipeline.commit(
                        [Publish(d.channel, dead_letter_payload(d), "", "", "") for d in dead]
                    )
                if batch:
                    store = self._harness.store
                    check_fresh(store, batch)
                    store.apply(net_effect(batch))
        finally:
            self._writing = False


class Harness:
    def __init__(self, store: Store | None = None, limits: StoreLimits | None = None) -> None:
        self.store = store if store is not None else MemoryStore(limits=limits)
        self.now = 100.0
        self.wall_ns = 1_700_000_000 * S
        self.recorder = Recorder()
        self.received: dict[int, list[Delivery]] = defaultdict(list)
        self.log: list[Delivery] = []
        self._wild_seen: dict[int, int] = {}  # wildcard subscription -> how much of `log` it has taken
        self._inboxes = 0
        self._build(Engine(self.store))

    def _build(self, engine: Engine) -> None:
        self.engine = engine
        self.engine.add_observer(self.recorder)
        self.door = RecordingDoor(clock=lambda: self.now, on_deliver=self._received)
        self.pipeline = Pipeline(
            self.store,
            engine,
            self.door,
            SyncWriter(self),
            clock=lambda: self.now,
            wall_clock_ns=lambda: self.wall_ns,
        )

    def _received(self, deliveries: Sequence[Delivery]) -> None:
        for delivery in deliveries:
            self.received[delivery.sub_id].append(delivery)
            self.log.append(delivery)

    # -- time --------------------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            due = []
            for sub_id in self.engine.subscriptions():
                deadline = self.engine.next_deadline(sub_id)
                if deadline is not None and deadline <= end:
                    due.append((deadline, sub_id))
            if not due:
                break
            deadline, sub_id = min(due)
            self.tick_to(max(self.now, deadline))
            while self.engine.expire(sub_id, self.now):
                pass
            self.pipeline.settle()
        self.tick_to(end)

    def tick_to(self, when: float) -> None:
        self.wall_ns += int((when - self.now) * S)
        self.now = when

    # -- traffic -------------------------------------------------------------------------------

    def client(self, client_id: str = "c") -> str:
        """Register a client as the server does: in the store (it survives restarts) and the engine."""
        self.store.register_client(ClientRecord(client_id, f"_HB.{client_id}"))
        self.pipeline.add_client(client_id)
        return client_id

    def drop_client(self, client_id: str) -> None:
        self.store.unregister_client(client_id)
        self.pipeline.client_closed(client_id)

    def publish(self, channel: str, *payloads: bytes, count: int = 0) -> list[int]:
        data = list(payloads) or [b"m%d" % i for i in range(count)]
        self.store.ensure_channel(channel)
        info = self.store.channel_info(channel)
        assert info is not None
        self.pipeline.commit([Publish(channel, d, "", "", "") for d in data])
        return list(range(info.last_seq + 1, info.last_seq + 1 + len(data)))

    def subscribe(
        self,
        channel: str = "foo",
        client: str = "c",
        *,
        ack_wait_s: float = 30,
        max_inflight: int = 1024,
        durable: str = "",
        queue: str = "",
        start: StartPosition = StartPosition.NEW_ONLY,
        start_sequence: int = 0,
        start_time_delta_s: float = 0,
        options: SubOptions | None = None,
        exclude: tuple[str, ...] = (),
    ) -> int:
        self._inboxes += 1
        request = SubscribeRequest(
            client_id=client,
            channel=channel,
            inbox=f"_INBOX.{client}.{self._inboxes}",
            ack_inbox=f"_ACK.{self._inboxes}",
            ack_wait_ms=int(ack_wait_s * 1000),
            max_inflight=max_inflight,
            durable_name=durable,
            queue_group=queue,
            start_position=start,
            start_sequence=start_sequence,
            start_time_delta_ns=int(start_time_delta_s * S),
            options=options or SubOptions(),
            exclude=exclude,
        )
        return self.pipeline.subscribe(request, lambda sub_id: None)

    def ack(self, sub_id: int, *seqs: int) -> list[bool]:
        return [self.pipeline.ack(sub_id, seq) for seq in seqs]

    def nak(self, sub_id: int, seq: int, delay: float) -> bool:
        return self.pipeline.nak(sub_id, seq, delay)

    def collect(self) -> None:
        """Carry out whatever engine calls made directly (not through the pipeline) left queued."""
        self.pipeline.settle()

    def take(self, sub_id: int) -> list[tuple[int, int, Reason]]:
        """(seq, attempt, reason) of what `sub_id` received since the last take."""
        got = [(d.message.seq, d.attempt, d.reason) for d in self.received.pop(sub_id, [])]
        return got

    def seqs(self, sub_id: int) -> list[int]:
        return [seq for seq, _, _ in self.take(sub_id)]

    def take_wild(self, sub_id: int) -> list[tuple[str, int, int, Reason]]:
        """(channel, seq, attempt, reason) of what the parts of wildcard subscription `sub_id` received
        since the last take, in the order they were sent."""
        wild = self.engine.wildcard(sub_id)
        assert wild is not None, f"{sub_id} is not a wildcard subscription"
        parts = {part.record.sub_id for part in wild.parts.values()}
        start = self._wild_seen.get(sub_id, 0)
        got = [(d.message.subject, d.message.seq, d.attempt, d.reason) for d in self.log[start:] if d.sub_id in parts]
        self._wild_seen[sub_id] = len(self.log)
        for part in parts:
            self.received.pop(part, None)
        return got

    def wild_seqs(self, sub_id: int) -> list[tuple[str, int]]:
        return [(channel, seq) for channel, seq, _, _ in self.take_wild(sub_id)]

    def ack_on(self, sub_id: int, channel: str, *seqs: int) -> list[bool]:
        """Acks for a wildcard subscription, naming the channel as a STAN Ack does."""
        part = self.engine.part_for(sub_id, channel)
        return [part is not None and self.pipeline.ack(part, seq) for seq in seqs]

    def restart(self, store: Store | None = None) -> None:
        """Rebuild the engine from the store (the store must hold everything flushed so far)."""
        self.collect()
        self.store = store if store is not None else self.store
        self._build(recover(self.store, wall_unix_ns=self.wall_ns))
        self.received.clear()
        self._wild_seen = dict.fromkeys(self._wild_seen, len(self.log))
        self.pipeline.start()

    def events(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.recorder.events if isinstance(e, kind)]


def payloads(messages: Sequence[Message]) -> list[bytes]:
    return [m.data for m in messages]
