"""A front door for tests of the core: records what the core sends, when, and what it acknowledges."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

from streaming.core.engine import Delivery
from streaming.core.outbound import Outcome, Publish


class RecordingDoor:
    """An `Outbound` port: `sent` holds (clock time, delivery), `acks` (guid, error text or "")."""

    def __init__(
        self,
        clock: Callable[[], float] | None = None,
        on_deliver: Callable[[Sequence[Delivery]], None] | None = None,
    ) -> None:
        self._clock = clock
        self._on_deliver = on_deliver
        self.sent: list[tuple[float, Delivery]] = []
        self.acks: list[tuple[str, str]] = []

    def now(self) -> float:
        if self._clock is not None:
            return self._clock()
        import trio

        return trio.current_time()

    def deliver(self, deliveries: Sequence[Delivery]) -> None:
        now = self.now()
        self.sent += [(now, d) for d in deliveries]
        if self._on_deliver is not None:
            self._on_deliver(deliveries)

    def published(self, publishes: Sequence[Publish], outcomes: Sequence[Outcome]) -> None:
        for p, outcome in zip(publishes, outcomes, strict=True):
            self.acks.append((p.guid, str(outcome) if isinstance(outcome, Exception) else ""))

    def holding(self) -> AbstractContextManager[None]:
        return nullcontext()

    async def wait_reachable(self, inboxes: list[str]) -> None:
        return None
