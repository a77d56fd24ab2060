"""The active member's store: every change is appended to the group's replicated log first, and done to
the local LMDB store only once the log has taken it (a quorum of JetStream replicas holds it), so the
local store is always a prefix of the log and whatever a client was told is done is in the log.

It is a `storage.Store`, so the engine, the commit pipeline and the doors run on it unchanged: a
publish batch's PubAcks wait for its append here as they wait for the fsync of a single server. The
log is the durable copy; the local store is a materialisation of it, flushed every `sync()` with the
log position it holds (see `streaming.ft.position`), and rebuilt from the log when lost.

When the log refuses a record (another member took over and fenced this one; or the log could not be
written within the lease), the call raises `NotActiveError`, nothing of it is done locally, every later
change is refused the same way, and `on_lost` tells the group to stop serving.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from storage import AppendResult, ChannelInfo, ExpireResult, Message, Store, StoreError, StoreStatistics, SubUpdate
from storage.records import MessageToAppend, RecoveredState
from streaming.ft import oplog
from streaming.ft.position import Position
from streaming.ft.replay import delete


class NotActiveError(StoreError):
    """This member may no longer change the group's data (it was fenced, or the log could not take a
    record within its lease): it stops serving; nothing of the refused change was done."""


class LogWriter(Protocol):
    """The group's log as the active writes it."""

    @property
    def max_record(self) -> int:
        """Bytes a record may have."""
        ...

    def append(self, record: bytes) -> int:
        """Append after the last record this writer knows of; its log sequence once a quorum holds it.
        NotActiveError when the log refuses it or cannot be reached within the lease."""
        ...


