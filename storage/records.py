"""The records the store keeps and returns: messages, channels, clients, subscriptions, updates.

All are treated as immutable. The few made once per message (Message, SetPending, ClearPending,
SetLastSent) are plain slotted classes rather than frozen ones: a frozen attrs instance costs twice as
much to build, and that shows on the delivery hot path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs

# The one definition of the wire's start positions, which the store persists with each subscription.
from streaming.wire.positions import StartPosition as StartPosition


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
    # A queue group that keeps each channel's order: one message of a channel out at a time.
    ordered: bool = False


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
    # A wildcard subscription (its `channel` a pattern such as `orders.*`) is stored as one record for
    # the pattern and one per channel it follows, each with that channel's position and pending
    # messages; `parent_id` is the pattern's record for the latter (0: not part of a wildcard).
    parent_id: int = 0
    # The pattern's record only: patterns of channels it does not follow (its user may not read them).
    exclude: tuple[str, ...] = ()

    @property
    def is_pattern(self) -> bool:
        """Whether this is a wildcard subscription's pattern record (no channel name has a `*` or `>`
        token, so its `channel` names no channel)."""
        return any(token in ("*", ">") for token in self.channel.split("."))


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
    `not_before_ns`: the subscriber gave it back with a negative ack, and it is not to be sent again
    before this time (Unix ns; 0: no such wait), which a restart honours.
    """

    sub_id: int
    seq: int
    attempt: int
    fresh: bool = False
    not_before_ns: int = 0


@attrs.define(slots=True)
class ClearPending:
    """`seq` left pending on `sub_id` (acked, moved to another member, evicted or dead-lettered)."""

    sub_id: int
    seq: int


@attrs.define(slots=True)
class SetPendingRun:
    """Each of `seqs` was delivered to `sub_id` for the first time: pending on attempt 1. It is a
    fresh `SetPending` of each (none had an entry), written as one update: a read's worth of first
    deliveries costs one object, and `net_effect` cancels it against acks with set operations."""

    sub_id: int
    seqs: list[int]


@attrs.define(slots=True)
class ClearPendingRun:
    """A `ClearPending` of each of `seqs` on `sub_id` (a read's worth of acks), as one update."""

    sub_id: int
    seqs: list[int]


@attrs.frozen(slots=True)
class SaveClient:
    """Register (or re-register) a client."""

    record: ClientRecord


@attrs.frozen(slots=True)
class DeleteClient:
    client_id: str


SubUpdate = (
    SaveSubscription
    | DeleteSubscription
    | SetLastSent
    | SetPending
    | ClearPending
    | SetPendingRun
    | ClearPendingRun
    | SaveClient
    | DeleteClient
)


def net_effect(updates: Sequence[SubUpdate]) -> list[SubUpdate]:
    """The updates of a batch that still matter once it is applied in order.

    A pending entry or a last-sent value written again later in the batch loses its earlier write:
    the later put or delete replaces it whatever happens in between. A pending entry whose first write
    in the batch is fresh (a fresh SetPending, or a SetPendingRun: the store has no entry for it) and
    whose last is a clear is not written at all: before and after the batch there is none. Under load
    most messages are delivered and acked within a flush or two, so this removes most of what the
    store would write. Runs are matched with set operations, not message by message; a run that
    loses some of its sequences is replaced by a narrower one. Applying the result leaves the store
    exactly as applying `updates` would.
    """
    latest: dict[tuple[int, int], int] = {}  # (sub id, seq or -1 for last-sent) -> index of its last single write
    singles: dict[int, set[int]] = {}  # sub id -> the sequences among `latest`'s keys
    fresh: set[tuple[int, int]] = set()  # entries whose first write in the batch was fresh
    open_runs: dict[int, list[set[int]]] = {}  # sub id -> its SetPendingRuns' sequences not yet replaced
    stale: dict[int, set[int]] = {}  # sub id -> sequences in its runs written before the run in the batch
    run_seqs: dict[int, set[int]] = {}  # index of a SetPendingRun -> its sequences still to write
    cleared: dict[int, set[int]] = {}  # index of a ClearPendingRun that lost some -> the ones to write
    keep = [True] * len(updates)

    def replace_singles(sub_id: int, seqs: set[int]) -> set[int]:
        """Drop the single writes of these entries (a run writes them later); the ones dropped."""
        written = singles.get(sub_id)
        hit = seqs & written if written else set()
        for seq in hit:
            keep[latest.pop((sub_id, seq))] = False
        if hit:
            written -= hit  # type: ignore[operator]
        return hit

    for i, update in enumerate(updates):
        kind = type(update)
        if kind is SetPendingRun:
            sub_id = update.sub_id  # type: ignore[union-attr]
            run_seqs[i] = seqs = set(update.seqs)  # type: ignore[union-attr]
            for seq in replace_singles(sub_id, seqs):
                if (sub_id, seq) not in fresh:  # the store may hold it: a clear of it must be written
                    stale.setdefault(sub_id, set()).add(seq)
            open_runs.setdefault(sub_id, []).append(seqs)
            continue
        if kind is ClearPendingRun:
            sub_id = update.sub_id  # type: ignore[union-attr]
            rest = set(update.seqs)  # type: ignore[union-attr]
            runs = open_runs.get(sub_id)
            if runs:  # acks of first deliveries made in this batch: neither is written
                not_fresh = stale.get(sub_id)
                for seqs in runs:
                    both = seqs & rest
                    if both:
                        seqs -= both
                        rest -= both - not_fresh if not_fresh else both
                runs[:] = [seqs for seqs in runs if seqs]
            for seq in replace_singles(sub_id, rest):
                if (sub_id, seq) in fresh:  # set fresh (as a single) and cleared in this batch: nothing
                    fresh.discard((sub_id, seq))
                    rest.discard(seq)
            if len(rest) != len(update.seqs):  # type: ignore[union-attr]
                cleared[i] = rest
            continue
        if kind is SetPending or kind is ClearPending:
            sub_id, seq = update.sub_id, update.seq  # type: ignore[union-attr]
            key = (sub_id, seq)
            runs = open_runs.get(sub_id)
            if runs:
                for seqs in runs:  # oldest first: acks come in about the order of their deliveries
                    if seq in seqs:  # a run wrote it earlier in the batch: this write replaces that one
                        seqs.discard(seq)
                        not_fresh = stale.get(sub_id)
                        if not not_fresh or seq not in not_fresh:
                            fresh.add(key)
                        break
                while runs and not runs[0]:
                    del runs[0]
            singles.setdefault(sub_id, set()).add(seq)
        elif kind is SetLastSent:
            key = (update.sub_id, -1)  # type: ignore[union-attr]
        else:
            if kind is DeleteSubscription:
                # Its runs so far are written as they are (the delete wipes them): a later run of the
                # same id starts anew, so an entry is in at most one open run.
                open_runs.pop(update.sub_id, None)  # type: ignore[union-attr]
                stale.pop(update.sub_id, None)  # type: ignore[union-attr]
            continue
        earlier = latest.get(key)
        if earlier is not None:
            keep[earlier] = False
        elif kind is SetPending and update.fresh:  # type: ignore[union-attr]
            fresh.add(key)
        latest[key] = i
    for key in fresh:
        last = latest.get(key)
        if last is not None and type(updates[last]) is ClearPending:
            keep[last] = False
    if not (run_seqs or cleared):
        return [update for update, kept in zip(updates, keep, strict=True) if kept]
    out: list[SubUpdate] = []
    for i, update in enumerate(updates):
        if not keep[i]:
            continue
        narrowed = run_seqs.get(i)
        if narrowed is not None:
            if len(narrowed) != len(update.seqs):  # type: ignore[union-attr]
                if not narrowed:
                    continue
                update = SetPendingRun(update.sub_id, sorted(narrowed))  # type: ignore[union-attr]
        else:
            narrowed = cleared.get(i)
            if narrowed is not None:
                if not narrowed:
                    continue
                update = ClearPendingRun(update.sub_id, sorted(narrowed))  # type: ignore[union-attr]
        out.append(update)
    return out


