"""The records the store keeps and returns: messages, channels, clients, subscriptions, updates.

All are treated as immutable. The few made once per message (Message, SetPending, ClearPending,
SetLastSent) are plain slotted classes rather than frozen ones: a frozen attrs instance costs twice as
much to build, and that shows on the delivery hot path.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs


class StartPosition(enum.IntEnum):
    """Where a new subscription starts (numbers are the STAN protobuf enum values)."""

    NEW_ONLY = 0
    LAST_RECEIVED = 1
    TIME_DELTA_START = 2
    SEQUENCE_START = 3
    FIRST = 4


class MessageToAppend(Protocol):
    """What `Store.append` reads of a message: any object with these (a NewMessage, or a caller's own
    record of a publish, so that a batch need not be copied into NewMessages first)."""

    @property
    def channel(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def reply(self) -> str: ...
    @property
    def content_type(self) -> str: ...


@attrs.frozen(slots=True)
class NewMessage:
    """A message to append; the store assigns its sequence and timestamp."""

    channel: str
    data: bytes
    reply: str = ""
    content_type: str = ""  # the publisher's media type, kept for HTTP doors ("" = none given)


@attrs.define(slots=True)
class Message:
    """A stored message. `subject` is the channel name, as in STAN's MsgProto."""

    seq: int
    timestamp_unix_ns: int
    subject: str
    reply: str
    data: bytes
    content_type: str = ""  # as published over HTTP; STAN has no field for it


@attrs.frozen(slots=True)
class ChannelInfo:
    """What the store knows about one channel. With no messages, first_seq == last_seq + 1."""

    name: str
    channel_id: int
    first_seq: int = 1
    last_seq: int = 0
    msgs: int = 0
    bytes: int = 0
    last_timestamp_unix_ns: int = 0


@attrs.frozen(slots=True)
class AppendResult:
    """Per input message (in input order) its (seq, timestamp); per channel the evicted sequences."""

    assigned: list[tuple[int, int]]
    dropped: dict[str, range]


@attrs.frozen(slots=True)
class ExpireResult:
    """Sequences removed by the age sweep, and when the next message will be too old (None: never)."""

    dropped: dict[str, range]
    next_expiry_unix_ns: int | None


@attrs.frozen(slots=True)
class ClientRecord:
    client_id: str
    hb_inbox: str
    conn_id: bytes = b""
    protocol: int = 1
    ping_interval: int = 0
    ping_max_out: int = 0


@attrs.frozen(slots=True)
class SubOptions:
    """Opt-in extensions beyond STAN (all off by default so stock behaviour is unchanged)."""

    max_deliver: int = 0
    dead_letter_channel: str = ""
    backoff_ms: tuple[int, ...] = ()
    max_inflight_redeliveries: bool = False


@attrs.frozen(slots=True)
class SubscriptionRecord:
    """A subscription as persisted. `last_sent` is the sequence after which new deliveries start."""

    sub_id: int
    channel: str
    client_id: str
    inbox: str
    ack_inbox: str
    ack_wait_ms: int
    max_inflight: int
    durable_name: str = ""
    queue_group: str = ""
    start_position: StartPosition = StartPosition.NEW_ONLY
    start_sequence: int = 0
    start_time_delta_ns: int = 0
    last_sent: int = 0
    is_durable: bool = False
    is_closed: bool = False
    options: SubOptions = SubOptions()


@attrs.frozen(slots=True)
class SaveSubscription:
    """Create or replace a subscription record (including its last_sent)."""

    record: SubscriptionRecord


@attrs.frozen(slots=True)
class DeleteSubscription:
    """Delete a subscription with its pending entries."""

    sub_id: int


@attrs.define(slots=True)
class SetLastSent:
    sub_id: int
    last_sent: int


@attrs.define(slots=True)
class SetPending:
    """Record `seq` as delivered and unacknowledged on `sub_id`, with its attempt count so far.

    `fresh`: the subscription had no pending entry for `seq` when this was queued (a first delivery),
    so the store cannot hold one either once what was queued before it is applied; `net_effect` may
    then drop it together with a ClearPending later in the same batch.
    """

    sub_id: int
    seq: int
    attempt: int
    fresh: bool = False


@attrs.define(slots=True)
class ClearPending:
    """`seq` left pending on `sub_id` (acked, moved to another member, evicted or dead-lettered)."""

    sub_id: int
    seq: int


@attrs.frozen(slots=True)
class SaveClient:
    """Register (or re-register) a client."""

    record: ClientRecord


@attrs.frozen(slots=True)
class DeleteClient:
    client_id: str


SubUpdate = SaveSubscription | DeleteSubscription | SetLastSent | SetPending | ClearPending | SaveClient | DeleteClient


def net_effect(updates: Sequence[SubUpdate]) -> list[SubUpdate]:
    """The updates of a batch that still matter once it is applied in order.

    A pending entry or a last-sent value written again later in the batch loses its earlier write:
    the later put or delete replaces it whatever happens in between. A pending entry whose first write
    in the batch is a fresh SetPending (the store has no entry for it) and whose last is a ClearPending
    is not written at all: before and after the batch there is none. Under load most messages are
    delivered and acked within a flush or two, so this removes most of what the store would write.
    Applying the result leaves the store exactly as applying `updates` would.
    """
    latest: dict[tuple[int, int], int] = {}  # (sub id, seq or -1 for last-sent) -> index of its last write
    fresh: list[tuple[int, int]] = []  # pending entries first written in the batch by a fresh SetPending
    keep = [True] * len(updates)
    for i, update in enumerate(updates):
        kind = type(update)
        if kind is SetPending or kind is ClearPending:
            key = (update.sub_id, update.seq)  # type: ignore[union-attr]
        elif kind is SetLastSent:
            key = (update.sub_id, -1)  # type: ignore[union-attr]
        else:
            continue
        earlier = latest.get(key)
        if earlier is not None:
            keep[earlier] = False
        elif kind is SetPending and update.fresh:  # type: ignore[union-attr]
            fresh.append(key)
        latest[key] = i
    for key in fresh:
        last = latest[key]
        if type(updates[last]) is ClearPending:
            keep[last] = False
    return [update for update, kept in zip(updates, keep, strict=True) if kept]


@attrs.frozen(slots=True)
class RecoveredSubscription:
    record: SubscriptionRecord
    pending: Mapping[int, int]  # seq -> attempt count


@attrs.frozen(slots=True)
class ServerInfo:
    cluster_id: str
    schema_version: int
    created_unix_ns: int


@attrs.frozen(slots=True)
class RecoveredState:
    """Everything needed to rebuild the server's state after a restart."""

    server: ServerInfo
    channels: list[ChannelInfo]
    clients: list[ClientRecord]
    subscriptions: list[RecoveredSubscription]
