"""The LMDB store: a durable message log per channel (this module: the journal, the in-memory tail
and the checkpoints into LMDB), plus the subscription and client state (storage.subscription_state),
each in an LMDB environment of its own (storage.environment: transactions and map growth).

Layout of a data directory:

    LOCK          exclusive flock held by the server process (see dirlock.py)
    msgs/         LMDB environment, fully synced: meta, channels, messages (key: channel id, seq)
    msgs/journal.0, journal.1
                  the publish journal (journal.py): every append since the last checkpoint
    state/        LMDB environment, synced once per commit without the extra meta-page sync: meta,
                  subscriptions, last-sent positions, pending entries (key: sub id, seq), clients

Appends go to the journal, not to LMDB: one record and one fdatasync per batch (an LMDB commit costs
two fsyncs and its B-tree pages, and a PubAck waits for it). The messages stay in memory, where reads
find them, until the checkpoint thread copies them into LMDB in one synced commit (every
`checkpoint_interval` or `checkpoint_bytes` of journal) and switches appends to the other journal file.
Retention limits are applied to the in-memory channel at once; the checkpoint deletes the rows. On
opening, what the journal holds beyond the last checkpoint is replayed, limits included. LMDB is
written only in synced commits, so it is never damaged, whatever the journal's syncing.

Why two environments: LMDB has one writer per environment, and checkpoints must not queue behind
acknowledgement bookkeeping, nor the other way round. The state environment uses `metasync=False`:
integrity is kept and a machine crash can undo at most the last state commit, which only causes a
redelivery (see the durability contract in base.py).

Pending entries reference sequences that were appended (and fsynced) before they were delivered,
so the two environments never need a transaction across both.

`sync=False` (the server's `file_sync = false`, as nats-streaming-server's flag) writes journal records
and state commits without an fsync (the state environment opens with MDB_NOSYNC); `sync()` flushes
them, which the server does every `sync_interval` and at close. A crash of the server process loses
nothing committed (the page cache has it); a crash of the machine loses what was written since the
last flush and, since LMDB then relies on the filesystem keeping the order of writes, can leave the
state environment damaged.

Checkpoints are `storage.checkpointer`'s (when, and the LMDB commit); verifying the files and the
messages is `storage.lmdb_verify`'s. What stays here is one job, keeping the message log's three
places (the in-memory tail, the journal, LMDB) consistent under the locks they share, which is why
it runs over 500 lines.

Locks, outermost first: the append lock (one append, eviction or journal switch at a time), the
message environment's write lock (checkpoints, channel creation and deletion), the memory lock (the
in-memory messages and how far LMDB goes; held only for a few dictionary operations).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any, TypeVar, cast

import attrs
import lmdb

from storage.base import SCHEMA_VERSION, VERIFY_MODES, Store, StoreStatistics, now_or
from storage.checkpointer import Checkpointer, write_checkpoint
from storage.codec import (
    EMPTY_HEAD,
    JOURNAL_RUN,
    MSG_KEY,
    U32,
    U64,
    decode_channel,
    decode_message,
    decode_messages,
    decode_record,
    encode_channel,
    encode_head,
    encode_message,
    encode_run,
    key_seq,
    message_timestamp,
)
from storage.dirlock import DirectoryLock
from storage.environment import DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE, Environment, MiB, delete_prefix
from storage.errors import (
    ClusterIdMismatchError,
    DamagedStoreError,
    IntegrityError,
    SchemaVersionError,
    StoreError,
)
from storage.full_check import BackgroundCheck
from storage.integrity import Damage
from storage.journal import NAMES as JOURNAL_NAMES
from storage.journal import Journal, Seed, keyed, unkeyed
from storage.limits import StoreLimits, plan_eviction
from storage.lmdb_verify import channel_ends, check_against_meta, check_files, scan_messages
from storage.records import (
    AppendResult,
    ChannelInfo,
    DeleteSubscription,
    ExpireResult,
    Message,
    MessageToAppend,
    RecoveredState,
    ServerInfo,
    SubscriptionRecord,
    SubUpdate,
)
from storage.state_walk import SEAL_NAME, WalkAhead, seal
from storage.subscription_state import DATABASES as STATE_DATABASES
from storage.subscription_state import SubscriptionState

T = TypeVar("T")
log = logging.getLogger(__name__)
CHECKPOINT_BYTES = 8 * MiB  # of journal, or
CHECKPOINT_INTERVAL_S = 1.0  # whichever comes first
_EMPTY: dict[int, tuple[bytes, bytes]] = {}
# "full": every message's checksum and both environments' structure are checked at open (about 2 s
# per million small messages here); "quick": the state environment's structure, the message file's
# meta pages and length, and each channel's first and last message; damage elsewhere is found when a
# message is read (it is skipped, logged and counted) or by `streaming-server check`; "background":
# "quick" at open, then what "full" checks, in a process of its own while the store serves
# (`check_fully`), reads stopping before any damaged message until it has passed.
DAMAGED_LOG_LIMIT = 10_000  # damaged messages remembered (each is logged once)


def _heads(messages: Sequence[MessageToAppend]) -> list[bytes]:
    """Each message's encoded head (reply and content type). A batch's messages mostly share one
    (none, or a door's content type), so each distinct pair is encoded once."""
    heads: dict[tuple[str, str], bytes] = {("", ""): EMPTY_HEAD}
    out = []
    for m in messages:
        key = (m.reply, m.content_type)
        head = heads.get(key)
        if head is None:
            head = heads[key] = encode_head(*key)
        out.append(head)
    return out


def _sized(values: list[bytes]) -> bytes:
    """The values of a journal run record, each after its length: one join when they are all one size
    (a burst of equal messages), rather than a length packed per message."""
    if len(set(map(len, values))) == 1:
        size = U32.pack(len(values[0]))
        return size + size.join(values)
    return b"".join(U32.pack(len(value)) + value for value in values)


def _gapless(info: ChannelInfo) -> bool:
    """Whether the channel holds every sequence from its first to its last: no repair or import left
    gaps (its message count says so), so a row missing in between is damage."""
    return info.msgs == info.last_seq - info.first_seq + 1


def _consecutive(info: ChannelInfo, start: int, items: list[tuple[bytes, bytes | memoryview]]) -> bool:
    """Whether a read from `start` came back as the channel's consecutive messages from there, or the
    channel has gaps of its own and so cannot be held to that. Two key comparisons per read: the rows
    of a gapless channel are consecutive, so the first and the last pair's keys settle it."""
    if not _gapless(info):
        return True
    if not items:
        return False
    first, cid = max(start, info.first_seq), info.channel_id
    return items[0][0] == MSG_KEY.pack(cid, first) and items[-1][0] == MSG_KEY.pack(cid, first + len(items) - 1)


def _after(items: list[tuple[bytes, bytes | memoryview]], start: int) -> int:
    """Where a read goes on after `items`, read from `start`: past the last well-formed key (a key of
    the wrong length is damage the read has reported, and holds no sequence)."""
    for key, _ in reversed(items):
        if len(key) == MSG_KEY.size:
            return max(key_seq(key) + 1, start + 1)
    return start + len(items)


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
        checkpoint_bytes: int = CHECKPOINT_BYTES,
        checkpoint_interval: float = CHECKPOINT_INTERVAL_S,
        verify: str = "full",
        state_walk: WalkAhead | None = None,
    ) -> None:
        """`state_walk`: the state file's structure walk, begun earlier (`WalkAhead`)."""
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, not {verify!r}")
        super().__init__(limits or StoreLimits())
        self.synced = sync
        self.path = Path(directory)
        self.path.mkdir(parents=True, exist_ok=True)
        self._checkpoints = Checkpointer(
            self.path,
            self._checkpoint_now,
            lambda: self._journal.active_bytes,
            every_bytes=checkpoint_bytes,
            interval_s=checkpoint_interval,
            max_bytes=max(checkpoint_bytes * 8, 64 * MiB),
        )
        self._append_lock = threading.Lock()  # one append (or eviction, or journal switch) at a time
        self._mem_lock = threading.Lock()  # innermost: the in-memory messages and what LMDB holds
        self._checkpoint_lock = threading.Lock()
        self._prefill_cap = 2 * checkpoint_bytes  # the most the inactive journal file is prefilled to
        self._recent: dict[int, dict[int, tuple[bytes, bytes]]] = {}  # channel id -> seq -> (key, value)
        self._copying: dict[int, dict[int, tuple[bytes, bytes]]] = {}  # being checkpointed
        self._in_lmdb: dict[int, int] = {}  # channel id -> last seq checkpointed into LMDB
        self._dirty: set[int] = set()  # channels whose in-memory state LMDB does not have yet
        self._unretired: int | None = None  # a journal epoch whose checkpoint failed
        self._damaged: dict[tuple[int, int], None] = {}  # (channel id, seq) found damaged when read (bounded)
        self.damaged_reads = 0  # reads that met a damaged message
        self._check_lock = threading.Lock()
        self._check = BackgroundCheck() if verify == "background" else None  # owed until it passes
        self._read_damage: list[str] = []  # what reads met while the check was owed
        self._lock = DirectoryLock(self.path)
        self._lock.acquire()
        self._envs: list[Environment] = []
        try:
            self._open(cluster_id, map_size, max_map_size, verify, state_walk)
        except BaseException:
            self.close()
            raise

    def _open_env(self, name: str, dbs: Sequence[str], map_size: int, max_map_size: int, **flags: Any) -> Environment:
        env = Environment(self.path / name, dbs, map_size, max_map_size, **flags)
        self._envs.append(env)
        return env

    # -- opening -------------------------------------------------------------------------------

    def _open(
        self, cluster_id: str, map_size: int, max_map_size: int, verify: str, state_walk: WalkAhead | None
    ) -> None:
        """Check the files, open both environments and the journal, replay it, start checkpointing.

        Nothing is handed to LMDB before it is known to be whole (integrity.py): a store that is
        damaged, or that lacks a file the others show it had, raises DamagedStoreError naming the file."""
        msgs_dir, state_dir = self.path / "msgs", self.path / "state"
        msgs_data, state_data = msgs_dir / "data.mdb", state_dir / "data.mdb"
        journals = [msgs_dir / name for name in JOURNAL_NAMES]
        check_files(msgs_dir, state_dir, journals, verify, state_walk)
        # The state file changes from here on: a seal left beside it would only cost a digest at the
        # next start after a crash. A clean stop seals it again.
        (state_dir / SEAL_NAME).unlink(missing_ok=True)

        # Always synced: LMDB is written only by checkpoints, and a checkpoint must be whole on disk
        # before the journal file it copied is written again.
        self._msgs = self._open_env("msgs", ["meta", "channels", "messages"], map_size, max_map_size)
        meta = self._msgs.dbs["meta"]
        check_against_meta(self._msgs, state_data, journals)
        self._state = self._open_env(
            "state",
            STATE_DATABASES,
            map_size,
            max_map_size,
            metasync=False,
            sync=self.synced,
        )
        # A new store's journal files exist before its server record does: a store that has a
        # server record always has them.
        self._journal = Journal(msgs_dir, sync=self.synced)
        self._server = self._check_meta(cluster_id)
        self._journal.seed = self._msgs.read(self._journal_seed)
        self._load_channels()
        self._subs = SubscriptionState(self._state)
        self._next_channel_id = 1 + max((c.channel_id for c in self._channels.values()), default=0)
        self._next_channel_id = max(self._next_channel_id, self._msgs.read(self._stored_next_channel_id))
        self._in_lmdb = {c.channel_id: c.last_seq for c in self._channels.values()}
        bounds = [(info, self._in_lmdb.get(info.channel_id, 0)) for info in self._channels.values()]
        damage = scan_messages(self._msgs, bounds) if verify == "full" else channel_ends(self._msgs, bounds)
        if damage:
            lines = damage.lines()
            more = f" (and {len(lines) - 1} more problems)" if len(lines) > 1 else ""
            raise DamagedStoreError(f"{msgs_data}: {lines[0]}{more}")
        checkpointed = self._msgs.read(partial(_get_meta, db=meta, key=b"journal_epoch"))
        recovery = self._journal.recover(U64.unpack(checkpointed)[0] if checkpointed else 0)
        self._replay(recovery.bodies)
        self._unretired = recovery.unretired
        if recovery.bodies:
            self._checkpoints.try_checkpoint()
        self._checkpoints.start()

    def _journal_seed(self, txn: lmdb.Transaction) -> Seed:
        meta = self._msgs.dbs["meta"]
        key, keyed_from = txn.get(b"journal_key", db=meta), txn.get(b"journal_keyed_from", db=meta)
        if key is None or keyed_from is None:
            return unkeyed  # a store of schema version 2 or older, until its first append
        return keyed(bytes(key), U64.unpack(keyed_from)[0])

    def _check_meta(self, cluster_id: str) -> ServerInfo:
        for env in (self._msgs, self._state):
            found = env.read(partial(_get_meta, db=env.dbs["meta"], key=b"schema_version"))
            if found is not None and U32.unpack(found)[0] > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{env.path} was written with store schema version {U32.unpack(found)[0]}, newer than "
                    f"the {SCHEMA_VERSION} this server supports: upgrade the server to open it"
                )

        meta = self._msgs.dbs["meta"]
        found = self._msgs.read(partial(_get_meta, db=meta, key=b"schema_version"))
        self._schema_current = found is not None and U32.unpack(found)[0] == SCHEMA_VERSION

        def check(txn: lmdb.Transaction) -> ServerInfo:
            stored, created = txn.get(b"cluster_id", db=meta), txn.get(b"created_unix_ns", db=meta)
            if stored is None or created is None:
                raise DamagedStoreError(f"{self._msgs.path / 'data.mdb'}: the server record is incomplete")
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
            txn.put(b"journal_key", secrets.token_bytes(16), db=meta)
            txn.put(b"journal_keyed_from", U64.pack(0), db=meta)

        # The server record first: a store with one is a store whose other files must all be there.
        self._msgs.write(init)
        self._state.write(lambda txn: txn.put(b"schema_version", U32.pack(SCHEMA_VERSION), db=self._state.dbs["meta"]))
        self._schema_current = True
        return ServerInfo(cluster_id, SCHEMA_VERSION, created)

    def _upgrade_schema(self) -> None:
        """Bring an older store to the current version before its journal takes a record of this
        server's: an older server would not replay the journal (version 1) or not read its keyed
        records (version 2). Done at the first append rather than at open: opening writes only what is
        missing, so a store on a full disk still opens. Called with the append lock held.

        The key applies from the active epoch on when that holds nothing yet; otherwise (a replay whose
        checkpoint has not succeeded) from the next one, so what the active file holds stays readable."""
        meta = self._msgs.dbs["meta"]
        key = secrets.token_bytes(16)
        quiet = self._unretired is None and not self._journal.active_bytes
        keyed_from = self._journal.epoch if quiet else self._journal.epoch + 1

        def upgrade(txn: lmdb.Transaction) -> None:
            txn.put(b"schema_version", U32.pack(SCHEMA_VERSION), db=meta)
            txn.put(b"journal_key", key, db=meta)
            txn.put(b"journal_keyed_from", U64.pack(keyed_from), db=meta)

        with self._msgs.write_lock:
            self._msgs.write(upgrade)
        self._journal.seed = keyed(key, keyed_from)
        self._schema_current = True

    def _load_channels(self) -> None:
        def load(txn: lmdb.Transaction) -> list[ChannelInfo]:
            return [decode_channel(v) for v in txn.cursor(db=self._msgs.dbs["channels"]).iternext(keys=False)]

        self._channels = {info.name.lower(): info for info in self._msgs.read(load)}

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
            with self._mem_lock:
                self._in_lmdb[info.channel_id] = 0
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
        # A checkpoint that copies this channel's messages afterwards finds no channel record and skips
        # them; a crash before this commit replays them into a channel that still exists.
        with self._append_lock, self._msgs.write_lock:

            def delete(txn: lmdb.Transaction) -> None:
                delete_prefix(txn.cursor(db=self._msgs.dbs["messages"]), U32.pack(info.channel_id))
                txn.delete(name.lower().encode(), db=self._msgs.dbs["channels"])

            self._msgs.write(delete)
            del self._channels[name.lower()]
            with self._mem_lock:
                self._in_lmdb.pop(info.channel_id, None)
                self._recent.pop(info.channel_id, None)
            self._dirty.discard(info.channel_id)

    # -- messages ------------------------------------------------------------------------------

    def append(self, messages: Sequence[MessageToAppend], now_unix_ns: int | None = None) -> AppendResult:
        now = now_or(now_unix_ns)
        self._checkpoints.wait_for_room()
        with self._append_lock:
            if not self._schema_current:
                self._upgrade_schema()
            before = {name: self._known(name) for name in dict.fromkeys([m.channel for m in messages])}
            replies = _heads(messages)

            # Every message of a channel in one batch gets the same timestamp (now, clamped).
            runs: dict[str, list[tuple[bytes, bytes]]] = {name: [] for name in before}
            assigned: list[tuple[int, int]]
            if len(before) == 1:  # the common case, without a lookup per message
                ((name, info),) = before.items()
                runs[name] = list(zip(replies, [m.data for m in messages], strict=True))
                ts = max(now, info.last_timestamp_unix_ns)
                first = info.last_seq + 1
                assigned = [(seq, ts) for seq in range(first, first + len(messages))]
            else:
                assigned = []
                for msg, reply in zip(messages, replies, strict=True):
                    run = runs[msg.channel]
                    run.append((reply, msg.data))
                    info = before[msg.channel]
                    assigned.append((info.last_seq + len(run), max(now, info.last_timestamp_unix_ns)))

            encoded: list[tuple[ChannelInfo, int, list[tuple[bytes, bytes]], int]] = []
            parts: list[bytes] = []
            for name, run in runs.items():
                info = before[name]
                ts = max(now, info.last_timestamp_unix_ns)
                items = encode_run(info.channel_id, info.last_seq + 1, ts, run)
                values = [value for _, value in items]
                encoded.append((info, ts, items, sum(map(len, values))))
                parts += (JOURNAL_RUN.pack(info.channel_id, info.last_seq + 1, ts, len(items)), _sized(values))
            self._journal.append(b"".join(parts))

            dropped: dict[str, range] = {}
            for info, ts, items, size in encoded:
                gone = self._add(info, ts, items, size, now)
                if gone:
                    dropped[info.name] = gone
        if self._checkpoints.due():
            self._checkpoints.poke()
        return AppendResult(assigned, dropped)

    def _add(self, info: ChannelInfo, ts: int, items: list[tuple[bytes, bytes]], size: int, now: int) -> range:
        """Make journaled messages visible (in memory until the next checkpoint) and apply the limits;
        `size`: the bytes of their values. Called with the append lock held."""
        first = info.last_seq + 1
        recent = self._recent.get(info.channel_id)
        if recent is None:
            recent = self._recent[info.channel_id] = {}
        recent.update(zip(range(first, first + len(items)), items, strict=True))
        info = attrs.evolve(
            info,
            last_seq=info.last_seq + len(items),
            msgs=info.msgs + len(items),
            bytes=info.bytes + size,
            last_timestamp_unix_ns=ts,
        )
        info, gone = self._evict(info, now)
        self._channels[info.name.lower()] = info
        self._dirty.add(info.channel_id)
        return gone

    def _replay(self, bodies: list[bytes]) -> None:
        """Apply the journal records found at open, oldest first: what LMDB already holds is skipped."""
        names = {c.channel_id: c.name for c in self._channels.values()}
        for body in bodies:
            offset = 0
            while offset < len(body):
                channel_id, first, ts, count = JOURNAL_RUN.unpack_from(body, offset)
                offset += JOURNAL_RUN.size
                items = []
                for seq in range(first, first + count):
                    (size,) = U32.unpack_from(body, offset)
                    offset += U32.size
                    items.append((MSG_KEY.pack(channel_id, seq), body[offset : offset + size]))
                    offset += size
                name = names.get(channel_id)
                if name is None:  # deleted after this record was written
                    continue
                info = self._known(name)
                new = items[max(0, info.last_seq + 1 - first) :]
                if new and first + len(items) - len(new) != info.last_seq + 1:
                    raise IntegrityError(
                        f"{self.path}: the journal continues channel {name!r} at "
                        f"{first + len(items) - len(new)}, but the store ends at {info.last_seq}"
                    )
                if new:
                    self._add(info, ts, new, sum(len(value) for _, value in new), ts)

    def _evict(self, info: ChannelInfo, now: int) -> tuple[ChannelInfo, range]:
        """Apply the limits to the in-memory channel; the next checkpoint deletes the rows."""
        limits = self.limits.for_channel(info.name)
        if not (
            (limits.max_msgs and info.msgs > limits.max_msgs)
            or (limits.max_bytes and info.bytes > limits.max_bytes)
            or limits.max_age_s
        ):
            return info, range(0)
        seen: list[int] = []  # sequences handed to plan_eviction, in order (a repaired channel has gaps)

        def oldest() -> Iterator[tuple[int, int]]:
            start = info.first_seq
            while start <= info.last_seq:
                items = self._items(info, start, 256)
                if not items:
                    return
                for key, value in items:
                    if len(key) != MSG_KEY.size:  # a damaged key: reads report it, and it names no message
                        continue
                    seen.append(key_seq(key))
                    yield len(value), message_timestamp(value)
                if not seen or seen[-1] < start:  # nothing well-formed from `start` on in this batch
                    return
                start = seen[-1] + 1

        count, freed = plan_eviction(limits, info.msgs, info.bytes, oldest(), now)
        if not count:
            return info, range(0)
        # plan_eviction looked at one message past the last it drops, unless the channel ran out.
        stop = seen[count] if count < len(seen) else info.last_seq + 1
        gone = range(info.first_seq, stop)
        return attrs.evolve(info, first_seq=stop, msgs=info.msgs - count, bytes=info.bytes - freed), gone

    def _items(self, info: ChannelInfo, start: int, count: int) -> list[tuple[bytes, bytes | memoryview]]:
        """Up to `count` stored (key, value) pairs of the channel from `start` on, in order: the
        checkpointed ones from LMDB (gaps left by a repair are skipped), the newer ones from memory.
        Values are not verified here."""
        channel_id = info.channel_id
        in_lmdb, recent, copying = self._where(channel_id)
        start = max(start, info.first_seq)
        out: list[tuple[bytes, bytes | memoryview]] = []
        if start <= in_lmdb:
            last = min(in_lmdb, info.last_seq)
            first, end = MSG_KEY.pack(channel_id, start), MSG_KEY.pack(channel_id, last)
            db = self._msgs.dbs["messages"]
            # The stored sequences are contiguous but for a repair's gaps: taking this many pairs in
            # one C call reads past `end` only by a gap's length, and a loop per pair costs half again.
            wanted = min(count, last - start + 1)

            def read(txn: lmdb.Transaction) -> list[tuple[bytes, bytes | memoryview]]:
                cursor = txn.cursor(db=db)
                if not cursor.set_range(first):
                    return []
                found: list[tuple[bytes, bytes | memoryview]] = list(
                    islice(cast("Iterator[tuple[bytes, bytes]]", cursor.iternext()), wanted)
                )
                if found and found[-1][0] > end:  # past a gap, into what follows the channel
                    del found[bisect_right(found, end, key=itemgetter(0)) :]
                return found

            out = self._msgs.read(read)
        seq = max(start, in_lmdb + 1)
        while len(out) < count and seq <= info.last_seq:
            item = recent.get(seq) or copying.get(seq)
            if item is None:  # the journal's messages are contiguous: this is a bug, not damage
                raise IntegrityError(f"channel {info.name!r}: message {seq} is missing from memory")
            out.append(item)
            seq += 1
        return out

    def _where(self, channel_id: int) -> tuple[int, dict[int, tuple[bytes, bytes]], dict[int, tuple[bytes, bytes]]]:
        """How far LMDB holds the channel, and the newer messages in memory (a snapshot: a checkpoint
        moves them from `_recent` to `_copying` to LMDB meanwhile)."""
        with self._mem_lock:
            return (
                self._in_lmdb.get(channel_id, 0),
                self._recent.get(channel_id, _EMPTY),
                self._copying.get(channel_id, _EMPTY),
            )

    def read(self, channel: str, start_seq: int, max_count: int) -> list[Message]:
        info = self._known(channel)
        name = info.name
        out: list[Message] = []
        start = start_seq
        while len(out) < max_count and start <= info.last_seq:
            items = self._items(info, start, max_count - len(out))
            held = False
            if not _consecutive(info, start, items):
                items, held = self._past_missing(info, start, items)
            if items:
                try:
                    out += decode_messages(items, name)
                except IntegrityError:
                    intact, damaged = self._decode_skipping(info, items)
                    out += intact
                    held = held or damaged
            if held or not items:
                break
            start = _after(items, start)
        return out

    def _past_missing(
        self, info: ChannelInfo, start: int, items: list[tuple[bytes, bytes | memoryview]]
    ) -> tuple[list[tuple[bytes, bytes | memoryview]], bool]:
        """A read of a channel without gaps of its own came back with sequences missing: LMDB's search
        went past rows it holds (a damaged page) or rows are gone. Each missing run not explained by
        an eviction meanwhile is reported as damage. Returns the pairs to decode and whether the read
        ends there (the full check is owed: nothing past the damage is served)."""
        first = max(start, info.first_seq)
        gaps: list[tuple[int, int, int]] = []  # (first missing, last missing, index of the pair after)
        expected = first
        for at, (key, _) in enumerate(items):
            if len(key) != MSG_KEY.size:
                continue  # reported when it fails to decode
            seq = key_seq(key)
            if seq > expected:
                gaps.append((expected, seq - 1, at))
            expected = max(expected, seq + 1)
        if not items:
            in_lmdb = self._where(info.channel_id)[0]
            if first <= min(in_lmdb, info.last_seq):
                gaps.append((first, min(in_lmdb, info.last_seq), 0))
        for low, high, at in gaps:
            if self._missing(info, low, high):
                return items[:at], True
        return items, False

    def _missing(self, info: ChannelInfo, low: int, high: int) -> bool:
        """Report sequences `low`..`high` of a gapless channel as missing, unless an eviction since
        explains them; True while the full check is owed (see `_found_damaged`)."""
        now = self._channels.get(info.name.lower())
        if now is None or now.channel_id != info.channel_id:
            return False  # deleted meanwhile
        low = max(low, now.first_seq)
        if low > high:
            return False  # evicted by a limit after the read's view of the channel was taken
        which = f"message {low} is" if low == high else f"messages {low}-{high} are"
        problem = f"channel {info.name!r}: {which} missing from the message file (none was removed)"
        return self._report_damage((info.channel_id, low), IntegrityError(problem))

    def _decode_skipping(
        self, info: ChannelInfo, items: list[tuple[bytes, bytes | memoryview]]
    ) -> tuple[list[Message], bool]:
        """Decode what is intact, report the rest: one damaged message must not hide the ones after,
        unless the full check is still owed (True: the read ends before the damaged message)."""
        out = []
        for key, value in items:
            try:
                out.append(decode_message(key, value, info.name))
            except IntegrityError as exc:
                if self._found_damaged(key, exc):
                    return out, True
        return out, False

    def _found_damaged(self, key: bytes, exc: IntegrityError) -> bool:
        """Report a damaged message a read met. True while the full check is owed: the check ends at
        once with this damage (`check_fully`), and the read must not go past the message."""
        return self._report_damage(MSG_KEY.unpack(key) if len(key) == MSG_KEY.size else (-1, len(key)), exc)

    def _report_damage(self, where: tuple[int, int], exc: IntegrityError) -> bool:
        """`_found_damaged` for damage found at `where` (channel id, sequence)."""
        self.damaged_reads += 1
        with self._check_lock:
            if self._check is not None:
                self._read_damage.append(str(exc))
                self._check.stop()
                return True
        if where in self._damaged or len(self._damaged) >= DAMAGED_LOG_LIMIT:
            return False
        self._damaged[where] = None
        log.error(
            "%s in %s: skipped, and every other message is still delivered; "
            "`streaming-server check --dir %s` lists all damage",
            exc,
            self._msgs.path / "data.mdb",
            self.path,
        )
        return False

    @property
    def unchecked(self) -> bool:
        return self._check is not None

    def check_fully(self) -> str | None:
        check = self._check
        if check is None:
            return None
        damage = check.run(self._msgs)
        msgs_data = self._msgs.path / "data.mdb"
        with self._check_lock:
            if self._read_damage:
                return f"{msgs_data}: {self._read_damage[0]} (found by a read before the full check ended)"
            if damage is None:  # stopped: the store is closing
                return None
            if damage:
                lines = damage.lines()
                more = f" (and {len(lines) - 1} more problems)" if len(lines) > 1 else ""
                return f"{msgs_data}: {lines[0]}{more}"
            self._check = None
        return None

    def get(self, channel: str, seq: int) -> Message | None:
        return self.get_many(channel, [seq])[0]

    def get_many(self, channel: str, seqs: Sequence[int]) -> list[Message | None]:
        info = self._known(channel)
        cid, name = info.channel_id, info.name
        in_lmdb, recent, copying = self._where(cid)
        keys = [MSG_KEY.pack(cid, seq) for seq in seqs]
        older = [key for seq, key in zip(seqs, keys, strict=True) if info.first_seq <= seq <= in_lmdb]
        db = self._msgs.dbs["messages"]
        from_lmdb = dict(zip(older, self._msgs.read(lambda txn: [txn.get(k, db=db) for k in older]), strict=True))
        out: list[Message | None] = []
        for seq, key in zip(seqs, keys, strict=True):
            value: bytes | memoryview | None = None
            if info.first_seq <= seq <= info.last_seq:
                if seq <= in_lmdb:
                    value = from_lmdb[key]
                else:
                    item = recent.get(seq) or copying.get(seq)
                    value = None if item is None else item[1]
            message = None
            if value is not None:
                try:
                    message = decode_message(key, value, name)
                except IntegrityError as exc:
                    self._found_damaged(key, exc)  # not served either way
            elif info.first_seq <= seq <= in_lmdb and _gapless(info):
                self._missing(info, seq, seq)  # a gapless channel's row not found: not served either way
            out.append(message)
        return out

    def expire(self, now_unix_ns: int | None = None) -> ExpireResult:
        now = now_or(now_unix_ns)
        dropped: dict[str, range] = {}
        next_expiry: int | None = None
        with self._append_lock:
            for info in list(self._channels.values()):
                max_age_ns = self.limits.for_channel(info.name).max_age_ns
                if max_age_ns <= 0:
                    continue
                info, gone = self._evict(info, now)
                if gone:
                    dropped[info.name] = gone
                    self._channels[info.name.lower()] = info
                    self._dirty.add(info.channel_id)
                oldest = self._items(info, info.first_seq, 1) if info.msgs else []
                if oldest:
                    due = message_timestamp(oldest[0][1]) + max_age_ns
                    next_expiry = due if next_expiry is None else min(next_expiry, due)
        if dropped:
            # A journal replay re-applies count and size limits, not an age sweep: make it stick now.
            self.checkpoint()
        return ExpireResult(dropped, next_expiry)

    # -- verification ----------------------------------------------------------------------------

    def scan_messages(self) -> Damage:
        """Every message LMDB holds, checksum by checksum (see `storage.lmdb_verify.scan_messages`)."""
        with self._mem_lock:
            bounds = [(info, self._in_lmdb.get(info.channel_id, 0)) for info in self._channels.values()]
        return scan_messages(self._msgs, bounds)

    # -- bulk load -------------------------------------------------------------------------------

    def load_channel(
        self, name: str, messages: Iterable[Message], *, last_seq: int, batch_bytes: int = 8 * MiB
    ) -> ChannelInfo:
        """Make a new channel holding `messages` at their own sequences and timestamps (increasing
        sequences, gaps allowed) and ending at `last_seq` even where no message is left: what an
        importer does, on a store no server has open. The messages go straight into LMDB in synced
        commits of about `batch_bytes`, not through the journal; no limits are applied. The channel's
        record is written last: until then it is empty, and an interrupted load leaves rows past its
        end, which opening the store reports as damage (an importer builds in a new directory)."""
        if self.channel_info(name) is not None:
            raise ValueError(f"channel {name!r} exists already: a bulk load makes new channels only")
        info = self.ensure_channel(name)
        cid, db = info.channel_id, self._msgs.dbs["messages"]
        first: bytes = b""  # the first message's key
        prev, count, size, last_ts = 0, 0, 0, 0
        batch: list[tuple[bytes, bytes]] = []
        batched = 0

        def put(txn: lmdb.Transaction) -> None:
            _, added = txn.cursor(db=db).putmulti(batch, overwrite=False)
            if added != len(batch):
                raise IntegrityError(f"{self.path}: channel {name!r} holds rows already")

        # The hot loop of an import: names bound locally, counts kept per batch.
        encode, add = encode_message, batch.append
        for m in messages:
            seq = m.seq
            if seq <= prev:
                raise ValueError(f"channel {name!r}: message {seq} after {prev}")
            prev = seq
            head = encode_head(m.reply, m.content_type) if m.reply or m.content_type else EMPTY_HEAD
            item = encode(cid, seq, m.timestamp_unix_ns, head, m.data)
            add(item)
            batched += len(item[1])
            if batched >= batch_bytes:
                with self._msgs.write_lock:
                    self._msgs.write(put)
                first, count, size = first or batch[0][0], count + len(batch), size + batched
                batch.clear()
                batched = 0
        if prev > last_seq:
            raise ValueError(f"channel {name!r}: message {prev} past its end {last_seq}")
        if batch:
            first, count, size = first or batch[0][0], count + len(batch), size + batched
        if count:
            last_ts = m.timestamp_unix_ns  # the last message's
        with self._append_lock, self._msgs.write_lock:
            info = attrs.evolve(
                info,
                first_seq=key_seq(first) if first else last_seq + 1,
                last_seq=last_seq,
                msgs=count,
                bytes=size,
                last_timestamp_unix_ns=last_ts,
            )

            def finish(txn: lmdb.Transaction) -> None:
                if batch:
                    put(txn)
                txn.put(name.lower().encode(), encode_channel(info), db=self._msgs.dbs["channels"])

            self._msgs.write(finish)
            self._channels[name.lower()] = info
            with self._mem_lock:
                self._in_lmdb[cid] = last_seq
        return info

    # -- checkpoints -----------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Copy what the journal holds into LMDB (one synced commit) and start the other journal file.

        The store's own thread does this every `checkpoint_interval` or `checkpoint_bytes` of journal,
        whichever comes first; appends go on meanwhile, into the other file."""
        self._checkpoint_now()

    def _checkpoint_now(self) -> None:
        with self._checkpoint_lock:
            with self._append_lock:
                if not self._dirty:
                    return
                # After a failed checkpoint the retired file is still not in LMDB: it must not be
                # written again, so this one copies both files and retires the older only.
                retired = self._unretired
                if retired is None and self._journal.active_bytes:
                    retired = self._journal.switch()
                with self._mem_lock:
                    self._copying, self._recent = self._recent, {}
                infos = [c for c in self._channels.values() if c.channel_id in self._dirty]
                dirty, self._dirty = self._dirty, set()
                copying = self._copying
            self._checkpoints.poke()  # appends waiting for journal room
            try:
                sizes = b"".join(U64.pack(f.allocated) for f in self._journal.files)
                write_checkpoint(self._msgs, infos, copying, retired, sizes, self.path)
            except BaseException:
                with self._append_lock, self._mem_lock:
                    for channel_id, older in copying.items():
                        self._recent[channel_id] = older | self._recent.get(channel_id, {})
                    self._copying = {}
                    self._dirty |= dirty
                    self._unretired = retired
                raise
            with self._mem_lock:
                for info in infos:
                    if info.channel_id in self._in_lmdb:
                        self._in_lmdb[info.channel_id] = info.last_seq
                self._copying = {}
                self._unretired = None
            self._prefill_journal()

    def _prefill_journal(self) -> None:
        """Ready the retired journal file for its next use, on the checkpoint thread (no switch can
        come meanwhile: it holds the checkpoint lock): written space, as large as the active file's,
        so the fdatasync of each commit into it is a data flush only. Skipped when the disk has little
        room left (the space is the journal's anyway, but it must not be what a commit runs out of)."""
        if self._checkpoints.closing:
            return
        files = self._journal.files
        target = min(max(f.allocated for f in files), self._prefill_cap)
        try:
            room = os.statvfs(self.path)
            if room.f_bavail * room.f_frsize < max(8 * target, 256 * MiB):
                return
            self._journal.prefill_inactive(target)
        except OSError as exc:
            log.info("%s: the next journal file is not prefilled (%s): commits into it sync slower", self.path, exc)

    # -- subscriptions and clients (storage.subscription_state) ------------------------------------

    def new_subscription_id(self) -> int:
        return self._subs.new_subscription_id()

    def apply(self, updates: Iterable[SubUpdate]) -> None:
        self._subs.apply(updates)

    # -- lifecycle -------------------------------------------------------------------------------

    def recover(self) -> RecoveredState:
        return self._subs.recover(self._server, self.channels())

    def statistics(self) -> StoreStatistics:
        """Messages not yet checkpointed count as the journal bytes that hold them."""
        return StoreStatistics(
            self._msgs.used_bytes() + self._journal.active_bytes,
            self._msgs.map_size(),
            self._state.used_bytes(),
            self._state.map_size(),
            len(self._damaged),
        )

    def sync(self) -> None:
        if not self.synced:
            with self._append_lock:
                self._journal.flush()
            self._state.sync()

    def close(self) -> None:
        if self._check is not None:
            self._check.stop()
        clean = False
        try:
            if self._checkpoints.stop():  # opened completely (else the journal was not read)
                # A clean stop leaves an empty journal: the next open replays nothing.
                self._checkpoints.try_checkpoint()
                try:
                    with self._append_lock:
                        self._journal.mark_closed()
                        if not self.synced:
                            self._journal.flush()
                except StoreError as exc:  # the next open looks the journal over instead
                    log.warning("could not mark the journal closed: %s", exc)
                clean = True
            if not self.synced:
                for env in self._envs:
                    env.sync()  # unsynced commits of a clean stop reach the disk before the lock is let go
        finally:
            if hasattr(self, "_journal"):
                self._journal.close()
            for env in self._envs:
                env.close()
            self._envs.clear()
            try:
                if clean:
                    self._seal_state()
            finally:
                self._lock.release()

    def _seal_state(self) -> None:
        """Walk the closed state file and seal it when clean (`state_walk.seal`), while the directory is
        still ours: the next start then skips that walk if the file is unchanged."""
        state_dir = self.path / "state"
        started = time.monotonic()
        try:
            sealed = seal(state_dir)
        except OSError as exc:
            log.warning("could not seal %s after a clean stop (the next start walks it): %s", state_dir, exc)
            return
        if not sealed:
            log.error("%s: the walk after a clean stop found problems; the next start reports them", state_dir)
        else:
            log.debug("state file walked and sealed in %.3f s", time.monotonic() - started)


def _get_meta(txn: lmdb.Transaction, *, db: lmdb._Database, key: bytes) -> bytes | memoryview | None:
    return txn.get(key, db=db)
