"""`streaming-server check` and `streaming-server repair`: look over a stopped server's data directory,
and rebuild a store from everything in it that is intact.

`check` reports every problem, each naming its file, and per channel exactly which sequences would be
lost: those that fail their checksum, are missing from the message file, or were only in a damaged
part of the journal. It writes nothing.

`repair` builds new message and state files from what is intact:
- every message that passes its checksum, read through LMDB when the message file's structure
  verifies, else from a raw read of every page of it (each message carries a checksum over its own
  key, so a message found on any page is provably the one that was stored);
- every journal record that passes its checksum, those after a damaged one included;
- every subscription, position, pending entry and client record that can be read (raw pages too, when
  the state file's structure is damaged: records deleted earlier may then come back, which can only
  cause redeliveries).
The old `msgs/` and `state/` move to `damaged-<UTC time>/` in the data directory, the new ones take
their place, and the report lists exactly which sequences of which channels are lost. They stay gaps in
their channels (subscribers get the messages around them), recorded in the new message file so that
later checks do not report them again.

Both take the directory lock: the server must be stopped.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

import attrs
import lmdb

from storage.base import SCHEMA_VERSION
from storage.codec import (
    JOURNAL_RUN,
    MSG_KEY,
    PENDING_KEY,
    U32,
    U64,
    decode_channel,
    decode_lost,
    decode_record,
    encode_channel,
    encode_lost,
    encode_record,
    lost_key,
    message_timestamp,
    spans,
    value_intact,
)
from storage.dirlock import DirectoryLock
from storage.environment import Environment
from storage.errors import IntegrityError, StoreError
from storage.integrity import is_empty_or_missing, lmdb_file_problem, messages, structure_problems
from storage.journal import NAMES as JOURNAL_NAMES
from storage.journal import Seed, fsync_directory, keyed, next_record, record_at, unkeyed
from storage.records import ChannelInfo, ClientRecord, SubscriptionRecord

T = TypeVar("T")
_U16 = struct.Struct("=H")
_U64N = struct.Struct("=Q")
_NODE = struct.Struct("=HHHH")  # mn_lo, mn_hi (data size), mn_flags, mn_ksize
_PAGE_HEADER = 16
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META, _P_LEAF2, _P_SUBP = 0x01, 0x02, 0x04, 0x08, 0x20, 0x40
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 0x01, 0x02, 0x04
_WRITE_BATCH_BYTES = 32 << 20
_MSGS_DBS = ("meta", "channels", "messages")
_STATE_DBS = ("meta", "subs", "lastsent", "pending", "clients")


@attrs.frozen
class Report:
    """What `check` found or `repair` did. `lost`: per channel, the sequences that are (or would be)
    lost, as ranges; `problems`: everything else that is wrong, each naming its file."""

    directory: Path
    problems: list[str]
    lost: dict[str, list[tuple[int, int]]]
    notes: list[str] = attrs.Factory(list)
    moved_to: Path | None = None

    @property
    def clean(self) -> bool:
        return not (self.problems or self.lost)

    def lines(self) -> list[str]:
        out = list(self.problems)
        for channel, runs in sorted(self.lost.items()):
            count = sum(last - first + 1 for first, last in runs)
            seqs = ", ".join(f"{a}-{b}" if b != a else f"{a}" for a, b in runs)
            out.append(f"channel {channel!r}: {messages(count)} lost: {seqs}")
        return out + self.notes


def check(directory: str | os.PathLike[str]) -> Report:
    """Everything wrong with a stopped server's data directory; nothing is written."""
    path = Path(directory)
    with _locked(path):
        salvage = _Salvage(path)
        salvage.run(sink=None)
        return Report(path, salvage.problems, salvage.lost_ranges(), salvage.notes)


