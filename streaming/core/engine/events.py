"""What the delivery engine tells the outside: typed events through one observer interface, and the
records it hands to the server to send (deliveries) or to publish (dead letters).

Metrics and the event log subscribe as observers; the engine imports neither.
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import Iterator, Sequence
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
    NAK = "nak"  # the subscriber gave it back with a negative ack, and its delay has passed


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


@attrs.define(slots=True)
class DeliveredRun:
    """First deliveries of a backlog read to one subscription (attempt 1, reason NEW), in order (`seqs`
    ascending, as the store reads them): one event for what one engine step sent, not one per message."""

    sub: SubRef
    seqs: list[int]
    ack_wait_s: float


@attrs.define(slots=True)  # not frozen: one per message, and frozen classes cost twice as much
class Acked:
    """One ack, as `per_message` spells out an `AckedRun` (the engine reports acks in runs)."""

    sub: SubRef
    seq: int
    attempt: int
    pending_s: float  # since the delivery that was acked


@attrs.define(slots=True)
class AckedRun:
    """Acks of one subscription that arrived in a row (one read's worth), from `at` (the clock at the
    first): per ack its sequence and (attempt, clock time of the delivery acked, or -1.0 if it was
    waiting to be redelivered). The engine only appends to it; `attempts` and `pending_s` spell it out."""

    sub: SubRef
    at: float
    seqs: list[int]
    acked: list[tuple[int, float]]
    first_attempts: bool = True  # every ack is of a first delivery

    def attempts(self) -> list[int]:
        return [attempt for attempt, _ in self.acked]

    def pending_s(self) -> list[float]:
        """Per ack, how long its message was pending (since the delivery acked; 0 if none was)."""
        at = self.at
        return [at - delivered if delivered >= 0 else 0.0 for _, delivered in self.acked]


@attrs.frozen(slots=True)
class AckTimedOut:
    sub: SubRef
    seq: int
    attempt: int
    ack_wait_s: float


@attrs.frozen(slots=True)
class Naked:
    """The subscriber gave `seq` back with a negative ack: it comes back after `delay_s`."""

    sub: SubRef
    seq: int
    attempt: int
    delay_s: float


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
    | DeliveredRun
    | Acked
    | AckedRun
    | AckTimedOut
    | Naked
    | ExpiredByLimit
    | DeadLettered
    | MemberJoined
    | MemberLeft
    | SubscriptionCreated
    | SubscriptionClosed
    | SubscriptionRemoved
)


class Observer(Protocol):
    def on_events(self, events: Sequence[Event]) -> None:
        """What one engine pass did, in order. Runs of first deliveries and of acks come as one event
        each (`DeliveredRun`, `AckedRun`), so that an observer can count them in one step;
        `per_message` spells them out for one that wants an event per message."""


def per_message(events: Sequence[Event]) -> Iterator[Event]:
    """The events with every run spelled out as one `Delivered` or `Acked` per message, in order."""
    for event in events:
        if type(event) is DeliveredRun:
            sub, wait = event.sub, event.ack_wait_s
            for seq in event.seqs:
                yield Delivered(sub, seq, 1, Reason.NEW, wait)
        elif type(event) is AckedRun:
            sub = event.sub
            for seq, attempt, pending in zip(event.seqs, event.attempts(), event.pending_s(), strict=True):
                yield Acked(sub, seq, attempt, pending)
        else:
            yield event


def dead_letter_payload(dead: DeadLetter) -> bytes:
    """The dead-letter message body: JSON with where the message came from and its payload (base64)."""
    return json.dumps(
        {
            "channel": dead.origin_channel,
            "seq": dead.seq,
            "timestamp_unix_ns": dead.message.timestamp_unix_ns,
            "attempts": dead.attempts,
            "sub_id": dead.sub_id,
            "client_id": dead.client_id,
            "durable_name": dead.durable_name,
            "queue_group": dead.queue_group,
            "reply": dead.message.reply,
            "data_b64": base64.b64encode(dead.message.data).decode(),
        },
        separators=(",", ":"),
    ).encode()
