"""The durable store: channels' message logs, subscription and client state, limits, recovery.

`open_store` is the one entry point the server uses; both stores satisfy the `Store` interface.
Importing this package loads only the state walk (storage.state_walk): every other name is imported
from its module on first use, so the engine and the client library (which need the records and errors
only) never pull in LMDB, and `streaming-server` forks its state file's walk before anything else of
the store is loaded.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storage.state_walk import WalkAhead

if TYPE_CHECKING:
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
    from storage.lmdb_store import LmdbStore
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

# Each name is loaded from its module at first use (PEP 562), so that `import storage` costs next to
# nothing: `streaming-server` forks the walk of its state file (storage.state_walk) before the store's
# records, codecs and LMDB are loaded, and the client library and the engine load only what they use.
# The names are those imported for type checkers above (tests/test_imports.py holds the two equal).
_WHERE = {
    "MAX_NAME_BYTES": "storage.base",
    "SCHEMA_VERSION": "storage.base",
    "VERIFY_MODES": "storage.base",
    "Store": "storage.base",
    "StoreStatistics": "storage.base",
    "ChannelError": "storage.errors",
    "ChannelNameConflictError": "storage.errors",
    "ClusterIdMismatchError": "storage.errors",
    "DamagedStoreError": "storage.errors",
    "DamageFoundError": "storage.errors",
    "IntegrityError": "storage.errors",
    "SchemaVersionError": "storage.errors",
    "StoreError": "storage.errors",
    "StoreFullError": "storage.errors",
    "StoreLockedError": "storage.errors",
    "StoreWriteError": "storage.errors",
    "TooManyChannelsError": "storage.errors",
    "UnknownChannelError": "storage.errors",
    "ChannelLimits": "storage.limits",
    "StoreLimits": "storage.limits",
    "MemoryStore": "storage.memory_store",
    "AppendResult": "storage.records",
    "ChannelInfo": "storage.records",
    "ClearPending": "storage.records",
    "ClearPendingRun": "storage.records",
    "ClientRecord": "storage.records",
    "DeleteClient": "storage.records",
    "DeleteSubscription": "storage.records",
    "ExpireResult": "storage.records",
    "Message": "storage.records",
    "MessageToAppend": "storage.records",
    "NewMessage": "storage.records",
    "RecoveredState": "storage.records",
    "RecoveredSubscription": "storage.records",
    "SaveClient": "storage.records",
    "SaveSubscription": "storage.records",
    "ServerInfo": "storage.records",
    "SetLastSent": "storage.records",
    "SetPending": "storage.records",
    "SetPendingRun": "storage.records",
    "StartPosition": "storage.records",
    "SubOptions": "storage.records",
    "SubscriptionRecord": "storage.records",
    "SubUpdate": "storage.records",
    "net_effect": "storage.records",
    "split_at": "storage.records",
    "LmdbStore": "storage.lmdb_store",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup finds it without this call
    return value


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
        from storage.memory_store import MemoryStore

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
    return WalkAhead(state_directory(directory))


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
