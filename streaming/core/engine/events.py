"""What the delivery engine tells the outside: typed events through one observer interface, and the
records it hands to the server to send (deliveries) or to publish (dead letters).

Metrics and the event log subscribe as observers; the engine imports neither.
"""

from __future__ import annotations

import enum
from typing import Protocol

import attrs

from storage.records import Message


class Reason(enum.Enum):
    """Why a message was sent."""

    NEW = "new"
    ACK_TIMEOUT = "ack_timeout"
    MEMBER_LEFT = "member_left"
    RESTART = "restart"
    RESUME = "resume"  # a durable (or durable queue group) came back with messages still pending


@attrs.define(slots=True)
class Delivery:
    """One MsgProto to send to `inbox`; `attempt` is 1 on the first delivery (redeliveryCount + 1).

    Not frozen only because one is built per message (frozen attrs classes cost twice as much); treat
    it as immutable.
    """

    sub_id: int
    inbox: str
    message: Message
    attempt: int
    reason: Reason

    @property
    def redelivered(self) -> bool:
        return self.attempt > 1


@attrs.frozen(slots=True)
class DeadLetter:
    """A message that used up its MaxDeliver attempts, to be published to `channel`."""

    channel: str
    origin_channel: str
    seq: int
    attempts: int
    sub_id: int
    client_id: str
    durable_name: str
    queue_group: str
    message: Message


@attrs.frozen(slots=True)
class SubRef:
    """Who an event is about: labels that are safe for metrics (channel, durable, group) plus ids."""

    channel: str
    sub_id: int
    client_id: str
    durable_name: str = ""
    queue_group: str = ""
    # Computed once per subscription, read for every event of it.
    group: str = attrs.field(init=False, eq=False, repr=False)  # the queue group, else the durable name
    labels: tuple[str, str] = attrs.field(init=False, eq=False, repr=False)  # (channel, group) for metrics

    def __attrs_post_init__(self) -> None:
        group = self.queue_group or self.durable_name
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "labels", (self.channel, group))


@attrs.define(slots=True)  # not frozen: one per message, and frozen classes cost twice as much
class Delivered:
    sub: SubRef
    seq: int
    attempt: int
    reason: Reason
    ack_wait_s: float


@attrs.define(slots=True)  # not frozen: one per message, and frozen classes cost twice as much
class Acked:
    sub: SubRef
    seq: int
    attempt: int
    pending_s: float  # since the delivery that was acked


@attrs.frozen(slots=True)
class AckTimedOut:
    sub: SubRef
    seq: int
    attempt: int
    ack_wait_s: float


@attrs.frozen(slots=True)
class ExpiredByLimit:
    sub: SubRef
    seq: int


@attrs.frozen(slots=True)
class DeadLettered:
    sub: SubRef
    seq: int
    attempts: int
    dead_letter_channel: str


@attrs.frozen(slots=True)
class MemberJoined:
    sub: SubRef


@attrs.frozen(slots=True)
class MemberLeft:
    sub: SubRef
    moved: int  # pending messages handed to the remaining members


@attrs.frozen(slots=True)
class SubscriptionCreated:
    sub: SubRef
    resumed: bool


@attrs.frozen(slots=True)
class SubscriptionClosed:
    """A durable (or the last member of a durable queue group) went offline, keeping its state."""

    sub: SubRef


@attrs.frozen(slots=True)
class SubscriptionRemoved:
    sub: SubRef


Event = (
    Delivered
    | Acked
    | AckTimedOut
    | ExpiredByLimit
    | DeadLettered
    | MemberJoined
    | MemberLeft
    | SubscriptionCreated
    | SubscriptionClosed
    | SubscriptionRemoved
)


class Observer(Protocol):
    def on_event(self, event: Event) -> None: ...
