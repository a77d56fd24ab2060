"""Rebuilding the engine after a restart, from what the store recovered, through the engine's public
`restore_*` calls.

Subscriptions of registered clients come back online with every pending message due (flagged, before
any new message: `Engine.start` sends them first); durables of unknown clients or marked closed stay
offline; other subscriptions of unknown clients are dropped, and their queue group's live members
take their messages. An empty durable queue group comes back as its "shadow", holding its position
and pending messages for the members to come. A wildcard subscription comes back (or not) as one,
with each of its parts (one per channel it follows); a part whose channel is gone is dropped.
"""

from __future__ import annotations

from storage.base import Store
from storage.records import RecoveredState, RecoveredSubscription, SubscriptionRecord
from streaming.core.engine.engine import Engine
from streaming.core.engine.state import group_key

Naks = dict[int, tuple[float, int]]  # seq -> (seconds of a nak's delay left, its end in Unix ns)


def recover(store: Store, state: RecoveredState | None = None, wall_unix_ns: int = 0) -> Engine:
    """An engine holding what the store recovered (`state`, else the store's own `recover()`); call
    `start(now)` on it to send what is due. `wall_unix_ns`, the time now, tells how long the messages
    given back with a nak still wait (0: they do not)."""
    return rebuild(Engine(store), state if state is not None else store.recover(), wall_unix_ns)


def rebuild(engine: Engine, state: RecoveredState, wall_unix_ns: int = 0) -> Engine:
    """Fill a new engine with what the store recovered after a restart."""
    for client in state.clients:
        engine.add_client(client.client_id)
    channels = {c.name for c in state.channels}
    shadows: dict[tuple[str, str], list[tuple[SubscriptionRecord, dict[int, int], Naks | None]]] = {}

    def online(record: SubscriptionRecord) -> bool:
        return engine.has_client(record.client_id) and not record.is_closed

    def naks_of(recovered: RecoveredSubscription) -> Naks | None:
        return {seq: ((ns - wall_unix_ns) / 1e9, ns) for seq, ns in recovered.naks.items()} if wall_unix_ns else None

    parts: list[RecoveredSubscription] = []
    patterns: dict[int, str] = {}  # a wildcard subscription's id -> its pattern
    # Online wildcards first, so that a queue group's live members are there before its shadow.
    for recovered in sorted(state.subscriptions, key=lambda s: (not online(s.record), s.record.sub_id)):
        record = recovered.record
        if record.parent_id:
            parts.append(recovered)
        elif record.is_pattern:
            patterns[record.sub_id] = record.channel
            if (record.is_durable or online(record)) and engine.restore_wildcard(record, online=online(record)):
                continue
            engine.discard_recovered(record.sub_id)
    # The parts of wildcards that came back first, then what the others held goes to their groups.
    parts.sort(key=lambda s: (engine.wildcard(s.record.parent_id) is None, s.record.sub_id))
    for recovered in parts:
        record = recovered.record
        wild = engine.wildcard(record.parent_id)
        if record.channel not in channels:
            engine.discard_recovered(record.sub_id)
        elif wild is not None:
            engine.restore_part(wild, record, dict(recovered.pending), naks_of(recovered))
        elif record.queue_group and record.parent_id in patterns:
            engine.hand_part_to_group(patterns[record.parent_id], record, dict(recovered.pending))
        else:
            engine.discard_recovered(record.sub_id)
    # Online subscriptions first, so departed members' messages find the live members of their group.
    ordered = sorted(
        (s for s in state.subscriptions if not s.record.parent_id and not s.record.is_pattern),
        key=lambda s: (not online(s.record), s.record.sub_id),
    )
    for recovered in ordered:
        record, pending = recovered.record, dict(recovered.pending)
        is_online = online(record)
        naks = naks_of(recovered)
        if record.channel not in channels:
            engine.discard_recovered(record.sub_id)
        elif record.queue_group:
            key = group_key(record.durable_name, record.queue_group)
            if is_online:
                engine.restore(record, pending, engine.restore_group(record, key), online=True, naks=naks)
            elif record.is_durable:
                shadows.setdefault((record.channel, key), []).append((record, pending, naks))
            else:
                group = engine.group(record.channel, key)
                if group is not None and group.members:
                    # A non-durable member whose client is gone: its messages go to the others.
                    engine.hand_to_members(group, pending)
                engine.discard_recovered(record.sub_id)
        elif record.is_durable or is_online:
            engine.restore(record, pending, None, online=is_online, naks=naks)
        else:
            engine.discard_recovered(record.sub_id)
    for (channel, key), candidates in shadows.items():
        _restore_shadow(engine, channel, key, candidates)
    return engine


def _restore_shadow(
    engine: Engine,
    channel: str,
    key: str,
    candidates: list[tuple[SubscriptionRecord, dict[int, int], Naks | None]],
) -> None:
    """An empty durable group's state; several shadows merge into the one with the highest position
    (what waits for a nak's delay waits on in the one kept; merged in from the others, it is due)."""
    candidates.sort(key=lambda c: c[0].last_sent)
    record, pending, naks = candidates[-1]
    group = engine.group(channel, key)
    for other, other_pending, _ in candidates[:-1]:
        for seq, attempt in other_pending.items():
            if group is None or not any(seq in m.pending for m in group.members):
                pending[seq] = max(attempt, pending.get(seq, 0))
                engine.merge_pending(record.sub_id, seq, pending[seq])
        engine.discard_recovered(other.sub_id)
    if group is not None and group.members:
        # Members came back (live clients): the shadow's messages go to them.
        engine.hand_to_members(group, pending)
        group.last_sent = max(group.last_sent, record.last_sent)
        engine.discard_recovered(record.sub_id)
        return
    group = engine.restore_group(record, key)
    engine.restore_shadow(group, engine.restore(record, pending, group, online=False, naks=naks))
