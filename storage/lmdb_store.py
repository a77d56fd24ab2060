"""The LMDB store: a durable message log per channel plus subscription and client state.

Layout of a data directory:

    LOCK      exclusive flock held by the server process (see dirlock.py)
    msgs/     LMDB environment, fully synced: meta, channels, messages (key: channel id, seq)
    state/    LMDB environment, synced once per commit without the extra meta-page sync: meta,
              subscriptions, last-sent positions, pending entries (key: sub id, seq), clients

Why two environments: LMDB has one writer per environment, and the publish path (group commit, two
fsyncs per batch so a PubAck is never sent for something a power cut could take back) must not queue
behind acknowledgement bookkeeping, nor the other way round. The state environment uses
`metasync=False`: integrity is kept and a machine crash can undo at most the last state commit,
which only causes a redelivery (see the durability contract in base.py).

Pending entries reference sequences that were appended (and fsynced) before they were delivered,
so the two environments never need a transaction across both.

`sync=False` (the server's `file_sync = false`, as nats-streaming-server's flag) opens both
environments without any fsync on commit (MDB_NOSYNC); `sync()` flushes them, which the server does
every `sync_interval` and at close. A crash of the server process loses nothing committed (the page
cache has it); a crash of the machine loses what was committed since the last flush and, since LMDB
then relies on the filesystem keeping the order of writes, can leave the store damaged.

The map size is always set. When a write hits MapFullError the transaction has already been aborted;
the map is grown once no transaction of this process is open (the resize gate) and the whole write
is retried, so callers never see it. Only the configured maximum, or a full disk, ends in an error.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import attrs
import lmdb

from storage.base import SCHEMA_VERSION, Store, StoreStatistics, now_or
from storage.codec import (
    MSG_KEY,
    PENDING_KEY,
    U32,
    U64,
    decode_channel,
    decode_message,
    decode_record,
    encode_channel,
    encode_record,
    encode_reply,
    encode_run,
    message_timestamp,
)
from storage.dirlock import DirectoryLock
from storage.errors import (
    ClusterIdMismatchError,
    IntegrityError,
    SchemaVersionError,
    StoreError,
    StoreFullError,
    StoreWriteError,
)
from storage.limits import StoreLimits, plan_eviction
from storage.records import (
    AppendResult,
    ChannelInfo,
    ClearPending,
    ClientRecord,
    DeleteSubscription,
    ExpireResult,
    Message,
    NewMessage,
    RecoveredState,
    RecoveredSubscription,
    SaveSubscription,
    ServerInfo,
    SetLastSent,
    SetPending,
    SubscriptionRecord,
    SubUpdate,
)

T = TypeVar("T")
MiB = 1 << 20
DEFAULT_MAP_SIZE = 256 * MiB
DEFAULT_MAX_MAP_SIZE = 1 << 40
_LOW_DISK_BYTES = 64 * MiB
_DAMAGED = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.VersionMismatchError)


class _ResizeGate:
    """Many transactions at once, or one map resize alone (LMDB requires no open transaction)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._resizing = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

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


