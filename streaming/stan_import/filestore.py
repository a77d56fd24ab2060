"""Reading a nats-streaming-server FileStore directory, offline and without writing to it.

    server.dat            the server record (cluster ID, subjects, a clustered node's ID)
    clients.dat           registered clients: typed records, add (1) and delete (2)
    <channel>/msgs.N.dat  messages, slice N (any N; gaps allowed), and msgs.N.idx, its index
    <channel>/subs.dat    subscriptions: new (1), update (2), delete (3), ack (4), sent (5)

Each slice is bounded the way the server recovers it: by its index when the index is whole and its
last entry points at a whole record holding that sequence (records past it were never acknowledged,
and the server ignores them too), else by the data file itself (the server rebuilds the index then:
the data file wins). The data file is then read once, straight through: every record's checksum
checked, the sequences consecutive where the index vouched for them. A record cut short at the end of
a file is refused (`TornRecordError`) unless `drop_partial_tail`, which leaves it out and says which
message it was. Memory stays flat: a file is memory-mapped, and its pages let go as they are read.
Subscriptions are replayed as the server does: last-sent follows the sent records even once those
messages are acknowledged, an update replaces the state but keeps the pending set.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import attrs
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from storage import Message
from streaming.stan_import.crypto import ChannelDecryptor, DecryptionError, LooksEncrypted
from streaming.stan_import.framing import (
    HEADER,
    INDEX_BODY,
    INDEX_ENTRY,
    VERSION,
    Crc32,
    DamagedRecordError,
    IndexEntry,
    Record,
    StanFormatError,
    TornRecordError,
    check_version,
    index_entries,
    read_record,
    records,
)
from streaming.stan_import.model import (
    RECORD_OVERHEAD,
    Progress,
    ReadOptions,
    RefusedError,
    StanChannel,
    StanStore,
    StanSubscription,
)
from streaming.stan_import.spb.store_pb2 import (
    ClientDelete,
    ClientInfo,
    ServerInfo,
    SubState,
    SubStateDelete,
    SubStateUpdate,
)
from streaming.wire.stan_pb.protocol_pb2 import MsgProto

M = TypeVar("M", bound=ProtoMessage)
SLICE = re.compile(r"msgs\.(\d+)\.dat")
ADD_CLIENT, DEL_CLIENT = 1, 2
SUB_NEW, SUB_UPDATE, SUB_DEL, SUB_ACK, SUB_MSG = 1, 2, 3, 4, 5
PROGRESS_EVERY = 4096  # messages between calls of a progress callback
RELEASE_EVERY = 8 << 20  # bytes of a data file read before their pages are let go (memory stays flat)


@contextmanager
def _mapped(path: Path) -> Iterator[memoryview]:
    """A whole file, read-only, memory-mapped (pages are read as needed and let go at the end)."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                yield view
            finally:
                view.release()


def _decode(cls: type[M], record: Record, path: str) -> M:
    parsed = cls()
    try:
        parsed.ParseFromString(record.payload)
    except DecodeError as exc:
        raise DamagedRecordError(path, record.offset, f"record is not a valid {cls.__name__}: {exc}") from None
    return parsed


