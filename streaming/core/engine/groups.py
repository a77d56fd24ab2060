"""Queue groups: members share one position and take turns; `pick` is who gets the next message.

A message goes to the member with the fewest pending messages that is not failing heartbeats (and,
for a new message, not stalled at MaxInflight (or its window) and with nothing due); ties rotate round-robin. When a
member leaves, its pending messages go round-robin to the others, due at once (the engine's
`_hand_over`); an empty durable group keeps its state as a "shadow" for the members to come.
"""

from __future__ import annotations

from collections.abc import Container

from streaming.core.engine.state import Sub


class Group:
    """A queue group: members share one position; `shadow` keeps an empty durable group's state."""

    __slots__ = ("channel", "durable", "last_sent", "members", "name", "shadow")

    def __init__(self, channel: str, name: str, durable: bool, last_sent: int) -> None:
        self.channel = channel
        self.name = name
        self.durable = durable
        self.last_sent = last_sent
        self.members: list[Sub] = []
        self.shadow: Sub | None = None

    def pick(self, *, for_new: bool, failed: Container[Sub] = ()) -> Sub | None:
        """The member to send to (None: none can take a new message now); `failed`: the members
        failing heartbeats (found once by the caller: a pump picks once per message)."""
        best: Sub | None = None
        fewest = 0
        for member in self.members:
            pending = member.pending
            size = len(pending)
            if member in failed or (for_new and (size >= member.window or pending.due_count)):
                continue
            if best is None or size < fewest:
                best, fewest = member, size
        if best is None:
            if for_new:
                return None
            best = self.members[0]
        if best is self.members[0] and len(self.members) > 1:
            self.members.append(self.members.pop(0))
        return best


def group_key(request_durable: str, queue_group: str) -> str:
    return f"{request_durable}:{queue_group}" if request_durable else queue_group
