"""What the engine's calls leave for the outside to do, gathered until the commit pipeline takes them.

`EffectsAccumulator` is the engine's base: its rules append to these lists as they go (no object or
call per effect beyond the append), and `take` hands them over as one `Effects` record, and the
events to the observers (metrics, the event log) in one call each.
"""

from __future__ import annotations

import attrs

from storage.records import SubUpdate
from streaming.core.engine.events import AckedRun, DeadLetter, Delivery, Event, Observer


@attrs.frozen(slots=True)
class Effects:
    """What engine calls left to do, in the order the commit pipeline does it: deliveries go out,
    dead letters are stored, then the subscription-state updates; timers are re-armed."""

    deliveries: list[Delivery]
    dead_letters: list[DeadLetter]
    updates: list[SubUpdate]
    timer_changes: set[int]

    def __bool__(self) -> bool:
        return bool(self.deliveries or self.dead_letters or self.updates or self.timer_changes)


class EffectsAccumulator:
    def __init__(self) -> None:
        self._deliveries: list[Delivery] = []
        self._updates: list[SubUpdate] = []
        self._dead: list[DeadLetter] = []
        self._timers: set[int] = set()
        self._observers: list[Observer] = []
        self._events: list[Event] = []  # for the observers, handed over by `take`
        self._ack_run: AckedRun | None = None  # the last of `_events`, if acks are being added to it

    def add_observer(self, observer: Observer) -> None:
        self._observers.append(observer)

    def _take(self) -> Effects:
        effects = Effects(self._deliveries, self._dead, self._updates, self._timers)
        self._deliveries, self._dead, self._updates, self._timers = [], [], [], set()
        if self._events:
            # Observers hear what a pass did in one call, runs as one event each: per message, a
            # call and an event object for each observer cost as much as the delivery itself.
            events, self._events, self._ack_run = self._events, [], None
            for observer in self._observers:
                observer.on_events(events)
        return effects

    def _emit(self, event: Event) -> None:
        self._events.append(event)
        self._ack_run = None

    def _emit_if(self, event: Event) -> None:
        if self._observers:
            self._emit(event)
