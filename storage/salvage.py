"""Salvaging a damaged store: reading everything in it that is intact, for `check` (which reports what
is lost) and `repair` (which writes it into new files as it is read, through a `Sink`).

- every message that passes its checksum, read through LMDB when the message file's structure
  verifies, else from a raw read of every page of it (storage.lmdb_pages: each message carries a
  checksum over its own key, so a message found on any page is provably the one that was stored);
- every journal record that passes its checksum, those after a damaged one included;
- every subscription, position, pending entry and client record that can be read (raw pages too,
  when the state file's structure is damaged: records deleted earlier may then come back, which can
  only cause redeliveries).
"""

from __future__ import annotations

import contextlib
import functools
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, TypeVar

import attrs
import lmdb

from storage.codec import (
    JOURNAL_RUN,
    MSG_KEY,
    NAKED_PENDING,
    PENDING_KEY,
    U32,
    U64,
    decode_channel,
    decode_lost,
    decode_record,
    lost_key,
    message_timestamp,
    subtract_spans,
    value_intact,
)
from storage.errors import IntegrityError
from storage.integrity import is_empty_or_missing, lmdb_file_problem, messages
from storage.journal import NAMES as JOURNAL_NAMES
from storage.journal import Seed, keyed, salvage_records, unkeyed
from storage.lmdb_pages import raw_items
from storage.records import ChannelInfo, ClientRecord, SubscriptionRecord
from storage.state_walk import structure_problems

T = TypeVar("T")
MSGS_DBS = ("meta", "channels", "messages")
STATE_DBS = ("meta", "subs", "lastsent", "pending", "clients")


class Sink(Protocol):
    """Where salvaged messages go as they are read (repair's new message file)."""

    def message(self, key: bytes, value: bytes) -> None: ...


@contextlib.contextmanager
def _read_only(env_dir: Path, names: tuple[str, ...]) -> Iterator[tuple[lmdb.Transaction, dict[str, lmdb._Database]]]:
    """A read transaction on an environment whose structure verified (the directory is locked)."""
    env = lmdb.open(str(env_dir), readonly=True, lock=False, max_dbs=len(names))
    try:
        with env.begin() as txn:
            yield txn, {name: env.open_db(name.encode(), txn=txn, create=False) for name in names}
    finally:
        env.close()


@attrs.define
class SalvagedChannel:
    info: ChannelInfo  # as the old message file had it (last_seq raised by what the journal holds)
    present: bytearray = attrs.Factory(bytearray)  # bitmap from info.first_seq: seq intact and kept
    count: int = 0
    size: int = 0
    damaged: int = 0  # values that fail their checksum
    last_ts: int = 0
    lost_before: list[tuple[int, int]] = attrs.Factory(list)  # runs an earlier repair recorded as lost

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

    def lost(self) -> list[tuple[int, int]]:
        """The runs of the channel's sequences not found intact, less those an earlier repair recorded
        as lost: worked out from the bitmap, so a run past the last message found (a position a
        subscription claims) costs one step however long it is."""
        first, last = self.info.first_seq, self.info.last_seq
        runs: list[tuple[int, int]] = []
        start = None  # the first sequence of the run being gathered
        for index, byte in enumerate(self.present):
            if byte == 0xFF:
                if start is not None:
                    runs.append((start, first + index * 8 - 1))
                    start = None
                continue
            for bit in range(8):
                seq = first + index * 8 + bit
                if byte & (1 << bit):
                    if start is not None:
                        runs.append((start, seq - 1))
                        start = None
                elif start is None:
                    start = seq
        tail = first + len(self.present) * 8
        if start is not None:
            runs.append((start, last))
        elif tail <= last:
            runs.append((tail, last))
        runs = [(a, min(b, last)) for a, b in runs if a <= last]
        return subtract_spans(runs, self.lost_before)

    def first_present(self) -> int:
        for index, byte in enumerate(self.present):
            if byte:
                return self.info.first_seq + index * 8 + (byte & -byte).bit_length() - 1
        return self.info.last_seq + 1