def repair(directory: str | os.PathLike[str], cluster_id: str | None = None) -> Report:
    """Rebuild the store from what is intact and move the old files aside (see the module docstring);
    an intact store is left as it is. `cluster_id` is needed only when the server record is lost with
    the message file."""
    path = Path(directory)
    with _locked(path):
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        staging = path / f".repair-{stamp}"
        staging.mkdir()
        salvage = _Salvage(path)
        writer = _Writer(staging)
        try:
            salvage.run(sink=writer)  # one pass: what is intact goes to the new files as it is read
            intact = not (salvage.problems or salvage.lost_ranges())
            if not intact:
                writer.finish(salvage, cluster_id)
        except BaseException:
            writer.close()
            shutil.rmtree(staging, ignore_errors=True)
            raise
        writer.close()
        if intact:
            shutil.rmtree(staging)
            return Report(path, [], {}, ["the store is intact: nothing to repair"])
        aside = path / f"damaged-{stamp}"
        aside.mkdir()
        for name in ("msgs", "state"):
            if (path / name).exists():
                os.rename(path / name, aside / name)
        fsync_directory(aside)
        for name in ("msgs", "state"):
            os.rename(staging / name, path / name)
        os.rmdir(staging)
        fsync_directory(path)
        notes = [*salvage.notes, f"the old files are in {aside}"]
        return Report(path, salvage.problems, salvage.lost_ranges(), notes, aside)


@contextlib.contextmanager
def _read_only(env_dir: Path, names: tuple[str, ...]) -> Iterator[tuple[lmdb.Transaction, dict[str, lmdb._Database]]]:
    """A read transaction on an environment whose structure verified (the directory is locked)."""
    env = lmdb.open(str(env_dir), readonly=True, lock=False, max_dbs=len(names))
    try:
        with env.begin() as txn:
            yield txn, {name: env.open_db(name.encode(), txn=txn, create=False) for name in names}
    finally:
        env.close()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    if not path.is_dir():
        raise StoreError(f"{path} is not a directory")
    lock = DirectoryLock(path)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


@attrs.define
class _Channel:
    info: ChannelInfo  # as the old message file had it (last_seq raised by what the journal holds)
    present: bytearray = attrs.Factory(bytearray)  # bitmap from info.first_seq: seq intact and kept
    count: int = 0
    size: int = 0
    damaged: int = 0  # values that fail their checksum
    last_ts: int = 0
    lost_before: set[int] = attrs.Factory(set)  # what an earlier repair recorded as lost

    def mark(self, seq: int, value: bytes) -> bool:
        """Count an intact message once; False if it is outside the channel or already counted."""
        index = seq - self.info.first_seq
        if index < 0 or seq > self.info.last_seq:
            return False
        byte, bit = divmod(index, 8)
        if byte >= len(self.present):
            self.present.extend(bytes(byte - len(self.present) + 1))
        if self.present[byte] & (1 << bit):
            return False
        self.present[byte] |= 1 << bit
        self.count += 1
        self.size += len(value)
        self.last_ts = max(self.last_ts, message_timestamp(value))
        return True

    def has(self, seq: int) -> bool:
        byte, bit = divmod(seq - self.info.first_seq, 8)
        return 0 <= byte < len(self.present) and bool(self.present[byte] & (1 << bit))

    def lost(self) -> list[int]:
        return [
            seq
            for seq in range(self.info.first_seq, self.info.last_seq + 1)
            if not self.has(seq) and seq not in self.lost_before
        ]

    def first_present(self) -> int:
        for index, byte in enumerate(self.present):
            if byte:
                return self.info.first_seq + index * 8 + (byte & -byte).bit_length() - 1
        return self.info.last_seq + 1


