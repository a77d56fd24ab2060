"""Rebuilding the engine after a restart, from what the store recovered.

Subscriptions of registered clients come back online with every pending message due (flagged, before
any new message: `Engine.start` sends them first); durables of unknown clients or marked closed stay
offline; other subscriptions of unknown clients are dropped, and their queue group's live members
take their messages. An empty durable queue group comes back as its "shadow", holding its position
and pending messages for the members to come.
"""

from __future__ import annotations

import attrs

from storage.records import DeleteSubscription, RecoveredState, SetPending, SubscriptionRecord
from streaming.core.engine.engine import Engine
from streaming.core.engine.events import Reason
from streaming.core.engine.groups import Group, group_key
from streaming.core.engine.state import Sub


def rebuild(engine: Engine, state: RecoveredState) -> Engine:
    """Fill a new engine with what the store recovered after a restart.

    Subscriptions of registered clients come back online with every pending message due (flagged,
    before any new message); durables of unknown clients or marked closed stay offline; other
    subscriptions of unknown clients are dropped. Call `start(now)` to send what is due.
    """
    for client in state.clients:
        engine.add_client(client.client_id)
    channels = {c.name for c in state.channels}
    shadows: dict[tuple[str, str], list[tuple[SubscriptionRecord, dict[int, int]]]] = {}

    def online(record: SubscriptionRecord) -> bool:
        return record.client_id in engine._clients and not record.is_closed

    # Online subscriptions first, so departed members' messages find the live members of their group.
    ordered = sorted(state.subscriptions, key=lambda s: (not online(s.record), s.record.sub_id))
    for recovered in ordered:
        record, pending = recovered.record, dict(recovered.pending)
        is_online = online(record)
        if record.channel not in channels:
            engine._updates.append(DeleteSubscription(record.sub_id))
        elif record.queue_group:
            key = group_key(record.durable_name, record.queue_group)
            if is_online:
                _restore(engine, record, pending, _restore_group(engine, record, key), online=True)
            elif record.is_durable:
                shadows.setdefault((record.channel, key), []).append((record, pending))
            else:
                group = engine._groups.get(record.channel, {}).get(key)
                if group is not None and group.members:
                    # A non-durable member whose client is gone: its messages go to the others.
                    engine._distribute(group, sorted(pending.items()), Reason.RESTART)
                engine._updates.append(DeleteSubscription(record.sub_id))
        elif record.is_durable or is_online:
            _restore(engine, record, pending, None, online=is_online)
        else:
            engine._updates.append(DeleteSubscription(record.sub_id))
    for (channel, key), candidates in shadows.items():
        _restore_shadow(engine, channel, key, candidates)
    return engine


def _restore_group(engine: Engine, record: SubscriptionRecord, key: str) -> Group:
    groups = engine._groups.setdefault(record.channel, {})
    group = groups.get(key)
    if group is None:
        group = groups[key] = Group(record.channel, key, record.is_durable, record.last_sent)
    group.last_sent = max(group.last_sent, record.last_sent)
    return group


def _restore_shadow(
    engine: Engine, channel: str, key: str, candidates: list[tuple[SubscriptionRecord, dict[int, int]]]
) -> None:
    """An empty durable group's state; several shadows merge into the one with the highest position."""
    candidates.sort(key=lambda c: c[0].last_sent)
    record, pending = candidates[-1]
    group = engine._groups.get(channel, {}).get(key)
    for other, other_pending in candidates[:-1]:
        for seq, attempt in other_pending.items():
            if group is None or not any(seq in m.pending for m in group.members):
                pending[seq] = max(attempt, pending.get(seq, 0))
                engine._updates.append(SetPending(record.sub_id, seq, pending[seq]))
        engine._updates.append(DeleteSubscription(other.sub_id))
    if group is not None and group.members:
        # Members came back (live clients): the shadow's messages go to them.
        engine._distribute(group, sorted(pending.items()), Reason.RESTART)
        group.last_sent = max(group.last_sent, record.last_sent)
        engine._updates.append(DeleteSubscription(record.sub_id))
        return
    group = _restore_group(engine, record, key)
    sub = _restore(engine, record, pending, group, online=False)
    group.members.remove(sub)
    group.shadow = sub


def _restore(
    engine: Engine, record: SubscriptionRecord, pending: dict[int, int], group: Group | None, *, online: bool
) -> Sub:
    record = attrs.evolve(record, is_closed=not online)
    sub = Sub(record, group, online)
    for seq in sorted(pending):
        sub.pending.add_due(seq, pending[seq], Reason.RESTART)
    engine._add(sub)
    if record.is_durable and not record.queue_group:
        engine._durables[(record.client_id, record.channel, record.durable_name)] = sub
    if group is not None:
        group.members.append(sub)
    if online:
        engine._by_ack_inbox[record.ack_inbox] = record.sub_id
        engine._clients[record.client_id].subs.add(record.sub_id)
        if group is None:
            engine._plain.setdefault(record.channel, {})[record.sub_id] = sub
    return sub