class Salvage:
    """Reads everything the old files hold without trusting them; `run` hands each intact message to a
    sink (the writer, for repair) and collects what is wrong."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.meta: dict[bytes, bytes] = {}
        self.channels: dict[int, SalvagedChannel] = {}
        self.subs: dict[int, SubscriptionRecord] = {}
        self.last_sent: dict[int, int] = {}
        self.pending: dict[int, dict[int, int]] = {}
        self.state_from_pages = False  # read from the raw pages of a damaged state file
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
        walk = functools.cache(functools.partial(structure_problems, data.parent))  # once, for both checks
        problem = lmdb_file_problem(data, walk)
        if problem is not None:
            self.problems.append(f"{data} {problem}")
            return False
        found = walk()
        if found:
            more = f" (and {len(found) - 1} more problems)" if len(found) > 1 else ""
            self.problems.append(f"{data} is damaged: {found[0]}{more}")
            return False
        return True

    # -- the whole run -------------------------------------------------------------------------

    def run(self, sink: Sink | None) -> None:
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

    def _read_message_file(self, sink: Sink | None) -> None:
        if self.msgs_ok:
            with _read_only(self.msgs_data.parent, MSGS_DBS) as (txn, dbs):
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
        for key, value in raw_items(self.msgs_data):
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
        for key, value in raw_items(self.msgs_data):
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
        self.channels[info.channel_id] = SalvagedChannel(info)

    def _load_lost(self) -> None:
        for cid, channel in self.channels.items():
            channel.lost_before = decode_lost(self.meta.get(lost_key(cid)))

    def _take(self, key: bytes, value: bytes, sink: Sink | None) -> None:
        if len(key) != MSG_KEY.size:  # a damaged key in sound pages: which message it was is lost
            self.problems.append(f"{self.msgs_data}: a message's key is damaged ({len(key)} bytes): left out")
            return
        cid, seq = MSG_KEY.unpack(key)
        channel = self.channels.get(cid)
        if channel is None:
            self.orphans[cid] = self.orphans.get(cid, 0) + 1
        elif not value_intact(key, value):
            channel.damaged += 1
        elif channel.mark(seq, value) and sink is not None:
            sink.message(key, value)

    # -- journal ---------------------------------------------------------------------------------

    def _read_journal(self, sink: Sink | None) -> None:
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
                found, damaged = salvage_records(fd, checkpointed, seed)
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

    def _replay(self, body: bytes, sink: Sink | None) -> None:
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
            try:
                self._read_sound_state()
                return
            except lmdb.Error as exc:
                # Sound pages, but not what the store wrote (a database's name damaged, so LMDB finds
                # no such database): read page by page, as a damaged file is.
                self.problems.append(f"{self.state_data}: LMDB cannot read it ({exc}): read page by page")
                self.subs, self.last_sent, self.pending, self.clients, self.state_meta = {}, {}, {}, {}, {}
        self._read_state_pages()

    def _read_sound_state(self) -> None:
        """The state file as LMDB reads it (its structure walked clean)."""
        with _read_only(self.state_data.parent, STATE_DBS) as (txn, dbs):
            self.state_meta = {bytes(k): bytes(v) for k, v in txn.cursor(db=dbs["meta"]).iternext()}
            for k, v in txn.cursor(db=dbs["subs"]).iternext():
                self._sub(bytes(k), bytes(v), strict=True)
            for k, v in txn.cursor(db=dbs["lastsent"]).iternext():
                if len(k) != U64.size or len(v) != U64.size:
                    self.problems.append(
                        f"{self.state_data}: a position record is damaged ({len(k)}/{len(v)} bytes): "
                        "left out (a subscription without one resumes from its own record or its last "
                        "pending message: what it was sent since then may come again)"
                    )
                    continue
                self.last_sent[U64.unpack(k)[0]] = U64.unpack(v)[0]
            for k, v in txn.cursor(db=dbs["pending"]).iternext():
                if len(k) != PENDING_KEY.size:
                    self.problems.append(
                        f"{self.state_data}: a pending entry's key is damaged ({len(k)} bytes): left out "
                        "(which subscription and message it named is lost; that message, if it was not "
                        "acknowledged, is not sent again)"
                    )
                    continue
                sub_id, seq = PENDING_KEY.unpack(k)
                if len(v) in (U32.size, NAKED_PENDING.size):
                    # A nak's wait (the longer value) is not kept: the message is due at once.
                    attempt = U32.unpack_from(v)[0]
                else:  # still unacknowledged: kept pending (sent again), its attempt count unknown
                    attempt = 1
                    self.problems.append(
                        f"{self.state_data}: subscription {sub_id}: the pending entry of message {seq} is "
                        f"damaged ({len(v)} bytes): kept pending, its attempt count lost"
                    )
                self.pending.setdefault(sub_id, {})[seq] = attempt
            for k, v in txn.cursor(db=dbs["clients"]).iternext():
                self._client(bytes(k), bytes(v), strict=True)

    def _read_state_pages(self) -> None:
        """Every page of a damaged state file, live or not, read as plain bytes."""
        if is_empty_or_missing(self.state_data):
            if self.channels:
                self.notes.append("no subscription or client survives: clients must connect and subscribe again")
            return
        self.state_from_pages = True
        for key, value in raw_items(self.state_data):
            if len(key) == PENDING_KEY.size and len(value) in (U32.size, NAKED_PENDING.size):
                sub_id, seq = PENDING_KEY.unpack(key)
                entries = self.pending.setdefault(sub_id, {})
                entries[seq] = max(entries.get(seq, 0), U32.unpack_from(value)[0])
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
            last = channel.info.last_seq
            sent = self.last_sent.get(sub_id, record.last_sent)
            if self.state_from_pages:
                # Read from every page of a damaged file, a position past the channel's end is as
                # likely a damaged key or a stale page as a sign of lost messages: not believed.
                wild = sorted(seq for seq in own if seq > last)
                for seq in wild:
                    del own[seq]
                if wild:
                    self.problems.append(
                        f"{self.state_data}: {who}: {len(wild)} pending entries read from the damaged file name "
                        f"messages past the channel's end ({last}, first {wild[0]}): left out as damage"
                    )
                if sent > max(last, record.last_sent):
                    self.problems.append(
                        f"{self.state_data}: {who}: its position read from the damaged file ({sent}) is past "
                        f"the channel's end ({last}): the subscription's own record ({record.last_sent}) is kept"
                    )
                    sent = record.last_sent
                    self.last_sent[sub_id] = sent
            position = max(sent, max(own, default=0))
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
                out[channel.info.name] = lost
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
