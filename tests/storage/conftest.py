"""Fixtures that give the contract suite a store of each kind, and a way to reopen it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import LmdbStore, MemoryStore, Store, StoreLimits


class StoreMaker:
    """Makes stores of one kind in one directory, reopens them, and closes them all at the end."""

    def __init__(self, kind: str, directory: Path) -> None:
        self.kind = kind
        self.directory = directory
        self.opened: list[Store] = []

    @property
    def recoverable(self) -> bool:
        return self.kind != "memory"

    def __call__(self, limits: StoreLimits | None = None, cluster_id: str = "test-cluster") -> Store:
        store: Store
        if self.kind == "memory":
            store = MemoryStore(cluster_id, limits)
        else:
            store = LmdbStore(self.directory, cluster_id, limits, sync=self.kind == "lmdb")
        self.opened.append(store)
        return store

    def reopen(self, store: Store, limits: StoreLimits | None = None) -> Store:
        """A restart: close the store and open its directory again (LMDB only)."""
        assert self.recoverable, "only a recoverable store can be reopened"
        cluster_id = store.recover().server.cluster_id
        store.close()
        return self(limits or store.limits, cluster_id)

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


@pytest.fixture(params=["memory", "lmdb", "lmdb_nosync"])  # lmdb_nosync: `file_sync = false`
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreMaker]:
    maker = StoreMaker(request.param, tmp_path / "data")
    yield maker
    maker.close_all()
