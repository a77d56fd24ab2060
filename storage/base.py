"""The `Store` interface that the server programs against, and the logic both stores share.

Durability contract (every implementation that says `recoverable = True`):
- `append` returns only after the batch is on disk (fsynced): the server sends PubAcks only then, so
  an acknowledged publish survives a crash of the process or of the machine. A store opened not to
  sync (`synced` false, an operator's choice) keeps the first half only: a committed batch survives
  a crash of the process, and reaches the disk at the next `sync()`.
- `apply` (subscription records, pending entries, last-sent positions) and client registrations are
  committed atomically per call but may be fsynced lazily: after a machine crash the last of these
  batches may be missing, which can only make the server redeliver a message, never lose one.
- A batch is all or nothing: after any error nothing of it is visible and everything committed
  before it is intact.

A store is used from one thread at a time per operation; it may be called from worker threads (the
LMDB store serialises writers and lets reads run beside them). It knows nothing of networks, timers
or delivery policy.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterable, Sequence
from typing import ClassVar, Self

import attrs

from storage.errors import ChannelNameConflictError, NameTooLongError, TooManyChannelsError, UnknownChannelError
from storage.limits import StoreLimits
from storage.records import (
    AppendResult,
    ChannelInfo,
    ClientRecord,
    DeleteClient,
    ExpireResult,
    Message,
    MessageToAppend,
    RecoveredState,
    SaveClient,
    SubUpdate,
)

# 2: the LMDB store's publish journal (a version-1 server would not replay it); 3: journal records
# keyed by the store (a version-2 server would not read them).
SCHEMA_VERSION = 3
# What the LMDB store checks when it opens (see storage.integrity): "background" is "quick" at open
# and "full" while the server already serves (`Store.check_fully`).
VERIFY_MODES = ("full", "background", "quick")
# Channel names and client IDs are keys in the LMDB store (at most 511 bytes there); 255 bytes is what
# nats-streaming-server's file store allows a channel (a directory name).
MAX_NAME_BYTES = 255


@attrs.frozen(slots=True)
class StoreStatistics:
    """Space used by the store; map sizes are 0 for stores without a memory map."""

    messages_used_bytes: int
    messages_map_size_bytes: int
    state_used_bytes: int
    state_map_size_bytes: int
    damaged_messages: int = 0  # found failing their checksum when read (each skipped, logged once)


class Store(abc.ABC):
    recoverable: ClassVar[bool]
    synced: bool = True  # every append is on disk when it returns (False: only after `sync()`)
    limits: StoreLimits

    def __init__(self, limits: StoreLimits) -> None:
        self.limits = limits
        self._channels: dict[str, ChannelInfo] = {}  # by lower-cased name
        self._folded: dict[str, str] = {}  # name -> lower-cased name, so lookups do not lower() each time

    # -- channels -----------------------------------------------------------------------------

    def channel_info(self, name: str) -> ChannelInfo | None:
        """The channel with exactly this name, or None. A case-only clash raises."""
        key = self._folded.get(name)
        if key is None:
            if len(self._folded) > 100_000:
                self._folded.clear()
            key = self._folded[name] = name.lower()
        info = self._channels.get(key)
        if info is not None and info.name != name:
            raise ChannelNameConflictError(name, info.name)
        return info

    def channels(self) -> list[ChannelInfo]:
        return sorted(self._channels.values(), key=lambda c: c.channel_id)

    def ensure_channel(self, name: str) -> ChannelInfo:
        """Look up a channel, creating it on first use (limits and case rules apply)."""
        return self.channel_info(name) or self._create_channel(name)

    def _may_create(self, name: str) -> ChannelInfo | None:
        """The channel if it appeared meanwhile, else None once creating it is allowed.

        Implementations call this again under their write lock, so two threads asking for the same
        new channel get one channel.
        """
        existing = self.channel_info(name)
        if existing is not None:
            return existing
        if not name:
            raise ValueError("channel name must not be empty")
        if len(name.encode()) > MAX_NAME_BYTES:
            raise NameTooLongError("channel name", MAX_NAME_BYTES)
        if self.limits.max_channels > 0 and len(self._channels) >= self.limits.max_channels:
            raise TooManyChannelsError()
        return None

    @abc.abstractmethod
    def _create_channel(self, name: str) -> ChannelInfo: ...

    @abc.abstractmethod
    def delete_channel(self, name: str) -> None:
        """Delete a channel, its messages and every subscription on it."""

    def _known(self, name: str) -> ChannelInfo:
        info = self.channel_info(name)
        if info is None:
            raise UnknownChannelError(name)
        return info

    # -- messages ------------------------------------------------------------------------------

    @abc.abstractmethod
    def append(self, messages: Sequence[MessageToAppend], now_unix_ns: int | None = None) -> AppendResult:
        """Store a batch in one transaction (group commit); channels must exist (`ensure_channel`).

        Timestamps are `now_unix_ns` (default: the wall clock) clamped so they never go backwards
        within a channel. Retention limits are applied in the same transaction.
        """

    @abc.abstractmethod
    def read(self, channel: str, start_seq: int, max_count: int) -> list[Message]:
        """Up to `max_count` stored messages with seq >= start_seq, in order (gaps skipped)."""

    def get(self, channel: str, seq: int) -> Message | None:
        found = self.read(channel, seq, 1)
        return found[0] if found and found[0].seq == seq else None

    def get_many(self, channel: str, seqs: Sequence[int]) -> list[Message | None]:
        """The messages at `seqs`, in that order (None where one is gone): for a redelivery pass,
        which picks scattered sequences. Stores with transactions read them all in one."""
        return [self.get(channel, seq) for seq in seqs]

    def first_seq_at_or_after(self, channel: str, timestamp_unix_ns: int) -> int:
        """First stored sequence whose timestamp is >= the given one; last_seq + 1 if none.

        Timestamps never decrease within a channel, so this is a binary search with no index, over
        "the first message stored at or after seq" (a repaired channel can have gaps; messages evicted
        while it searches are gaps too)."""
        info = self._known(channel)
        lo, hi = info.first_seq, info.last_seq + 1
        while lo < hi:
            mid = (lo + hi) // 2
            found = self.read(channel, mid, 1)
            if not found:
                hi = mid
            elif found[0].timestamp_unix_ns < timestamp_unix_ns:
                lo = found[0].seq + 1
            else:
                hi = mid
        found = self.read(channel, lo, 1)
        return found[0].seq if found else info.last_seq + 1

    @abc.abstractmethod
    def expire(self, now_unix_ns: int | None = None) -> ExpireResult:
        """Apply MaxAge to every channel (the age sweep)."""

    # -- subscriptions and clients -----------------------------------------------------------

    @abc.abstractmethod
    def new_subscription_id(self) -> int:
        """A subscription id never handed out before by this store."""

    @abc.abstractmethod
    def apply(self, updates: Iterable[SubUpdate]) -> None:
        """Apply subscription, last-sent, pending and client updates in one transaction, in order."""

    def register_client(self, client: ClientRecord) -> None:
        self.apply([SaveClient(client)])

    def unregister_client(self, client_id: str) -> None:
        self.apply([DeleteClient(client_id)])

    # -- lifecycle -------------------------------------------------------------------------------

    @abc.abstractmethod
    def recover(self) -> RecoveredState:
        """Everything needed to rebuild the server's state (what is stored now)."""

    @abc.abstractmethod
    def statistics(self) -> StoreStatistics: ...

    @property
    def unchecked(self) -> bool:
        """A full check of what the store held when it opened is still to run (`check_fully`)."""
        return False

    def check_fully(self) -> str | None:
        """Run the full check `unchecked` says is owed, while the store serves: None when everything is
        intact, else the damage found, in one line naming the file. Until it has run clean, a read
        that meets a damaged message returns only what comes before it and ends the check with that
        damage, so nothing past a damaged message is served."""
        return None

    def sync(self) -> None:  # noqa: B027 (a no-op is right for every store that syncs each commit)
        """Flush every commit so far to the disk; nothing to do for a store that syncs each one."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def now_or(now_unix_ns: int | None) -> int:
    return time.time_ns() if now_unix_ns is None else now_unix_ns
