"""The durable store: channels' message logs, subscription and client state, limits, recovery.

`open_store` is the one entry point the server uses; both stores satisfy the `Store` interface.
Importing this package does not load LMDB: `LmdbStore` is imported on first use, so the engine and
the client library (which need the records and errors only) never pull it in.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storage.base import MAX_NAME_BYTES, SCHEMA_VERSION, VERIFY_MODES, Store, StoreStatistics
from storage.errors import (
    ChannelError,
    ChannelNameConflictError,
    ClusterIdMismatchError,
    DamagedStoreError,
    DamageFoundError,
    IntegrityError,
    SchemaVersionError,
    StoreError,
    StoreFullError,
    StoreLockedError,
    StoreWriteError,
    TooManyChannelsError,
    UnknownChannelError,
)
from storage.limits import ChannelLimits, StoreLimits
from storage.memory_store import MemoryStore
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
    NewMessage,
    RecoveredState,
    RecoveredSubscription,
    SaveClient,
    SaveSubscription,
    ServerInfo,
    SetLastSent,
    SetPending,
    SetPendingRun,
    StartPosition,
    SubOptions,
    SubscriptionRecord,
    SubUpdate,
    net_effect,
    split_at,
)

if TYPE_CHECKING:
    from storage.integrity import WalkAhead
    from storage.lmdb_store import LmdbStore


def __getattr__(name: str) -> Any:
    if name == "LmdbStore":
        # By name, at first use: a static import here would load LMDB with every `import storage`.
        return importlib.import_module("storage.lmdb_store").LmdbStore
    raise AttributeError(f"module 'storage' has no attribute {name!r}")


def open_store(
    kind: str,
    directory: str | Path | None,
    cluster_id: str,
    limits: StoreLimits | None = None,
    *,
    sync: bool = True,
    verify: str = "full",
    state_walk: WalkAhead | None = None,
) -> Store:
    """Open the store the configuration names: "lmdb" (needs a directory; `sync=False`: no fsync per
    commit; `verify`: what is checked at open, see lmdb_store; `state_walk`: its state file's structure
    walk, begun earlier by `walk_ahead`) or "memory"."""
    if kind == "memory":
        return MemoryStore(cluster_id, limits)
    if kind == "lmdb":
        if directory is None:
            raise ValueError("the lmdb store needs a data directory")
        lmdb_store: Any = importlib.import_module("storage.lmdb_store")
        store: Store = lmdb_store.LmdbStore(
            directory, cluster_id, limits, sync=sync, verify=verify, state_walk=state_walk
        )
        return store
    raise ValueError(f"unknown store kind {kind!r} (expected 'lmdb' or 'memory')")


def walk_ahead(directory: str | Path) -> WalkAhead:
    """Begin the structure walk of the LMDB store's state file in `directory` on another core, for
    `open_store` to use (a forked child: call it before any thread exists)."""
    integrity: Any = importlib.import_module("storage.integrity")
    walk: WalkAhead = integrity.WalkAhead(state_directory(directory))
    return walk


def state_directory(directory: str | Path) -> Path:
    """Where the LMDB store in `directory` keeps its state file (what `walk_ahead` walks)."""
    return Path(directory) / "state"


__all__ = [
    "MAX_NAME_BYTES",
    "SCHEMA_VERSION",
    "VERIFY_MODES",
    "AppendResult",
    "ChannelError",
    "ChannelInfo",
    "ChannelLimits",
    "ChannelNameConflictError",
    "ClearPending",
    "ClearPendingRun",
    "ClientRecord",
    "ClusterIdMismatchError",
    "DeleteClient",
    "DamagedStoreError",
    "DamageFoundError",
    "DeleteSubscription",
    "ExpireResult",
    "IntegrityError",
    "LmdbStore",
    "MemoryStore",
    "Message",
    "MessageToAppend",
    "NewMessage",
    "RecoveredState",
    "RecoveredSubscription",
    "SaveClient",
    "SaveSubscription",
    "SchemaVersionError",
    "ServerInfo",
    "SetLastSent",
    "SetPending",
    "SetPendingRun",
    "StartPosition",
    "Store",
    "StoreError",
    "StoreFullError",
    "StoreLimits",
    "StoreLockedError",
    "StoreStatistics",
    "StoreWriteError",
    "SubOptions",
    "SubUpdate",
    "SubscriptionRecord",
    "TooManyChannelsError",
    "UnknownChannelError",
    "net_effect",
    "split_at",
    "open_store",
    "state_directory",
    "walk_ahead",
]
