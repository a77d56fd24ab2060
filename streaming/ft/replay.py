"""Doing a log record to a store (sans-IO): how a standby keeps its store a copy of the active's, and
how any member rebuilds one from the log.

Replay is idempotent over a run of records done in order: every record but `Append` sets state (a
subscription, a pending entry, a client, a channel's existence) to what it was when the active did it,
and an `Append` that the store already holds is recognised by its first sequences and skipped. So a
member may replay from any position at or before the last record its store holds: that is what
lets the member's position be saved lazily.

But for a channel's deletion: once a channel is gone, an old append to it cannot be told from a gap,
and an old subscription record on it would come back. So a deletion is done through `delete`, which
marks it in the position first and moves the position past it, flushed, right after; and a replay
that starts before a marked deletion leaves that channel out of the records before it (`replay_at`).
"""

from __future__ import annotations

from storage import DeleteSubscription, SaveSubscription, Store, StoreError
from streaming.ft.oplog import Append, Apply, CreateChannel, DeleteChannel, Epoch, Expire, Genesis, Record
from streaming.ft.position import Position


class DivergedError(StoreError):
    """The store does not hold what the log says came before this record: it must be rebuilt."""


def append_held(store: Store, record: Append) -> bool:
    """Whether `store` already holds this append (True), or holds what comes just before it (False);
    `DivergedError` otherwise."""
    held: bool | None = None
    counts: dict[str, int] = {}
    for m in record.messages:
        counts[m.channel] = counts.get(m.channel, 0) + 1
    for name, first in record.first_seqs.items():
        info = store.channel_info(name)
        last = 0 if info is None else info.last_seq
        if last == first - 1:
            this = False
        elif last >= first + counts.get(name, 0) - 1 and info is not None:
            this = True
        else:
            raise DivergedError(f"channel {name!r} ends at {last}, and the log's next append starts at {first}")
        if held is not None and held != this:
            raise DivergedError(f"the store holds part of an append (channel {name!r})")
        held = this
    return bool(held)


def replay(store: Store, record: Record) -> None:
    """Do `record` to `store`, unless it holds it already."""
    if isinstance(record, Append):
        if not append_held(store, record):
            for name in record.first_seqs:
                store.ensure_channel(name)
            result = store.append(record.messages, now_unix_ns=record.now_unix_ns)
            expected = dict(record.first_seqs)
            for m, (seq, _) in zip(record.messages, result.assigned, strict=True):
                if seq != expected[m.channel]:
                    want = expected[m.channel]
                    raise DivergedError(f"channel {m.channel!r} numbered a message {seq}, the log {want}")
                expected[m.channel] += 1
    elif isinstance(record, Apply):
        store.apply(record.updates)
    elif isinstance(record, CreateChannel):
        store.ensure_channel(record.name)
    elif isinstance(record, DeleteChannel):
        if store.channel_info(record.name) is not None:
            store.delete_channel(record.name)
        else:  # deleted already; subscription records replayed since are dropped again
            subs = store.recover().subscriptions
            store.apply([DeleteSubscription(s.record.sub_id) for s in subs if s.record.channel == record.name])
    elif isinstance(record, Expire):
        store.expire(record.now_unix_ns)
    elif isinstance(record, Genesis | Epoch):
        pass  # about the log, not the store


def replay_at(store: Store, position: Position, seq: int, record: Record) -> None:
    """Do the log's record at `seq` to `store` (see `replay`), minding a deletion the position says
    may be done already; the position moves to `seq`."""
    if position.deleting is not None and seq < position.deleting[0]:
        left = without_channel(record, position.deleting[1])
        if left is not None:
            replay(store, left)
    elif isinstance(record, DeleteChannel):
        delete(store, position, seq, record)
    else:
        replay(store, record)
    position.applied = seq


def delete(store: Store, position: Position, seq: int, record: DeleteChannel) -> None:
    """Delete a channel for the log's record at `seq`: marked in the position before, the store
    flushed and the position saved past it after."""
    position.mark_delete(seq, record.name)
    replay(store, record)
    store.sync()
    position.applied = seq
    position.save(seq)


def without_channel(record: Record, channel: str) -> Record | None:
    """What of `record` concerns channels other than `channel` (None: nothing)."""
    if isinstance(record, Append) and channel in record.first_seqs:
        messages = tuple(m for m in record.messages if m.channel != channel)
        seqs = {name: first for name, first in record.first_seqs.items() if name != channel}
        return Append(record.now_unix_ns, seqs, messages) if messages else None
    if isinstance(record, CreateChannel | DeleteChannel) and record.name == channel:
        return None
    if isinstance(record, Apply):
        updates = tuple(
            u for u in record.updates if not (isinstance(u, SaveSubscription) and u.record.channel == channel)
        )
        return Apply(updates) if updates else None
    return record