def split_at(updates: Sequence[SubUpdate], cut: int) -> tuple[list[SubUpdate], list[SubUpdate]]:
    """What to write now of a queue of updates that goes on past `cut`, and what to keep queued.

    Written now: the net effect of `updates[:cut]`, but for the first deliveries among them that an
    ack after the cut clears; kept: `updates[cut:]` without those acks. Neither the entry nor its
    delete is ever written, as when both fall in one batch. What this write leaves in the store is
    the state at the cut, but for messages acknowledged by now: a crash after it redelivers what
    came after the cut, as a crash before it would have. So a flush that cuts a little before its
    end no longer writes, and then deletes, every message in flight at its end (under load that is
    most of what a flush wrote). An entry is left out only where nothing but runs of first
    deliveries (before the cut) and of acks (after it) write it.
    """
    before: list[SubUpdate | None] = list(updates[:cut])
    after: list[SubUpdate | None] = list(updates[cut:])
    acked: dict[int, set[int]] = {}
    touched: dict[int, set[int]] = {}  # entries written otherwise: left as they are
    for update in after:
        if isinstance(update, ClearPendingRun):
            seqs = acked.get(update.sub_id)
            if seqs is None:
                acked[update.sub_id] = set(update.seqs)
            else:
                seqs.update(update.seqs)
        elif isinstance(update, SetPendingRun):
            touched.setdefault(update.sub_id, set()).update(update.seqs)
        elif isinstance(update, SetPending | ClearPending):
            touched.setdefault(update.sub_id, set()).add(update.seq)
    runs: list[tuple[int, SetPendingRun]] = []  # the runs of first deliveries to those subscriptions
    if acked:
        for i, update in enumerate(before):
            if isinstance(update, SetPendingRun):
                if update.sub_id in acked:
                    runs.append((i, update))
            elif isinstance(update, SetPending | ClearPending):
                touched.setdefault(update.sub_id, set()).add(update.seq)
    # Set operations over whole runs: under load most runs are acked whole and simply go.
    dropped: dict[int, set[int]] = {}
    for i, run in runs:
        both = acked[run.sub_id].intersection(run.seqs)
        if both and run.sub_id in touched:
            both -= touched[run.sub_id]
        if both:
            dropped.setdefault(run.sub_id, set()).update(both)
            before[i] = None if len(both) == len(run.seqs) else SetPendingRun(run.sub_id, _less(run.seqs, both))
    if dropped:
        for i, update in enumerate(after):
            if isinstance(update, ClearPendingRun) and update.sub_id in dropped:
                gone = dropped[update.sub_id]
                if gone.issuperset(update.seqs):
                    after[i] = None
                elif not gone.isdisjoint(update.seqs):
                    after[i] = ClearPendingRun(update.sub_id, _less(update.seqs, gone))
    return net_effect([u for u in before if u is not None]), [u for u in after if u is not None]


def _less(seqs: list[int], gone: set[int]) -> list[int]:
    return [seq for seq in seqs if seq not in gone]


@attrs.frozen(slots=True)
class RecoveredSubscription:
    record: SubscriptionRecord
    pending: Mapping[int, int]  # seq -> attempt count
    # seq -> not to be sent before (Unix ns): the pending messages given back with a nak and a delay
    naks: Mapping[int, int] = attrs.field(factory=dict)


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
