"""An LMDB environment as the store uses it: named databases, read and write transactions, and a map
that grows by itself.

The map size is always set. When a write hits MapFullError the transaction has already been aborted;
the map is grown once no transaction of this process is open (the resize gate) and the whole write
is retried, so callers never see it. Only the configured maximum, or a full disk, ends in an error.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from storage.errors import DamagedStoreError, IntegrityError, StoreError, StoreFullError, write_failed

T = TypeVar("T")
# What py-lmdb raises for a damaged file (pages that do not parse, a wrong version stamp).
DAMAGED = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.VersionMismatchError)
MiB = 1 << 20
DEFAULT_MAP_SIZE = 256 * MiB
DEFAULT_MAX_MAP_SIZE = 1 << 40


class _ResizeGate:
    """Many transactions at once, or one map resize alone (LMDB requires no open transaction).

    Every read and write passes it, so a transaction's way through is one plain lock taken twice, and
    a notification only when a resize waits for the last transaction to end (a context manager and
    a notification per transaction cost ~2.9 µs, six times LMDB's own begin and end)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # taken directly on the common path: the Condition's methods are Python
        self._cond = threading.Condition(self._lock)
        self._active = 0
        self._resizing = False

    def enter(self) -> None:
        """A transaction begins (after any resize under way)."""
        with self._lock:
            while self._resizing:
                self._cond.wait()
            self._active += 1

    def leave(self) -> None:
        """A transaction has ended."""
        with self._lock:
            self._active -= 1
            if self._resizing and not self._active:
                self._cond.notify_all()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._active:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


class Environment:
    """One LMDB environment with its named databases, write lock and resize gate."""

    def __init__(self, path: Path, names: Sequence[str], map_size: int, max_map_size: int, **flags: Any) -> None:
        self.path = path
        self.max_map_size = max_map_size
        path.mkdir(parents=True, exist_ok=True)
        try:
            self.env = lmdb.open(str(path), map_size=map_size, max_dbs=len(names), **flags)
        except lmdb.Error as exc:
            # LMDB reports a mangled meta page with a plain Error ("data format ... not supported").
            if isinstance(exc, DAMAGED) or (path / "data.mdb").exists():
                raise DamagedStoreError(f"{path / 'data.mdb'} is damaged or not an LMDB file ({exc})") from exc
            raise StoreError(f"{path}: cannot open the LMDB environment ({exc})") from exc
        try:
            # The main database holds only the named ones: a name the store never makes is a damaged
            # one, and opening would make the real one anew, empty, and leave its entries unread.
            with self.env.begin() as txn:
                strange = [
                    k
                    for k in map(bytes, txn.cursor().iternext(values=False))
                    if k.decode(errors="replace") not in names
                ]
            if strange:
                self.env.close()
                raise DamagedStoreError(
                    f"{path / 'data.mdb'} is damaged: it holds a database named {strange[0]!r}, which the store "
                    f"never makes (a damaged name), and would lose what that database holds"
                )
            self.dbs = {name: self.env.open_db(name.encode()) for name in names}
        except lmdb.Error as exc:
            self.env.close()
            if isinstance(exc, DAMAGED):
                raise DamagedStoreError(f"{path / 'data.mdb'} is damaged ({exc})") from exc
            raise self._write_error(exc) from exc
        self.gate = _ResizeGate()
        self.write_lock = threading.Lock()

    def read(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        gate = self.gate
        gate.enter()
        try:
            with self.env.begin() as txn:
                return fn(txn)
        except DAMAGED as exc:
            raise IntegrityError(f"{self.path}: the LMDB file is damaged ({exc})") from exc
        finally:
            gate.leave()

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run `fn` in one write transaction and commit; retried whole after growing a full map.

        Callers hold `write_lock` and change in-memory mirrors only after this returns.
        """
        gate = self.gate
        while True:
            gate.enter()
            try:
                with self.env.begin(write=True) as txn:
                    return fn(txn)
            except lmdb.MapFullError:
                pass  # grown below, once out of the gate: a resize waits for every transaction to end
            except DAMAGED as exc:
                raise IntegrityError(f"{self.path}: the LMDB file is damaged ({exc})") from exc
            except lmdb.Error as exc:
                raise self._write_error(exc) from exc
            finally:
                gate.leave()
            self._grow()

    def _grow(self) -> None:
        with self.gate.exclusive():
            current = self.env.info()["map_size"]
            if current >= self.max_map_size:
                raise StoreFullError(f"{self.path}: the store reached its maximum size of {self.max_map_size} bytes")
            self.env.set_mapsize(min(current * 2, self.max_map_size))

    def _write_error(self, exc: lmdb.Error) -> StoreError:
        return write_failed(self.path, exc)

    def used_bytes(self) -> int:
        info, stat = self.env.info(), self.env.stat()
        return int((info["last_pgno"] + 1) * stat["psize"])

    def map_size(self) -> int:
        return int(self.env.info()["map_size"])

    def sync(self) -> None:
        """Flush every commit so far to the disk (for an environment opened with sync=False)."""
        try:
            with self.gate.shared():
                self.env.sync(True)
        except lmdb.Error as exc:
            raise self._write_error(exc) from exc

    def close(self) -> None:
        self.env.close()


def delete_prefix(cursor: lmdb.Cursor, prefix: bytes) -> None:
    """Delete every key starting with `prefix` (keys are prefixed by a channel or subscription id)."""
    if cursor.set_range(prefix):
        while cursor.key()[: len(prefix)] == prefix:
            if not cursor.delete():
                break


def put_again(txn: lmdb.Transaction, key: bytes, value: bytes, db: lmdb._Database) -> None:
    """Store `value` under a key that may have been written earlier in the same transaction. LMDB
    rewrites a value it keeps on overflow pages of its own (one of more than ~2 KB), written earlier in
    the transaction, in place, whatever the new value's length, keeping the pages' count: legal for
    LMDB, but the structure walk (py-lmdb's verifier) reports such a run as damage, and the store would
    then refuse its own healthy file. Deleting the old value first makes LMDB store the new one afresh.
    For records written seldom (subscriptions, clients): it costs a delete each."""
    txn.delete(key, db=db)
    txn.put(key, value, db=db)