class _Env:
    """One LMDB environment with its named databases, write lock and resize gate."""

    def __init__(self, path: Path, names: Sequence[str], map_size: int, max_map_size: int, **flags: Any) -> None:
        self.path = path
        self.max_map_size = max_map_size
        path.mkdir(parents=True, exist_ok=True)
        try:
            self.env = lmdb.open(str(path), map_size=map_size, max_dbs=len(names), **flags)
        except lmdb.Error as exc:
            # LMDB reports a mangled meta page with a plain Error ("data format ... not supported").
            if isinstance(exc, _DAMAGED) or (path / "data.mdb").exists():
                raise IntegrityError(f"{path}: the LMDB file is damaged or not an LMDB file ({exc})") from exc
            raise StoreError(f"{path}: cannot open the LMDB environment ({exc})") from exc
        self.dbs = {name: self.env.open_db(name.encode()) for name in names}
        self.gate = _ResizeGate()
        self.write_lock = threading.Lock()

    def read(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        with self.gate.shared():
            try:
                with self.env.begin() as txn:
                    return fn(txn)
            except _DAMAGED as exc:
                raise IntegrityError(f"{self.path}: the LMDB file is damaged ({exc})") from exc

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run `fn` in one write transaction and commit; retried whole after growing a full map.

        Callers hold `write_lock` and change in-memory mirrors only after this returns.
        """
        while True:
            try:
                with self.gate.shared(), self.env.begin(write=True) as txn:
                    return fn(txn)
            except lmdb.MapFullError:
                self._grow()
            except _DAMAGED as exc:
                raise IntegrityError(f"{self.path}: the LMDB file is damaged ({exc})") from exc
            except lmdb.Error as exc:
                raise self._write_error(exc) from exc

    def _grow(self) -> None:
        with self.gate.exclusive():
            current = self.env.info()["map_size"]
            if current >= self.max_map_size:
                raise StoreFullError(f"{self.path}: the store reached its maximum size of {self.max_map_size} bytes")
            self.env.set_mapsize(min(current * 2, self.max_map_size))

    def _write_error(self, exc: lmdb.Error) -> StoreError:
        try:
            st = os.statvfs(self.path)
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = -1
        # LMDB reports a short write as EIO, so the disk's free space is what tells "full" apart.
        if 0 <= free < _LOW_DISK_BYTES:
            return StoreFullError(
                f"{self.path}: disk full ({free} bytes free): the write failed ({exc}); "
                "everything committed before is intact"
            )
        return StoreWriteError(
            f"{self.path}: the write failed ({exc}; {free} bytes free on that filesystem); "
            "everything committed before is intact"
        )

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


class LmdbStore(Store):
    recoverable = True

    def __init__(
        self,
        directory: str | os.PathLike[str],
        cluster_id: str = "test-cluster",
        limits: StoreLimits | None = None,
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = DEFAULT_MAX_MAP_SIZE,
        sync: bool = True,
    ) -> None:
        super().__init__(limits or StoreLimits())
        self.synced = sync
        self.path = Path(directory)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = DirectoryLock(self.path)
        self._lock.acquire()
        self._envs: list[_Env] = []
        try:
            self._msgs = self._open_env("msgs", ["meta", "channels", "messages"], map_size, max_map_size, sync=sync)
            self._state = self._open_env(
                "state",
                ["meta", "subs", "lastsent", "pending", "clients"],
                map_size,
                max_map_size,
                metasync=False,
                sync=sync,
            )
            self._server = self._check_meta(cluster_id)
            self._load_channels()
            self._next_sub_id = self._state.read(self._highest_sub_id) + 1
            self._next_channel_id = 1 + max((c.channel_id for c in self._channels.values()), default=0)
            self._next_channel_id = max(self._next_channel_id, self._msgs.read(self._stored_next_channel_id))
        except BaseException:
            self.close()
            raise

    def _open_env(self, name: str, dbs: Sequence[str], map_size: int, max_map_size: int, **flags: Any) -> _Env:
        env = _Env(self.path / name, dbs, map_size, max_map_size, **flags)
        self._envs.append(env)
        return env

    # -- opening -------------------------------------------------------------------------------

    def _check_meta(self, cluster_id: str) -> ServerInfo:
        for env in (self._msgs, self._state):
            found = env.read(partial(_get_meta, db=env.dbs["meta"], key=b"schema_version"))
            if found is not None and U32.unpack(found)[0] > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{env.path} was written with store schema version {U32.unpack(found)[0]}, newer than "
                    f"the {SCHEMA_VERSION} this server supports: upgrade the server to open it"
                )

        meta = self._msgs.dbs["meta"]

        def check(txn: lmdb.Transaction) -> ServerInfo:
            stored, created = txn.get(b"cluster_id", db=meta), txn.get(b"created_unix_ns", db=meta)
            if stored is None or created is None:
                raise IntegrityError(f"{self._msgs.path}: the server record is incomplete")
            if bytes(stored).decode() != cluster_id:
                raise ClusterIdMismatchError(cluster_id, bytes(stored).decode(), str(self.path))
            return ServerInfo(cluster_id, SCHEMA_VERSION, U64.unpack(created)[0])

        # Opening writes only what is missing, so a store on a full disk still opens and recovers.
        with self._msgs.write_lock:
            if self._msgs.read(lambda txn: txn.get(b"cluster_id", db=meta)) is None:
                return self._first_open(cluster_id)
            return self._msgs.read(check)

    def _first_open(self, cluster_id: str) -> ServerInfo:
        created = time.time_ns()

        def init(txn: lmdb.Transaction) -> None:
            meta = self._msgs.dbs["meta"]
            txn.put(b"cluster_id", cluster_id.encode(), db=meta)
            txn.put(b"created_unix_ns", U64.pack(created), db=meta)
            txn.put(b"schema_version", U32.pack(SCHEMA_VERSION), db=meta)

        self._state.write(lambda txn: txn.put(b"schema_version", U32.pack(SCHEMA_VERSION), db=self._state.dbs["meta"]))
        self._msgs.write(init)
        return ServerInfo(cluster_id, SCHEMA_VERSION, created)

    def _load_channels(self) -> None:
        def load(txn: lmdb.Transaction) -> list[ChannelInfo]:
            return [decode_channel(v) for v in txn.cursor(db=self._msgs.dbs["channels"]).iternext(keys=False)]

        self._channels = {info.name.lower(): info for info in self._msgs.read(load)}

    def _highest_sub_id(self, txn: lmdb.Transaction) -> int:
        stored = txn.get(b"next_sub_id", db=self._state.dbs["meta"])
        highest = U64.unpack(stored)[0] - 1 if stored else 0
        cursor = txn.cursor(db=self._state.dbs["subs"])
        if cursor.last():
            highest = max(highest, U64.unpack(cursor.key())[0])
        return highest

    def _stored_next_channel_id(self, txn: lmdb.Transaction) -> int:
        stored = txn.get(b"next_channel_id", db=self._msgs.dbs["meta"])
        return U32.unpack(stored)[0] if stored else 1

    # -- channels --------------------------------------------------------------------------------

    def _create_channel(self, name: str) -> ChannelInfo:
        with self._msgs.write_lock:
            existing = self._may_create(name)
            if existing is not None:
                return existing
            info = ChannelInfo(name=name, channel_id=self._next_channel_id)

            def create(txn: lmdb.Transaction) -> None:
                txn.put(name.lower().encode(), encode_channel(info), db=self._msgs.dbs["channels"])
                txn.put(b"next_channel_id", U32.pack(info.channel_id + 1), db=self._msgs.dbs["meta"])

            self._msgs.write(create)
            self._next_channel_id += 1
            self._channels[name.lower()] = info
            return info

    def delete_channel(self, name: str) -> None:
        info = self._known(name)

        # Subscriptions first: a crash in between leaves a channel without subscriptions, never
        # subscriptions pointing at a channel that is gone.
        def on_channel(txn: lmdb.Transaction) -> list[int]:
            records = (
                decode_record(v, SubscriptionRecord)
                for v in txn.cursor(db=self._state.dbs["subs"]).iternext(keys=False)
            )
            return [r.sub_id for r in records if r.channel == info.name]

        self.apply(DeleteSubscription(sub_id) for sub_id in self._state.read(on_channel))
        with self._msgs.write_lock:

            def delete(txn: lmdb.Transaction) -> None:
                _delete_prefix(txn.cursor(db=self._msgs.dbs["messages"]), U32.pack(info.channel_id))
                txn.delete(name.lower().encode(), db=self._msgs.dbs["channels"])

            self._msgs.write(delete)
            del self._channels[name.lower()]

    # -- messages ------------------------------------------------------------------------------

    def append(self, messages: Sequence[NewMessage], now_unix_ns: int | None = None) -> AppendResult:
        now = now_or(now_unix_ns)
        with self._msgs.write_lock:
            before = {m.channel: self._known(m.channel) for m in messages}
            replies = [encode_reply(m.reply) for m in messages]

            # Every message of a channel in one batch gets the same timestamp (now, clamped).
            runs: dict[str, list[tuple[bytes, bytes]]] = {name: [] for name in before}
            assigned: list[tuple[int, int]] = []
            for msg, reply in zip(messages, replies, strict=True):
                run = runs[msg.channel]
                run.append((reply, msg.data))
                info = before[msg.channel]
                assigned.append((info.last_seq + len(run), max(now, info.last_timestamp_unix_ns)))

            def write(txn: lmdb.Transaction) -> tuple[dict[str, ChannelInfo], AppendResult]:
                infos: dict[str, ChannelInfo] = {}
                items: list[tuple[bytes, bytes]] = []
                for name, run in runs.items():
                    info = before[name]
                    ts = max(now, info.last_timestamp_unix_ns)
                    encoded = encode_run(info.channel_id, info.last_seq + 1, ts, run)
                    items += encoded
                    infos[name] = attrs.evolve(
                        info,
                        last_seq=info.last_seq + len(run),
                        msgs=info.msgs + len(run),
                        bytes=info.bytes + sum(len(v) for _, v in encoded),
                        last_timestamp_unix_ns=ts,
                    )
                cursor = txn.cursor(db=self._msgs.dbs["messages"])
                _, added = cursor.putmulti(items, overwrite=False)
                if added != len(items):
                    raise IntegrityError(
                        f"{self.path}: {len(items) - added} new message keys already exist: channel metadata "
                        "and the message log disagree"
                    )
                dropped: dict[str, range] = {}
                for name, info in infos.items():
                    info, gone = self._evict(txn, cursor, info, now)
                    infos[name] = info
                    txn.put(name.lower().encode(), encode_channel(info), db=self._msgs.dbs["channels"])
                    if gone:
                        dropped[name] = gone
                return infos, AppendResult(assigned, dropped)

            infos, result = self._msgs.write(write)
            for name, info in infos.items():
                self._channels[name.lower()] = info
            return result

    def _evict(
        self, txn: lmdb.Transaction, cursor: lmdb.Cursor, info: ChannelInfo, now: int
    ) -> tuple[ChannelInfo, range]:
        limits = self.limits.for_channel(info.name)
        if not (limits.max_msgs or limits.max_bytes or limits.max_age_s):
            return info, range(0)
        if not (
            (limits.max_msgs and info.msgs > limits.max_msgs)
            or (limits.max_bytes and info.bytes > limits.max_bytes)
            or limits.max_age_s
        ):
            return info, range(0)

        def oldest() -> Iterator[tuple[int, int]]:
            if cursor.set_range(MSG_KEY.pack(info.channel_id, info.first_seq)):
                for key, value in cursor.iternext():
                    if MSG_KEY.unpack(key)[0] != info.channel_id:
                        return
                    yield len(value), message_timestamp(value)

        count, freed = plan_eviction(limits, info.msgs, info.bytes, oldest(), now)
        gone = range(info.first_seq, info.first_seq + count)
        if count:
            if not cursor.set_range(MSG_KEY.pack(info.channel_id, gone.start)):
                raise IntegrityError(f"channel {info.name!r}: message {gone.start} is missing")
            for _ in gone:
                cursor.delete()
        return attrs.evolve(info, first_seq=gone.stop, msgs=info.msgs - count, bytes=info.bytes - freed), gone

    def read(self, channel: str, start_seq: int, max_count: int) -> list[Message]:
        info = self._known(channel)
        start = max(start_seq, info.first_seq)
        if start > info.last_seq or max_count <= 0:
            return []
        prefix = info.channel_id

        def read(txn: lmdb.Transaction) -> list[Message]:
            cursor = txn.cursor(db=self._msgs.dbs["messages"])
            out: list[Message] = []
            if not cursor.set_range(MSG_KEY.pack(prefix, start)):
                return out
            for key, value in cursor.iternext():
                if MSG_KEY.unpack(key)[0] != prefix or len(out) >= max_count:
                    break
                out.append(decode_message(key, value, info.name))
            return out

        return self._msgs.read(read)

    def get(self, channel: str, seq: int) -> Message | None:
        info = self._known(channel)
        key = MSG_KEY.pack(info.channel_id, seq)
        value = self._msgs.read(lambda txn: txn.get(key, db=self._msgs.dbs["messages"]))
        return None if value is None else decode_message(key, value, info.name)

    def get_many(self, channel: str, seqs: Sequence[int]) -> list[Message | None]:
        info = self._known(channel)
        keys = [MSG_KEY.pack(info.channel_id, seq) for seq in seqs]
        db = self._msgs.dbs["messages"]
        values = self._msgs.read(lambda txn: [txn.get(key, db=db) for key in keys])
        return [None if v is None else decode_message(k, v, info.name) for k, v in zip(keys, values, strict=True)]

    def expire(self, now_unix_ns: int | None = None) -> ExpireResult:
        now = now_or(now_unix_ns)
        aged = [c for c in self._channels.values() if self.limits.for_channel(c.name).max_age_s > 0]
        with self._msgs.write_lock:

            def sweep(txn: lmdb.Transaction) -> tuple[list[ChannelInfo], dict[str, range], int | None]:
                cursor = txn.cursor(db=self._msgs.dbs["messages"])
                updated, dropped, next_expiry = [], {}, None
                for info in aged:
                    info, gone = self._evict(txn, cursor, info, now)
                    if gone:
                        dropped[info.name] = gone
                        updated.append(info)
                        txn.put(info.name.lower().encode(), encode_channel(info), db=self._msgs.dbs["channels"])
                    if info.msgs:
                        first = txn.get(MSG_KEY.pack(info.channel_id, info.first_seq), db=self._msgs.dbs["messages"])
                        if first is None:
                            raise IntegrityError(f"channel {info.name!r}: message {info.first_seq} is missing")
                        due = message_timestamp(first) + self.limits.for_channel(info.name).max_age_ns
                        next_expiry = due if next_expiry is None else min(next_expiry, due)
                return updated, dropped, next_expiry

            if not aged:
                return ExpireResult({}, None)
            updated, dropped, next_expiry = self._msgs.write(sweep)
            for info in updated:
                self._channels[info.name.lower()] = info
        return ExpireResult(dropped, next_expiry)

    # -- subscriptions and clients -----------------------------------------------------------

    def new_subscription_id(self) -> int:
        with self._state.write_lock:
            sub_id = self._next_sub_id
            self._next_sub_id += 1
            return sub_id

    def apply(self, updates: Iterable[SubUpdate]) -> None:
        dbs = self._state.dbs
        batch = list(updates)
        if not batch:
            return

        def write(txn: lmdb.Transaction) -> None:
            highest = 0
            for update in batch:
                if isinstance(update, SetPending):
                    txn.put(PENDING_KEY.pack(update.sub_id, update.seq), U32.pack(update.attempt), db=dbs["pending"])
                elif isinstance(update, ClearPending):
                    txn.delete(PENDING_KEY.pack(update.sub_id, update.seq), db=dbs["pending"])
                elif isinstance(update, SetLastSent):
                    txn.put(U64.pack(update.sub_id), U64.pack(update.last_sent), db=dbs["lastsent"])
                elif isinstance(update, SaveSubscription):
                    key = U64.pack(update.record.sub_id)
                    txn.put(key, encode_record(update.record), db=dbs["subs"])
                    txn.put(key, U64.pack(update.record.last_sent), db=dbs["lastsent"])
                    highest = max(highest, update.record.sub_id)
                elif isinstance(update, DeleteSubscription):
                    key = U64.pack(update.sub_id)
                    txn.delete(key, db=dbs["subs"])
                    txn.delete(key, db=dbs["lastsent"])
                    _delete_prefix(txn.cursor(db=dbs["pending"]), key)
            if highest:
                stored = txn.get(b"next_sub_id", db=dbs["meta"])
                if stored is None or U64.unpack(stored)[0] <= highest:
                    txn.put(b"next_sub_id", U64.pack(highest + 1), db=dbs["meta"])

        with self._state.write_lock:
            self._state.write(write)

    def register_client(self, client: ClientRecord) -> None:
        with self._state.write_lock:
            self._state.write(
                lambda txn: txn.put(client.client_id.encode(), encode_record(client), db=self._state.dbs["clients"])
            )

    def unregister_client(self, client_id: str) -> None:
        with self._state.write_lock:
            self._state.write(lambda txn: txn.delete(client_id.encode(), db=self._state.dbs["clients"]))

    # -- lifecycle -------------------------------------------------------------------------------

    def recover(self) -> RecoveredState:
        dbs = self._state.dbs

        def load(txn: lmdb.Transaction) -> RecoveredState:
            clients = [decode_record(v, ClientRecord) for v in txn.cursor(db=dbs["clients"]).iternext(keys=False)]
            last_sent = {U64.unpack(k)[0]: U64.unpack(v)[0] for k, v in txn.cursor(db=dbs["lastsent"]).iternext()}
            pending: dict[int, dict[int, int]] = {}
            unpack_key, unpack_attempt = PENDING_KEY.unpack, U32.unpack
            current_id, current = -1, {}
            for k, v in txn.cursor(db=dbs["pending"]).iternext():
                sub_id, seq = unpack_key(k)
                if sub_id != current_id:
                    current_id, current = sub_id, pending.setdefault(sub_id, {})
                current[seq] = unpack_attempt(v)[0]
            subs = []
            for v in txn.cursor(db=dbs["subs"]).iternext(keys=False):
                record = decode_record(v, SubscriptionRecord)
                own = pending.get(record.sub_id, {})
                # A delivery's SetPending may have been committed without its SetLastSent.
                position = max(last_sent.get(record.sub_id, record.last_sent), max(own, default=0))
                subs.append(RecoveredSubscription(attrs.evolve(record, last_sent=position), own))
            return RecoveredState(self._server, self.channels(), clients, subs)

        return self._state.read(load)

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            self._msgs.used_bytes(), self._msgs.map_size(), self._state.used_bytes(), self._state.map_size()
        )

    def sync(self) -> None:
        if not self.synced:
            for env in self._envs:
                env.sync()

    def close(self) -> None:
        try:
            self.sync()  # unsynced commits of a clean stop reach the disk before the lock is let go
        finally:
            for env in self._envs:
                env.close()
            self._envs.clear()
            self._lock.release()


def _get_meta(txn: lmdb.Transaction, *, db: lmdb._Database, key: bytes) -> bytes | memoryview | None:
    return txn.get(key, db=db)


def _delete_prefix(cursor: lmdb.Cursor, prefix: bytes) -> None:
    if cursor.set_range(prefix):
        while cursor.key()[: len(prefix)] == prefix:
            if not cursor.delete():
                break