class _Salvage:
    """Reads everything the old files hold without trusting them; `run` hands each intact message to a
    sink (the writer, for repair) and collects what is wrong."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.meta: dict[bytes, bytes] = {}
        self.channels: dict[int, _Channel] = {}
        self.subs: dict[int, SubscriptionRecord] = {}
        self.last_sent: dict[int, int] = {}
        self.pending: dict[int, dict[int, int]] = {}
        self.clients: dict[str, ClientRecord] = {}
        self.state_meta: dict[bytes, bytes] = {}
        self.orphans: dict[int, int] = {}  # channel id without a channel record -> messages in LMDB
        self.unnamed = 0  # journal messages of channels without a record
        self.msgs_data = directory / "msgs" / "data.mdb"
        self.state_data = directory / "state" / "data.mdb"
        self.msgs_ok = self._file_ok(self.msgs_data)
        self.state_ok = self._file_ok(self.state_data)

    def _file_ok(self, data: Path) -> bool:
        """Whether LMDB may read the file: it is there, whole and structurally sound."""
        if is_empty_or_missing(data):
            self.problems.append(f"{data} is {'empty' if data.exists() else 'missing'}")
            return False
        problem = lmdb_file_problem(data)
        if problem is not None:
            self.problems.append(f"{data} {problem}")
            return False
        found = structure_problems(data.parent)
        if found:
            more = f" (and {len(found) - 1} more problems)" if len(found) > 1 else ""
            self.problems.append(f"{data} is damaged: {found[0]}{more}")
            return False
        return True

    # -- the whole run -------------------------------------------------------------------------

    def run(self, sink: _Writer | None) -> None:
        self._read_message_file(sink)
        self._read_journal(sink)
        self._read_state()
        self._check_positions()
        for channel in self.channels.values():
            if channel.damaged:
                self.problems.append(
                    f"{self.msgs_data}: channel {channel.info.name!r}: {messages(channel.damaged)} "
                    "with a checksum that does not match"
                )
        for cid, count in sorted(self.orphans.items()):
            self.problems.append(f"{self.msgs_data}: {messages(count)} of channel id {cid}, which has no record")
        if self.unnamed and not self.meta:
            self.problems.append(
                f"the journal holds {self.unnamed} messages of channels whose names were in {self.msgs_data}: "
                "they cannot be put back"
            )

    # -- messages --------------------------------------------------------------------------------

    def _read_message_file(self, sink: _Writer | None) -> None:
        if self.msgs_ok:
            with _read_only(self.msgs_data.parent, _MSGS_DBS) as (txn, dbs):
                self.meta = {bytes(k): bytes(v) for k, v in txn.cursor(db=dbs["meta"]).iternext()}
                for key, value in txn.cursor(db=dbs["channels"]).iternext():
                    try:
                        self._add_channel(decode_channel(value))
                    except IntegrityError as exc:
                        self.problems.append(f"{self.msgs_data}: channel record {bytes(key)!r}: {exc}")
                self._load_lost()
                for key, value in txn.cursor(db=dbs["messages"]).iternext():
                    self._take(bytes(key), bytes(value), sink)
            return
        if is_empty_or_missing(self.msgs_data):
            return
        # The structure cannot be trusted: every page, live or not, read as plain bytes.
        versions: dict[int, ChannelInfo] = {}
        for key, value in _raw_items(self.msgs_data):
            if len(key) == MSG_KEY.size:
                continue
            if key in _META_KEYS or key.startswith(b"lost/"):
                self._raw_meta(key, value)
                continue
            with contextlib.suppress(IntegrityError, UnicodeDecodeError, struct.error):
                info = decode_channel(value)
                if info.name.lower().encode() == key:
                    newest = versions.get(info.channel_id)
                    if newest is None or (info.last_seq, info.first_seq) > (newest.last_seq, newest.first_seq):
                        versions[info.channel_id] = info
        for info in versions.values():
            self._add_channel(info)
        self._load_lost()
        self.notes.append(
            f"{self.msgs_data}: channels and messages were read from every page of the damaged file; "
            "a channel deleted earlier may have come back"
        )
        for key, value in _raw_items(self.msgs_data):
            if len(key) == MSG_KEY.size:
                self._take(key, value, sink)
        for channel in self.channels.values():
            channel.damaged = 0  # freed pages hold anything: only what is lost counts here
        self.orphans.clear()

    def _raw_meta(self, key: bytes, value: bytes) -> None:
        if key == b"journal_epoch" and key in self.meta:  # the newest checkpoint is the highest
            self.meta[key] = max(self.meta[key], value)
        else:
            self.meta.setdefault(key, value)

    def _add_channel(self, info: ChannelInfo) -> None:
        self.channels[info.channel_id] = _Channel(info)

    def _load_lost(self) -> None:
        for cid, channel in self.channels.items():
            channel.lost_before = decode_lost(self.meta.get(lost_key(cid)))

    def _take(self, key: bytes, value: bytes, sink: _Writer | None) -> None:
        cid, seq = MSG_KEY.unpack(key)
        channel = self.channels.get(cid)
        if channel is None:
            self.orphans[cid] = self.orphans.get(cid, 0) + 1
        elif not value_intact(key, value):
            channel.damaged += 1
        elif channel.mark(seq, value) and sink is not None:
            sink.message(key, value)

    # -- journal ---------------------------------------------------------------------------------

    def _read_journal(self, sink: _Writer | None) -> None:
        msgs_dir = self.msgs_data.parent
        checkpointed = U64.unpack(self.meta[b"journal_epoch"])[0] if b"journal_epoch" in self.meta else 0
        key, keyed_from = self.meta.get(b"journal_key"), self.meta.get(b"journal_keyed_from")
        seed: Seed = keyed(key, U64.unpack(keyed_from)[0]) if key and keyed_from else unkeyed
        records: list[tuple[int, bytes]] = []
        sizes = self.meta.get(b"journal_sizes", b"")
        for i, name in enumerate(JOURNAL_NAMES):
            path = msgs_dir / name
            if not path.exists():
                if self.meta:
                    self.problems.append(
                        f"{path} is missing: acknowledged messages not yet copied into {self.msgs_data} may be lost"
                    )
                continue
            known = U64.unpack_from(sizes, 8 * i)[0] if len(sizes) >= 8 * (i + 1) else 0
            if path.stat().st_size < known:
                self.problems.append(f"{path} was cut short ({path.stat().st_size} bytes, it was {known})")
            fd = os.open(path, os.O_RDONLY)
            try:
                found, damaged = _salvage_file(fd, checkpointed, seed)
            finally:
                os.close(fd)
            records += found
            for start, stop in damaged:
                self.problems.append(
                    f"{path}: bytes {start}-{stop - 1} are damaged (records there fail their checksum)"
                )
        records.sort(key=lambda r: r[0])  # by epoch; each file's records are in order already
        for _, body in records:
            self._replay(body, sink)

    def _replay(self, body: bytes, sink: _Writer | None) -> None:
        offset = 0
        try:
            while offset < len(body):
                channel_id, first, _ts, count = JOURNAL_RUN.unpack_from(body, offset)
                offset += JOURNAL_RUN.size
                channel = self.channels.get(channel_id)
                for seq in range(first, first + count):
                    (size,) = U32.unpack_from(body, offset)
                    value = body[offset + U32.size : offset + U32.size + size]
                    offset += U32.size + size
                    if channel is None:  # deleted since, or its record lost with the message file
                        self.unnamed += 1
                        continue
                    if seq > channel.info.last_seq:
                        channel.info = attrs.evolve(channel.info, last_seq=seq)
                    key = MSG_KEY.pack(channel_id, seq)
                    if value_intact(key, value) and channel.mark(seq, value) and sink is not None:
                        sink.message(key, value)
        except struct.error:
            self.problems.append(f"{self.msgs_data.parent}: a journal record is malformed")

    # -- state -------------------------------------------------------------------------------------

    def _read_state(self) -> None:
        if self.state_ok:
            with _read_only(self.state_data.parent, _STATE_DBS) as (txn, dbs):
                self.state_meta = {bytes(k): bytes(v) for k, v in txn.cursor(db=dbs["meta"]).iternext()}
                for k, v in txn.cursor(db=dbs["subs"]).iternext():
                    self._sub(bytes(k), bytes(v), strict=True)
                for k, v in txn.cursor(db=dbs["lastsent"]).iternext():
                    self.last_sent[U64.unpack(k)[0]] = U64.unpack(v)[0]
                for k, v in txn.cursor(db=dbs["pending"]).iternext():
                    sub_id, seq = PENDING_KEY.unpack(k)
                    self.pending.setdefault(sub_id, {})[seq] = U32.unpack(v)[0]
                for k, v in txn.cursor(db=dbs["clients"]).iternext():
                    self._client(bytes(k), bytes(v), strict=True)
            return
        if is_empty_or_missing(self.state_data):
            if self.channels:
                self.notes.append("no subscription or client survives: clients must connect and subscribe again")
            return
        for key, value in _raw_items(self.state_data):
            if len(key) == PENDING_KEY.size and len(value) == U32.size:
                sub_id, seq = PENDING_KEY.unpack(key)
                entries = self.pending.setdefault(sub_id, {})
                entries[seq] = max(entries.get(seq, 0), U32.unpack(value)[0])
            elif len(key) == U64.size and len(value) == U64.size:
                sub_id = U64.unpack(key)[0]
                self.last_sent[sub_id] = max(self.last_sent.get(sub_id, 0), U64.unpack(value)[0])
            elif value[:1] == b"{":
                if len(key) == U64.size:
                    self._sub(key, value, strict=False)
                else:
                    self._client(key, value, strict=False)
            elif key in (b"schema_version", b"next_sub_id"):
                self.state_meta[key] = max(self.state_meta.get(key, value), value)
        self.notes.append(
            f"{self.state_data}: subscriptions and clients were read from every page of the damaged file; "
            "some deleted earlier may have come back, and acknowledged messages may be delivered again"
        )

    def _sub(self, key: bytes, value: bytes, *, strict: bool) -> None:
        sub_id = U64.unpack(key)[0]
        record = self._decode(value, SubscriptionRecord, f"subscription {sub_id}", strict)
        if record is not None and record.sub_id == sub_id:
            self.subs[sub_id] = record

    def _client(self, key: bytes, value: bytes, *, strict: bool) -> None:
        record = self._decode(value, ClientRecord, f"client {key.decode(errors='replace')!r}", strict)
        if record is not None and record.client_id.encode() == key:
            self.clients[record.client_id] = record

    def _decode(self, value: bytes, cls: type[T], what: str, strict: bool) -> T | None:
        """A state record, or None if it does not decode (a problem, when read from a sound file:
        from stray pages, anything can be there)."""
        try:
            return decode_record(value, cls)
        except IntegrityError as exc:
            if strict:
                self.problems.append(f"{self.state_data}: {what}: {exc}")
            return None

    def _check_positions(self) -> None:
        """Subscriptions must point into channels that exist, no further than their last message."""
        by_name = {c.info.name: c for c in self.channels.values()}
        for sub_id, record in sorted(self.subs.items()):
            channel = by_name.get(record.channel)
            who = f"subscription {sub_id} of client {record.client_id!r}"
            if channel is None:
                self.problems.append(f"{self.state_data}: {who} is on channel {record.channel!r}, which is gone")
                continue
            own = self.pending.get(sub_id, {})
            position = max(self.last_sent.get(sub_id, record.last_sent), max(own, default=0))
            last = channel.info.last_seq
            if position > last:
                self.problems.append(
                    f"{self.state_data}: {who} was sent channel {record.channel!r} up to {position}, but the "
                    f"channel's messages end at {last}: {last + 1}-{position} are lost"
                )
                channel.info = attrs.evolve(channel.info, last_seq=position)

    # -- results -----------------------------------------------------------------------------------

    def lost_ranges(self) -> dict[str, list[tuple[int, int]]]:
        out: dict[str, list[tuple[int, int]]] = {}
        for channel in self.channels.values():
            lost = channel.lost()
            if lost:
                out[channel.info.name] = spans(lost)
        return out


_META_KEYS = (
    b"cluster_id",
    b"created_unix_ns",
    b"schema_version",
    b"journal_key",
    b"journal_keyed_from",
    b"journal_epoch",
    b"journal_sizes",
    b"next_channel_id",
)


def _salvage_file(fd: int, checkpointed: int, seed: Seed) -> tuple[list[tuple[int, bytes]], list[tuple[int, int]]]:
    """Every valid record at the start of a journal file (older than the checkpoint too: a second copy of
    what LMDB holds), those past a damaged stretch included, and the damaged stretches (start, stop)
    between them. A stretch that nothing newer than the checkpoint follows is a torn tail or stale
    bytes, not damage."""
    size = os.fstat(fd).st_size
    records: list[tuple[int, bytes]] = []
    damaged: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        found = record_at(fd, offset, size, seed)
        if found is not None:
            epoch, body = found
            if not body:  # the clean-close marker: nothing follows it
                break
            records.append((epoch, body))  # older than the checkpoint too: a second copy of what LMDB holds
            offset += 16 + len(body)
            continue
        following = next_record(fd, offset + 1, size, checkpointed, seed)
        if following is None:
            break
        damaged.append((offset, following))
        offset = following
    return records, damaged


def _raw_items(data_file: Path) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) on every leaf page of an LMDB data file, live or freed, read with plain reads
    and bounds-checked: nothing in the file can make this fail or read outside it."""
    size = data_file.stat().st_size
    with open(data_file, "rb") as f:
        psize = _page_size(f)
        for pgno in range(2, size // psize):
            f.seek(pgno * psize)
            page = f.read(psize)
            flags = _U16.unpack_from(page, 10)[0]
            if flags & ~0x7F or not flags & _P_LEAF or flags & (_P_BRANCH | _P_OVERFLOW | _P_META | _P_LEAF2 | _P_SUBP):
                continue
            lower, upper = _U16.unpack_from(page, 12)[0], _U16.unpack_from(page, 14)[0]
            if lower < _PAGE_HEADER or upper > psize or lower > upper:
                continue
            for i in range((lower - _PAGE_HEADER) >> 1):
                node = _U16.unpack_from(page, _PAGE_HEADER + 2 * i)[0]
                if node < upper or node + _NODE.size > psize:
                    continue
                lo, hi, nflags, ksize = _NODE.unpack_from(page, node)
                dsize, koff = lo | (hi << 16), node + _NODE.size
                doff = koff + ksize
                if doff > psize or nflags & (_F_SUBDATA | _F_DUPDATA):
                    continue
                key = page[koff:doff]
                if nflags & _F_BIGDATA:
                    if doff + 8 > psize:
                        continue
                    start = _U64N.unpack_from(page, doff)[0] * psize + _PAGE_HEADER
                    if start < 2 * psize or start + dsize > size:
                        continue
                    f.seek(start)
                    value = f.read(dsize)
                elif doff + dsize <= psize:
                    value = page[doff : doff + dsize]
                else:
                    continue
                yield key, value


def _page_size(f: BinaryIO) -> int:
    """The page size the first meta page gives, else the usual 4096."""
    f.seek(0)
    head = f.read(_PAGE_HEADER + 64)
    if len(head) >= _PAGE_HEADER + 28:
        psize = struct.unpack_from("=I", head, _PAGE_HEADER + 24)[0]
        if 512 <= psize <= 65536 and not psize & (psize - 1):
            return int(psize)
    return 4096


class _Writer:
    """The new message and state files, written in `staging` (then moved into place)."""

    def __init__(self, staging: Path) -> None:
        self.staging = staging
        self.msgs = Environment(staging / "msgs", _MSGS_DBS, 64 << 20, 1 << 40)
        self.state = Environment(staging / "state", _STATE_DBS, 16 << 20, 1 << 40, metasync=False)
        self._batch: list[tuple[bytes, bytes]] = []
        self._batch_bytes = 0

    def message(self, key: bytes, value: bytes) -> None:
        self._batch.append((key, value))
        self._batch_bytes += len(value)
        if self._batch_bytes >= _WRITE_BATCH_BYTES:
            self._flush()

    def _flush(self) -> None:
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if batch:
            db = self.msgs.dbs["messages"]
            self.msgs.write(lambda txn: txn.cursor(db=db).putmulti(batch, overwrite=False))

    def finish(self, salvage: _Salvage, given_cluster_id: str | None) -> None:
        self._flush()
        meta = salvage.meta
        created = meta.get(b"created_unix_ns")
        cluster_id = meta.get(b"cluster_id") or (given_cluster_id.encode() if given_cluster_id else None)
        if cluster_id is None:
            raise StoreError(
                f"{salvage.msgs_data}: the server record is lost with the file: give the cluster ID to rebuild the "
                "store for (--cluster_id)"
            )
        if not salvage.channels and not meta:
            salvage.notes.append("every channel and message is lost with the message file")
        by_name: dict[str, ChannelInfo] = {}

        def write_msgs(txn: lmdb.Transaction) -> None:
            dbs = self.msgs.dbs
            txn.put(b"cluster_id", cluster_id, db=dbs["meta"])
            txn.put(b"created_unix_ns", created or U64.pack(0), db=dbs["meta"])
            txn.put(b"schema_version", U32.pack(SCHEMA_VERSION), db=dbs["meta"])
            txn.put(b"journal_key", secrets.token_bytes(16), db=dbs["meta"])
            txn.put(b"journal_keyed_from", U64.pack(0), db=dbs["meta"])
            highest = max(salvage.channels, default=0)
            stored_next = meta.get(b"next_channel_id")
            next_id = max(highest + 1, U32.unpack(stored_next)[0] if stored_next else 1)
            txn.put(b"next_channel_id", U32.pack(next_id), db=dbs["meta"])
            for cid, channel in salvage.channels.items():
                old = channel.info
                lost = sorted(channel.lost_before | set(channel.lost()))
                info = attrs.evolve(
                    old,
                    first_seq=channel.first_present(),
                    msgs=channel.count,
                    bytes=channel.size,
                    last_timestamp_unix_ns=max(old.last_timestamp_unix_ns, channel.last_ts),
                )
                by_name[info.name] = info
                txn.put(info.name.lower().encode(), encode_channel(info), db=dbs["channels"])
                kept = [seq for seq in lost if seq >= info.first_seq]
                if kept:
                    txn.put(lost_key(cid), encode_lost(kept), db=dbs["meta"])

        self.msgs.write(write_msgs)

        def write_state(txn: lmdb.Transaction) -> None:
            dbs = self.state.dbs
            txn.put(b"schema_version", U32.pack(SCHEMA_VERSION), db=dbs["meta"])
            next_sub = salvage.state_meta.get(b"next_sub_id")
            highest = max(salvage.subs, default=0)
            txn.put(
                b"next_sub_id", U64.pack(max(highest + 1, U64.unpack(next_sub)[0] if next_sub else 1)), db=dbs["meta"]
            )
            for sub_id, record in salvage.subs.items():
                channel = by_name.get(record.channel)
                if channel is None:
                    continue  # reported: its channel is gone
                key = U64.pack(sub_id)
                position = min(salvage.last_sent.get(sub_id, record.last_sent), channel.last_seq)
                txn.put(key, encode_record(attrs.evolve(record, last_sent=position)), db=dbs["subs"])
                txn.put(key, U64.pack(position), db=dbs["lastsent"])
                for seq, attempt in salvage.pending.get(sub_id, {}).items():
                    if seq <= channel.last_seq:
                        txn.put(PENDING_KEY.pack(sub_id, seq), U32.pack(attempt), db=dbs["pending"])
            for client in salvage.clients.values():
                txn.put(client.client_id.encode(), encode_record(client), db=dbs["clients"])

        self.state.write(write_state)
        self.state.sync()
        for name in JOURNAL_NAMES:
            fd = os.open(self.staging / "msgs" / name, os.O_RDWR | os.O_CREAT, 0o644)
            os.fsync(fd)
            os.close(fd)
        fsync_directory(self.staging / "msgs")
        fsync_directory(self.staging)
        salvage.notes.append(
            f"kept {sum(c.count for c in salvage.channels.values())} messages on {len(salvage.channels)} channels, "
            f"{len([s for s in salvage.subs.values() if s.channel in by_name])} subscriptions, "
            f"{len(salvage.clients)} clients"
        )

    def close(self) -> None:
        self.msgs.close()
        self.state.close()
