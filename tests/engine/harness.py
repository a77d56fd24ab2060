"""Drives the engine synchronously with a virtual clock, as the Trio runtime would, for engine tests.

Timers are simulated exactly: `advance(dt)` fires every subscription's deadline in deadline order at
the deadline itself. Store updates (their net effect) and dead letters are written as the runtime
writes them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from storage import (
    ClientRecord,
    MemoryStore,
    Message,
    NewMessage,
    SetPending,
    StartPosition,
    Store,
    StoreLimits,
    SubOptions,
    SubUpdate,
    net_effect,
)
from streaming.engine import Delivery, Engine, Event, Reason, SubscribeRequest, dead_letter_payload
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
        pending.apply(update)


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def on_event(self, event: Event) -> None:
        self.events.append(event)


class Harness:
    def __init__(self, store: Store | None = None, limits: StoreLimits | None = None) -> None:
        self.store = store if store is not None else MemoryStore(limits=limits)
        self.now = 100.0
        self.wall_ns = 1_700_000_000 * S
        self.engine = Engine(self.store)
        self.recorder = Recorder()
        self.engine.add_observer(self.recorder)
        self.received: dict[int, list[Delivery]] = defaultdict(list)
        self.log: list[Delivery] = []
        self._inboxes = 0

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
            self.collect()
        self.tick_to(end)

    def tick_to(self, when: float) -> None:
        self.wall_ns += int((when - self.now) * S)
        self.now = when

    # -- traffic -------------------------------------------------------------------------------

    def client(self, client_id: str = "c") -> str:
        """Register a client as the server does: in the store (it survives restarts) and the engine."""
        self.store.register_client(ClientRecord(client_id, f"_HB.{client_id}"))
        self.engine.add_client(client_id)
        return client_id

    def drop_client(self, client_id: str) -> None:
        self.store.unregister_client(client_id)
        self.engine.client_closed(client_id, self.now)
        self.collect()

    def publish(self, channel: str, *payloads: bytes, count: int = 0) -> list[int]:
        data = list(payloads) or [b"m%d" % i for i in range(count)]
        self.store.ensure_channel(channel)
        result = self.store.append([NewMessage(channel, d) for d in data], now_unix_ns=self.wall_ns)
        for name, dropped in result.dropped.items():
            self.engine.on_dropped(name, dropped)
        # As the server does: the appended messages are known without reading them back.
        messages = [Message(seq, ts, channel, "", d) for (seq, ts), d in zip(result.assigned, data, strict=True)]
        self.engine.on_appended(channel, self.now, messages)
        self.collect()
        return [seq for seq, _ in result.assigned]

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
        )
        sub_id = self.engine.subscribe(request, self.now, self.wall_ns)
        self.collect()
        return sub_id

    def ack(self, sub_id: int, *seqs: int) -> list[bool]:
        results = [self.engine.ack(sub_id, seq, self.now) for seq in seqs]
        self.collect()
        return results

    def collect(self) -> None:
        for delivery in self.engine.take_deliveries():
            self.received[delivery.sub_id].append(delivery)
            self.log.append(delivery)
        dead = self.engine.take_dead_letters()
        if dead:
            for letter in dead:
                self.store.ensure_channel(letter.channel)
            result = self.store.append(
                [NewMessage(d.channel, dead_letter_payload(d)) for d in dead], now_unix_ns=self.wall_ns
            )
            for name, dropped in result.dropped.items():
                self.engine.on_dropped(name, dropped)
            for channel in {d.channel for d in dead}:
                self.engine.on_appended(channel, self.now)
            self.collect()
        updates = self.engine.take_updates()
        if updates:
            check_fresh(self.store, updates)
            self.store.apply(net_effect(updates))
        self.engine.take_timer_changes()

    def take(self, sub_id: int) -> list[tuple[int, int, Reason]]:
        """(seq, attempt, reason) of what `sub_id` received since the last take."""
        got = [(d.message.seq, d.attempt, d.reason) for d in self.received.pop(sub_id, [])]
        return got

    def seqs(self, sub_id: int) -> list[int]:
        return [seq for seq, _, _ in self.take(sub_id)]

    def restart(self, store: Store | None = None) -> None:
        """Rebuild the engine from the store (the store must hold everything flushed so far)."""
        self.collect()
        self.store = store if store is not None else self.store
        self.engine = Engine.recover(self.store)
        self.engine.add_observer(self.recorder)
        self.received.clear()
        self.engine.start(self.now)
        self.collect()

    def events(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.recorder.events if isinstance(e, kind)]


def payloads(messages: Sequence[Message]) -> list[bytes]:
    return [m.data for m in messages]
