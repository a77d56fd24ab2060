"""Read-only queries of one engine's state, for tests, benchmarks and debugging; the server itself asks
only what `Engine` answers directly."""

from __future__ import annotations

from typing import Protocol

from streaming.core.engine.state import Group, Sub


class Inspected(Protocol):
    """What the engine answers of its state (streaming.core.engine.engine.Engine)."""

    def state_of(self, sub_id: int) -> Sub: ...
    def client_ids(self) -> list[str]: ...
    def group(self, channel: str, key: str) -> Group | None: ...


class Inspection:
    def __init__(self, engine: Inspected) -> None:
        self._engine = engine

    def client_ids(self) -> list[str]:
        return self._engine.client_ids()

    def pending(self, sub_id: int) -> dict[int, int]:
        """seq -> attempt of one subscription's unacknowledged messages."""
        sub = self._engine.state_of(sub_id)
        return {seq: sub.pending.attempt(seq) for seq in sub.pending}

    def in_flight(self, sub_id: int) -> int:
        """Pending messages sent and not yet expired (excludes those waiting to be redelivered)."""
        return self._engine.state_of(sub_id).pending.in_flight

    def waiting(self, sub_id: int) -> set[int]:
        """Pending messages due for redelivery that the subscription cannot take yet."""
        return set(self._engine.state_of(sub_id).pending.due())

    def naked(self, sub_id: int) -> dict[int, float]:
        """Pending messages given back with a nak, seq -> when (engine clock) they come back."""
        pending = self._engine.state_of(sub_id).pending
        return {seq: until[0] for seq in pending if (until := pending.naked_until(seq)) is not None}

    def owner_key(self, sub_id: int) -> tuple[str, str, int]:
        """Who acks count for: the queue group (any member) or the subscription itself."""
        sub = self._engine.state_of(sub_id)
        if sub.group is not None:
            return (sub.group.channel, sub.group.name, 0)
        return (sub.record.channel, "", sub_id)

    def group_members(self, channel: str, group_key: str) -> list[int]:
        group = self._engine.group(channel, group_key)
        return [] if group is None else [m.record.sub_id for m in group.members]
