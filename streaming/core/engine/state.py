"""What the engine holds per subscription, queue group and client (sans-IO records, no behaviour but
their own arithmetic and a group's choice of member), and the requests it is given.

Queue groups: members share one position and take turns; `Group.pick` is who gets the next message.
A message goes to the member with the fewest pending messages that is not failing heartbeats (and,
for a new message, not stalled at MaxInflight (or its window) and with nothing due); ties rotate
round-robin. When a member leaves, its pending messages go round-robin to the others, due at once
(the engine's `_hand_over`); an empty durable group keeps its state as a "shadow" for the members to
come.
"""

from __future__ import annotations

from collections.abc import Container

import attrs

from storage.records import StartPosition, SubOptions, SubscriptionRecord
from streaming.core.engine.events import SubRef
from streaming.core.engine.pending import PendingSet


@attrs.frozen(slots=True)
class SubscribeRequest:
    client_id: str
    channel: str
    inbox: str
    ack_inbox: str
    ack_wait_ms: int
    max_inflight: int
    durable_name: str = ""
    queue_group: str = ""
    start_position: StartPosition = StartPosition.NEW_ONLY
    start_sequence: int = 0
    start_time_delta_ns: int = 0
    options: SubOptions = attrs.field(factory=SubOptions)
    # Deliveries on demand (a pull door's consumer): nothing new is sent until the door opens the
    # subscription's window with `Engine.set_window`.
    on_demand: bool = False

    def __attrs_post_init__(self) -> None:
        if self.ack_wait_ms <= 0 or self.max_inflight <= 0:
            raise ValueError("ack_wait_ms and max_inflight must be positive (the protocol layer checks this)")


class Sub:
    """One subscription: plain, durable, queue member, or the offline shadow of a durable group."""

    __slots__ = ("group", "last_sent", "online", "pending", "record", "ref", "window")

    def __init__(self, record: SubscriptionRecord, group: Group | None, online: bool) -> None:
        self.record = record
        # How many pending messages it may hold before new ones wait: its MaxInflight, or for a
        # subscription on demand what its door opened (`Engine.set_window`), never more.
        self.window = record.max_inflight
        self.group = group
        self.online = online
        self.last_sent = record.last_sent
        self.pending = PendingSet()
        self.ref = ref(record)

    def delay(self, attempt: int) -> float:
        backoff = self.record.options.backoff_ms
        if backoff:
            return backoff[min(attempt, len(backoff)) - 1] / 1000
        return self.record.ack_wait_ms / 1000

    @property
    def stalled(self) -> bool:
        return len(self.pending) >= self.window


@attrs.frozen
class SubscriptionView:
    """A read-only snapshot of one subscription for monitoring."""

    record: SubscriptionRecord  # last_sent is the current position (the group's, for queue members)
    online: bool
    pending_count: int  # unacknowledged messages, sent or waiting to be redelivered
    stalled: bool  # at MaxInflight (or its window): nothing new goes out until something is acked


class Client:
    __slots__ = ("hb_failed", "subs")

    def __init__(self) -> None:
        self.hb_failed = False
        self.subs: set[int] = set()


def ref(record: SubscriptionRecord) -> SubRef:
    return SubRef(record.channel, record.sub_id, record.client_id, record.durable_name, record.queue_group)


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