class ReplicatedStore(Store):
    recoverable = True
    synced = False  # the local copy is flushed by `sync()` (the log is the durable copy)

    def __init__(
        self,
        inner: Store,
        log: LogWriter,
        position: Position,
        *,
        on_lost: Callable[[NotActiveError], None] = lambda exc: None,
    ) -> None:
        super().__init__(inner.limits)
        self.inner = inner
        self.log = log
        self.position = position
        self.on_lost = on_lost
        self.lost: NotActiveError | None = None
        # Log order must be local order: one change at a time, from the log append to the local commit.
        self._lock = threading.Lock()

    def _write(self, record: oplog.Record, raw: bytes | None = None) -> int:
        """Append `record` (encoded: `raw`) to the log, before the caller does it locally, under the
        same lock."""
        if self.lost is not None:
            raise NotActiveError(str(self.lost))
        try:
            seq = self.log.append(oplog.encode(record) if raw is None else raw)
        except NotActiveError as exc:
            self.lost = exc
            self.on_lost(exc)
            raise
        self.position.applied = seq
        return seq

    # -- changes: the log first -------------------------------------------------------------------

    def ensure_channel(self, name: str) -> ChannelInfo:
        info = self.inner.channel_info(name)
        if info is not None:
            return info
        with self._lock:
            existing = self.inner._may_create(name)  # the store's own checks, before the log hears of it
            if existing is not None:
                return existing
            self._write(oplog.CreateChannel(name))
            return self.inner.ensure_channel(name)

    def _create_channel(self, name: str) -> ChannelInfo:  # pragma: no cover - ensure_channel is overridden
        return self.ensure_channel(name)

    def delete_channel(self, name: str) -> None:
        with self._lock:
            record = oplog.DeleteChannel(name)
            delete(self.inner, self.position, self._write(record), record)

    def append(self, messages: Sequence[MessageToAppend], now_unix_ns: int | None = None) -> AppendResult:
        now = time.time_ns() if now_unix_ns is None else now_unix_ns
        assigned: list[tuple[int, int]] = []
        dropped: dict[str, range] = {}
        with self._lock:
            for chunk in self._chunks(messages):
                result = self._append_chunk(chunk, now)
                assigned += result.assigned
                for channel, seqs in result.dropped.items():
                    before = dropped.get(channel)
                    dropped[channel] = seqs if before is None else range(before.start, seqs.stop)
        return AppendResult(assigned, dropped)

    def _append_chunk(self, messages: Sequence[MessageToAppend], now: int) -> AppendResult:
        first_seqs: dict[str, int] = {}
        for m in messages:
            if m.channel not in first_seqs:
                first_seqs[m.channel] = self.inner._known(m.channel).last_seq + 1
        self._write(oplog.append_record(messages, now, first_seqs))
        return self.inner.append(messages, now_unix_ns=now)

    def _chunks(self, messages: Sequence[MessageToAppend]) -> Iterable[Sequence[MessageToAppend]]:
        """Runs of `messages` whose records fit the log's record size (a batch of the group commit can
        be larger); each is an append of its own, in order."""
        limit = self.log.max_record - 1024
        start, size = 0, 0
        for i, m in enumerate(messages):
            cost = len(m.data) + len(m.reply) + len(m.content_type) + len(m.channel) + 32
            if size + cost > limit and i > start:
                yield messages[start:i]
                start, size = i, 0
            size += cost
        if start < len(messages):
            yield messages[start:]

    def expire(self, now_unix_ns: int | None = None) -> ExpireResult:
        now = time.time_ns() if now_unix_ns is None else now_unix_ns
        with self._lock:
            if not self._would_expire(now):
                return self.inner.expire(now)  # nothing to drop: no record (the sweep runs often)
            self._write(oplog.Expire(now))
            return self.inner.expire(now)

    def _would_expire(self, now: int) -> bool:
        for info in self.inner.channels():
            max_age = self.inner.limits.for_channel(info.name).max_age_ns
            if max_age and info.msgs:
                oldest = self.inner.read(info.name, info.first_seq, 1)
                if oldest and oldest[0].timestamp_unix_ns + max_age <= now:
                    return True
        return False

    def apply(self, updates: Iterable[SubUpdate]) -> None:
        batch = tuple(updates)
        if not batch:
            return
        with self._lock:
            for part, raw in self._parts(batch):
                self._write(part, raw)
                self.inner.apply(part.updates)

    def _parts(self, batch: tuple[SubUpdate, ...]) -> list[tuple[oplog.Apply, bytes]]:
        """`batch` as one record, or as several in order when it is larger than a record may be (the
        store's own slices on the event loop are not one transaction either)."""
        whole = oplog.Apply(batch)
        raw = oplog.encode(whole)
        if len(batch) == 1 or len(raw) <= self.log.max_record - 1024:
            return [(whole, raw)]
        half = len(batch) // 2
        return self._parts(batch[:half]) + self._parts(batch[half:])

    # -- reads and the rest: the local copy --------------------------------------------------------

    def channel_info(self, name: str) -> ChannelInfo | None:
        return self.inner.channel_info(name)

    def channels(self) -> list[ChannelInfo]:
        return self.inner.channels()

    def read(self, channel: str, start_seq: int, max_count: int) -> list[Message]:
        return self.inner.read(channel, start_seq, max_count)

    def get(self, channel: str, seq: int) -> Message | None:
        return self.inner.get(channel, seq)

    def get_many(self, channel: str, seqs: Sequence[int]) -> list[Message | None]:
        return self.inner.get_many(channel, seqs)

    def first_seq_at_or_after(self, channel: str, timestamp_unix_ns: int) -> int:
        return self.inner.first_seq_at_or_after(channel, timestamp_unix_ns)

    def new_subscription_id(self) -> int:
        return self.inner.new_subscription_id()

    def recover(self) -> RecoveredState:
        return self.inner.recover()

    def statistics(self) -> StoreStatistics:
        return self.inner.statistics()

    def sync(self) -> None:
        """Flush the local copy, then save the log position it holds (never ahead of what is on disk)."""
        with self._lock:
            applied = self.position.applied
        self.inner.sync()
        self.position.save(applied)

    def close(self) -> None:
        try:
            self.sync()
        finally:
            self.inner.close()  # whatever the flush did: the environment must never stay open twice
