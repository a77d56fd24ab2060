"""The in-memory store: the same contract as the LMDB store, lost when the process ends.

`recover()` still returns what it holds, so the delivery engine can be rebuilt from it within one
process (restart tests with a virtual clock use that).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence

import attrs

from storage.base import SCHEMA_VERSION, Store, StoreStatistics, now_or
from storage.codec import encode_head, value_size
from storage.limits import StoreLimits, plan_eviction
from storage.records import (
    AppendResult,
    ChannelInfo,
    ClearPending,
    ClearPendingRun,
    ClientRecord,
    DeleteClient,
    DeleteSubscription,
    ExpireResult,
    Message,
    MessageToAppend,
    RecoveredState,
    RecoveredSubscription,
    SaveClient,
    SaveSubscription,
    ServerInfo,
    SetLastSent,
    SetPending,
    SetPendingRun,
    SubscriptionRecord,
    SubUpdate,
)


@attrs.frozen(slots=True)
class _Stored:
    timestamp_unix_ns: int
    reply: str
    data: bytes
    size: int
    content_type: str = ""


class MemoryStore(Store):
    recoverable = False

    def __init__(self, cluster_id: str = "test-cluster", limits: StoreLimits | None = None) -> None:
        super().__init__(limits or StoreLimits())
        self._server = ServerInfo(cluster_id, SCHEMA_VERSION, time.time_ns())
        self._messages: dict[int, dict[int, _Stored]] = {}  # channel id -> seq -> message
        self._channel_ids = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._subs: dict[int, SubscriptionRecord] = {}
        self._pending: dict[int, dict[int, int]] = {}
        self._naks: dict[int, dict[int, int]] = {}  # sub id -> seq -> not before (ns), as SetPending wrote
        self._clients: dict[str, ClientRecord] = {}

    def _create_channel(self, name: str) -> ChannelInfo:
        existing = self._may_create(name)
        if existing is not None:
            return existing
        info = ChannelInfo(name=name, channel_id=next(self._channel_ids))
        self._channels[name.lower()] = info
        self._messages[info.channel_id] = {}
        return info

    def delete_channel(self, name: str) -> None:
        info = self._known(name)
        del self._channels[name.lower()]
        del self._messages[info.channel_id]
        for sub_id in [s.sub_id for s in self._subs.values() if s.channel == info.name]:
            self._delete_sub(sub_id)

    def append(self, messages: Sequence[MessageToAppend], now_unix_ns: int | None = None) -> AppendResult:
        now = now_or(now_unix_ns)
        infos = {m.channel: self._known(m.channel) for m in messages}
        heads = [encode_head(m.reply, m.content_type) for m in messages]  # validate all before changing anything
        # Every message of a channel in one batch gets the same timestamp (now, clamped), as in LMDB.
        next_seq = {name: info.last_seq + 1 for name, info in infos.items()}
        stamps = {name: max(now, info.last_timestamp_unix_ns) for name, info in infos.items()}
        added = dict.fromkeys(infos, 0)
        assigned: list[tuple[int, int]] = []
        for msg, head in zip(messages, heads, strict=True):
            name = msg.channel
            seq, ts = next_seq[name], stamps[name]
            next_seq[name] = seq + 1
            size = value_size(head, msg.data)
            self._messages[infos[name].channel_id][seq] = _Stored(ts, msg.reply, msg.data, size, msg.content_type)
            added[name] += size
            assigned.append((seq, ts))
        dropped: dict[str, range] = {}
        for name, info in infos.items():
            count = next_seq[name] - 1 - info.last_seq
            info = attrs.evolve(
                info,
                last_seq=next_seq[name] - 1,
                msgs=info.msgs + count,
                bytes=info.bytes + added[name],
                last_timestamp_unix_ns=stamps[name],
            )
            info, gone = self._evict(info, now)
            self._channels[name.lower()] = info
            if gone:
                dropped[name] = gone
        return AppendResult(assigned, dropped)

    def _evict(self, info: ChannelInfo, now: int) -> tuple[ChannelInfo, range]:
        stored = self._messages[info.channel_id]
        oldest = ((stored[s].size, stored[s].timestamp_unix_ns) for s in range(info.first_seq, info.last_seq + 1))
        count, freed = plan_eviction(self.limits.for_channel(info.name), info.msgs, info.bytes, oldest, now)
        gone = range(info.first_seq, info.first_seq + count)
        for seq in gone:
            del stored[seq]
        return attrs.evolve(info, first_seq=gone.stop, msgs=info.msgs - count, bytes=info.bytes - freed), gone

    def read(self, channel: str, start_seq: int, max_count: int) -> list[Message]:
        info = self._known(channel)
        stored = self._messages[info.channel_id]
        out: list[Message] = []
        for seq in range(max(start_seq, info.first_seq), info.last_seq + 1):
            if len(out) >= max_count:
                break
            m = stored.get(seq)
            if m is not None:
                out.append(Message(seq, m.timestamp_unix_ns, info.name, m.reply, m.data, m.content_type))
        return out

    def get(self, channel: str, seq: int) -> Message | None:
        info = self._known(channel)
        m = self._messages[info.channel_id].get(seq)
        return None if m is None else Message(seq, m.timestamp_unix_ns, info.name, m.reply, m.data, m.content_type)

    def expire(self, now_unix_ns: int | None = None) -> ExpireResult:
        now = now_or(now_unix_ns)
        dropped: dict[str, range] = {}
        next_expiry: int | None = None
        for key, info in list(self._channels.items()):
            max_age_ns = self.limits.for_channel(info.name).max_age_ns
            if max_age_ns <= 0:
                continue
            info, gone = self._evict(info, now)
            self._channels[key] = info
            if gone:
                dropped[info.name] = gone
            if info.msgs:
                due = self._messages[info.channel_id][info.first_seq].timestamp_unix_ns + max_age_ns
                next_expiry = due if next_expiry is None else min(next_expiry, due)
        return ExpireResult(dropped, next_expiry)

    def new_subscription_id(self) -> int:
        return next(self._sub_ids)

    def apply(self, updates: Iterable[SubUpdate]) -> None:
        pending, subs = self._pending, self._subs
        for update in updates:
            kind = type(update)
            if kind is SetPendingRun:
                assert isinstance(update, SetPendingRun)
                pending.setdefault(update.sub_id, {}).update(dict.fromkeys(update.seqs, 1))
            elif kind is ClearPendingRun:
                assert isinstance(update, ClearPendingRun)
                entries = pending.get(update.sub_id)
                if entries is not None:
                    for seq in update.seqs:
                        entries.pop(seq, None)
            elif kind is SetPending:
                assert isinstance(update, SetPending)
                entries = pending.get(update.sub_id)
                if entries is None:
                    entries = pending[update.sub_id] = {}
                entries[update.seq] = update.attempt
                if update.not_before_ns:
                    self._naks.setdefault(update.sub_id, {})[update.seq] = update.not_before_ns
                elif update.sub_id in self._naks:
                    self._naks[update.sub_id].pop(update.seq, None)
            elif kind is ClearPending:
                assert isinstance(update, ClearPending)
                entries = pending.get(update.sub_id)
                if entries is not None:
                    entries.pop(update.seq, None)
            elif kind is SetLastSent:
                assert isinstance(update, SetLastSent)
                record = subs.get(update.sub_id)
                if record is not None and record.last_sent != update.last_sent:
                    subs[update.sub_id] = attrs.evolve(record, last_sent=update.last_sent)
            elif kind is SaveSubscription:
                assert isinstance(update, SaveSubscription)
                subs[update.record.sub_id] = update.record
            elif kind is DeleteSubscription:
                assert isinstance(update, DeleteSubscription)
                self._delete_sub(update.sub_id)
            elif kind is SaveClient:
                assert isinstance(update, SaveClient)
                self._clients[update.record.client_id] = update.record
            elif kind is DeleteClient:
                assert isinstance(update, DeleteClient)
                self._clients.pop(update.client_id, None)

    def _delete_sub(self, sub_id: int) -> None:
        self._subs.pop(sub_id, None)
        self._pending.pop(sub_id, None)
        self._naks.pop(sub_id, None)

    def recover(self) -> RecoveredState:
        subs = []
        for sub_id, record in sorted(self._subs.items()):
            pending = dict(sorted(self._pending.get(sub_id, {}).items()))
            last_sent = max([record.last_sent, *pending])
            naks = {seq: ns for seq, ns in self._naks.get(sub_id, {}).items() if seq in pending}
            subs.append(RecoveredSubscription(attrs.evolve(record, last_sent=last_sent), pending, naks))
        return RecoveredState(self._server, self.channels(), list(self._clients.values()), subs)

    def statistics(self) -> StoreStatistics:
        used = sum(c.bytes for c in self._channels.values())
        return StoreStatistics(used, 0, 0, 0)

    def close(self) -> None:
        pass