class FileStoreReader:
    """One FileStore directory. `read()` checks its server record, lock, clients and every channel's
    bounds and subscriptions, and returns a StanStore whose channels stream their messages."""

    def __init__(self, root: str | os.PathLike[str], options: ReadOptions) -> None:
        self.root = Path(root)
        self.options = options
        self._crc = options.crc()
        self._notes: list[str] = []  # in order, each once (a slice that is scanned is read twice)
        self._torn: dict[str, int] = {}  # file -> offset of the torn record left out

    def _note(self, line: str) -> None:
        if line not in self._notes:  # a few lines at most
            self._notes.append(line)

    def read(self) -> StanStore:
        if not (self.root / "server.dat").is_file():
            raise RefusedError(f"{self.root}: no server.dat here: not a nats-streaming-server file store")
        self._check_unlocked()
        server = self._server()
        clients = self._clients()
        channels = [self._channel(d) for d in sorted(self.root.iterdir(), key=lambda p: p.name) if d.is_dir()]
        return StanStore(server, clients, channels, self._notes)

    # -- the root's files ---------------------------------------------------------------------------

    def _check_unlocked(self) -> None:
        """A fault-tolerant server holds a lock on .rootdir.lck while it runs: refuse a store in use."""
        lock = self.root / ".rootdir.lck"
        if not lock.exists():
            return
        with lock.open("rb") as f:
            try:
                fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                raise RefusedError(
                    f"{lock} is locked: a nats-streaming-server is running on this store; stop it first"
                ) from None
            fcntl.lockf(f, fcntl.LOCK_UN)

    def _records(self, path: Path, data: memoryview, *, typed: bool) -> Iterator[Record]:
        """The records of a whole typed or untyped file; a torn last record ends it when allowed."""
        name = self._name(path)
        if len(data) == 0:
            self._note(f"{name}: empty file (not even its version word): read as holding nothing")
            return
        end = VERSION.size
        try:
            for record in records(data, path=name, typed=typed, crc=self._crc):
                yield record
                end = record.end
        except TornRecordError as exc:
            if not self.options.drop_partial_tail:
                raise
            self._torn[name] = exc.offset
            self._note(f"{name}: dropped the torn record at byte {exc.offset} ({exc.why})")
            return
        if end < len(data):
            self._note(f"{name}: zero padding from byte {end} on, ignored (as the server does)")

    def _name(self, path: Path) -> str:
        return str(path.relative_to(self.root)) if path.is_relative_to(self.root) else str(path)

    def _server(self) -> ServerInfo:
        path = self.root / "server.dat"
        with _mapped(path) as data:
            found = list(self._records(path, data, typed=False))
        if not found:
            raise RefusedError(
                f"{path}: holds no server record (a store whose first start never finished): nothing to import"
            )
        info = _decode(ServerInfo, found[0], self._name(path))
        if len(found) > 1:
            raise DamagedRecordError(self._name(path), found[1].offset, "a second server record")
        return info

    def _clients(self) -> dict[str, ClientInfo]:
        path = self.root / "clients.dat"
        clients: dict[str, ClientInfo] = {}
        if not path.exists():
            self._note("clients.dat: missing: no registered clients")
            return clients
        name = self._name(path)
        with _mapped(path) as data:
            for record in self._records(path, data, typed=True):
                if record.kind == ADD_CLIENT:
                    info = _decode(ClientInfo, record, name)
                    clients[info.ID] = info
                elif record.kind == DEL_CLIENT:
                    gone = _decode(ClientDelete, record, name)
                    clients.pop(gone.ID, None)
                else:
                    raise DamagedRecordError(name, record.offset, f"unknown client record type {record.kind}")
        return clients

    # -- channels ---------------------------------------------------------------------------------

    def _channel(self, directory: Path) -> StanChannel:
        slices = sorted(
            (int(m.group(1)), directory / m.group(0))
            for m in (SLICE.fullmatch(p.name) for p in directory.iterdir())
            if m is not None
        )
        surveys = [self._survey(path) for _, path in slices]
        surveys = [s for s in surveys if s.msgs]
        first = min((s.first for s in surveys), default=0)
        last = max((s.last for s in surveys), default=0)
        subs = self._subscriptions(directory)
        # A channel whose messages all expired keeps its last sequence only in its subscriptions'
        # positions (the server keeps it in an empty slice, which a restart does not read back).
        if not surveys:
            last = max([s.state.lastSent for s in subs] + [0])
            first = last + 1
        prev = 0
        for s in surveys:
            if s.first <= prev:
                raise DamagedRecordError(
                    self._name(s.path), 4, f"slice starts at {s.first}, after {prev} in the slice before"
                )
            prev = s.last
        channel = directory.name
        decryptor = (
            ChannelDecryptor(self.options.encryption_key, channel) if self.options.encryption_key is not None else None
        )

        def messages(progress: Progress | None = None) -> Iterator[Message]:
            looks = LooksEncrypted(channel) if decryptor is None else None
            for survey in surveys:
                yield from self._messages(channel, survey, decryptor, looks, progress)
            if looks is not None:
                looks.check()

        return StanChannel(
            channel,
            first or last + 1,
            last,
            sum(s.msgs for s in surveys),
            sum(s.bytes for s in surveys),
            subs,
            messages,
        )

    def _survey(self, path: Path) -> _Slice:
        """A slice's bounds, and whether its index can be trusted (its last entry checked against the
        data file, as the server does); otherwise the data file is scanned."""
        index = path.with_suffix(".idx")
        name = self._name(path)
        with _mapped(path) as data:
            if len(data) == 0:
                self._note(f"{name}: empty file (not even its version word): read as holding nothing")
                return _Slice(path, False, 0, 0, 0, 0, len(data))
            check_version(bytes(data[: VERSION.size]), name)
            trusted = self._trusted_index(index, data)
            if trusted is not None:
                first, last, count, size, end = trusted
                if end < len(data):
                    self._note(
                        f"{name}: {len(data) - end} bytes after the last indexed message (written as the server "
                        "stopped, never acknowledged): ignored, as the server does"
                    )
                return _Slice(path, True, first, last, count, size, end)
            first, last, count, size, end = 0, 0, 0, 0, VERSION.size
            for record in self._records(path, data, typed=False):
                msg = _message(record, name)
                first = first or msg.sequence
                if msg.sequence <= last:
                    raise DamagedRecordError(name, record.offset, f"message {msg.sequence} after {last}")
                last, count, size, end = msg.sequence, count + 1, size + len(record.payload), record.end
            if name in self._torn:
                self._note(f"{name}: the torn record was message {self._torn_seq(index, self._torn[name], last)}")
            return _Slice(path, False, first, last, count, size + RECORD_OVERHEAD * count, end)

    def _torn_seq(self, index: Path, offset: int, last: int) -> int:
        """Which message the torn record at `offset` was (its index entry's sequence, else the next one)."""
        seq = last + 1
        if index.exists():
            with _mapped(index) as data:
                try:
                    for entry in index_entries(data, path=self._name(index), crc=self._crc or Crc32()):
                        if entry.offset == offset:
                            seq = entry.seq
                except StanFormatError:
                    pass
        return seq

    def _trusted_index(self, index: Path, data: memoryview) -> tuple[int, int, int, int, int] | None:
        """(first, last, count, bytes, end of the last record) from the index, if it is whole and its
        first and last entries are intact, the last pointing at a whole, intact record of its sequence
        in the data file (what the server checks); else None. The entries between are not read: the
        data file is read whole anyway, each record checked, in sequence."""
        if not index.exists():
            return None
        name = self._name(index)
        crc = self._crc or Crc32()
        with _mapped(index) as entries:
            try:
                check_version(bytes(entries[: VERSION.size]), name)
                count, part = divmod(len(entries) - VERSION.size, INDEX_ENTRY.size)
                if part:
                    raise TornRecordError(name, len(entries) - part, "the index ends inside an entry")
                zero = bytes(INDEX_ENTRY.size)
                while count and entries[_entry_at(count - 1) : _entry_at(count)] == zero:
                    count -= 1  # zero padding
                if not count:
                    return None
                first_entry, last_entry = _entry(entries, 0, name, crc), _entry(entries, count - 1, name, crc)
            except StanFormatError as exc:
                self._note(f"{name}: {exc.why} at byte {exc.offset}: rebuilt from the data file")
                return None
        try:
            record = read_record(data, last_entry.offset, path=name, typed=False, crc=crc)
            msg = _message(record, name) if record is not None and len(record.payload) == last_entry.size else None
        except StanFormatError:
            msg = None
        if msg is None or msg.sequence != last_entry.seq or last_entry.seq - first_entry.seq + 1 != count:
            self._note(f"{name}: does not match its data file: rebuilt from the data file")
            return None
        end = last_entry.offset + HEADER.size + last_entry.size
        size = end - VERSION.size - HEADER.size * count  # the records are back to back
        return first_entry.seq, last_entry.seq, count, size + RECORD_OVERHEAD * count, end

    def _messages(
        self,
        channel: str,
        survey: _Slice,
        decryptor: ChannelDecryptor | None,
        looks: LooksEncrypted | None,
        progress: Progress | None,
    ) -> Iterator[Message]:
        """The slice's messages, read straight through its data file up to where the survey says it
        ends: every record's checksum checked, sequences in order (consecutive when the index said so,
        as the server writes them), and as many as the survey counted. This is the importer's hot
        loop: one pass, names bound locally."""
        name = self._name(survey.path)
        unpack, parse, crc = HEADER.unpack_from, MsgProto.FromString, self._crc
        check = None if crc is None else crc.function
        decrypt = None if decryptor is None else decryptor.decrypt
        end, expect, count, released = survey.end, survey.first, 0, 0
        # The map itself, not a view of it: its slices are bytes, and nothing holds it open after.
        with survey.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            offset = VERSION.size
            while offset < end:
                size, stored = unpack(data, offset) if offset + HEADER.size <= end else (end, 0)
                start = offset + HEADER.size
                payload = data[start : start + size]
                if start + size > end or (check is not None and check(payload) != stored):
                    with memoryview(data) as view:  # let go before the map closes, whatever is raised
                        read_record(view, offset, path=name, typed=False, crc=crc)  # raises, saying what is wrong
                    raise DamagedRecordError(name, offset, f"a record runs past message {survey.last}")
                try:
                    msg = parse(payload)
                except DecodeError as exc:
                    raise DamagedRecordError(name, offset, f"record is not a message: {exc}") from None
                seq = msg.sequence
                if seq != expect and (survey.indexed or seq < expect):
                    raise DamagedRecordError(name, offset, f"holds message {seq} where {expect} comes next")
                body = msg.data
                if body:
                    if decrypt is not None:
                        try:
                            body = decrypt(body)
                        except DecryptionError as exc:
                            raise DecryptionError(f"{name}: message {seq}: {exc}") from None
                    elif looks is not None and not looks.see(body):
                        looks = None  # one payload in the clear: the channel is not encrypted
                yield Message(seq, msg.timestamp, channel, msg.reply, body)
                count += 1
                expect = seq + 1
                offset = start + size
                if not count % PROGRESS_EVERY:
                    if progress is not None:
                        progress(PROGRESS_EVERY)
                    if offset - released >= RELEASE_EVERY:  # what is read need not stay resident
                        upto = offset - offset % mmap.PAGESIZE
                        data.madvise(mmap.MADV_DONTNEED, released, upto - released)
                        released = upto
        if progress is not None:
            progress(count % PROGRESS_EVERY)
        if count != survey.msgs:
            raise DamagedRecordError(name, offset, f"holds {count} messages where {survey.msgs} were counted")

    # -- subscriptions ------------------------------------------------------------------------------

    def _subscriptions(self, directory: Path) -> list[StanSubscription]:
        """The channel's subscriptions as the server replays subs.dat (their IDs are the server's own,
        per channel: ours are given anew)."""
        path = directory / "subs.dat"
        subs: dict[int, StanSubscription] = {}
        if not path.exists():
            return []
        name = self._name(path)
        with _mapped(path) as data:
            for record in self._records(path, data, typed=True):
                if record.kind in (SUB_NEW, SUB_UPDATE):
                    state = _decode(SubState, record, name)
                    existing = subs.get(state.ID)
                    if record.kind == SUB_UPDATE and existing is not None:
                        existing.state = state  # the pending set stays
                    else:
                        subs[state.ID] = StanSubscription(state)
                elif record.kind == SUB_DEL:
                    gone = _decode(SubStateDelete, record, name)
                    subs.pop(gone.ID, None)
                elif record.kind in (SUB_ACK, SUB_MSG):
                    update = _decode(SubStateUpdate, record, name)
                    sub = subs.get(update.ID)
                    if sub is None:
                        continue
                    if record.kind == SUB_MSG:
                        sub.state.lastSent = max(sub.state.lastSent, update.seqno)
                        sub.pending.add(update.seqno)
                    else:
                        sub.pending.discard(update.seqno)
                else:
                    raise DamagedRecordError(name, record.offset, f"unknown subscription record type {record.kind}")
        return sorted(subs.values(), key=lambda s: s.state.ID)


@attrs.frozen
class _Slice:
    path: Path
    indexed: bool  # read through its index (else by a scan of the data file)
    first: int
    last: int
    msgs: int
    bytes: int
    end: int  # where what is read of the data file ends


def _entry_at(n: int) -> int:
    return VERSION.size + n * INDEX_ENTRY.size


def _entry(entries: memoryview, n: int, name: str, crc: Crc32) -> IndexEntry:
    """Entry `n` of an index (its checksum checked)."""
    at = _entry_at(n)
    seq, offset, timestamp, size, stored = INDEX_ENTRY.unpack_from(entries, at)
    if crc(entries[at : at + INDEX_BODY]) != stored:
        raise DamagedRecordError(name, at, "index entry checksum mismatch")
    return IndexEntry(seq, offset, timestamp, size)


def _message(record: Record | None, name: str) -> MsgProto:
    if record is None:
        raise DamagedRecordError(name, 0, "no record where one was expected")
    msg = MsgProto()
    try:
        msg.ParseFromString(record.payload)
    except DecodeError as exc:
        raise DamagedRecordError(name, record.offset, f"record is not a message: {exc}") from None
    if msg.sequence == 0:
        raise DamagedRecordError(name, record.offset, "message with sequence 0")
    return msg
