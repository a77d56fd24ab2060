"""The publish journal: two preallocated files that take each appended batch with one write and one
fdatasync, so a PubAck waits for one flush instead of an LMDB commit's two plus its B-tree pages.

The LMDB store writes each batch here first and copies batches into LMDB later, in one synced commit
per checkpoint (see lmdb_store). Appends go to the active file; a checkpoint switches to the other
file, copies what the first file holds into LMDB, and records the first file's epoch as checkpointed.
A file is written again from offset 0, under a new and higher epoch, only once everything it held is
in LMDB: a file whose records are not all checkpointed is never overwritten, not even after a restart
on a full disk (the journal then goes on after its last record).

A record is

    body length (>I) | crc32 (>I) | epoch (>Q) | body

with the CRC over the length, the epoch and the body, seeded from the store's journal key and the
epoch. Message payloads come from clients and end up in journal files, where a reused file keeps old
bytes past its newest record; without the key no payload can pass for a record, however it is made.
A record with an empty body is the clean-close marker: the store closed after the records before it.

Reading a file (`scan`) takes the records from offset 0 that share the first record's epoch. It stops
at the end of the file, at zeros (never written), at a valid record of an older epoch (left from an
earlier use of the file), at the close marker, or at a record that fails its checksum: a write torn by
a crash, which was never acknowledged. But a record that fails its checksum and is followed by an
intact record newer than the last checkpoint is damage, not a tear: the records after it were
acknowledged, and `scan` raises `DamagedStoreError` rather than drop them. What a record's body holds
is the store's business.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import attrs

from storage.errors import DamagedStoreError, write_failed

_HEADER = struct.Struct(">IIQ")  # body length, crc, epoch
_LEN_EPOCH = struct.Struct(">IQ")
_EPOCH = struct.Struct(">Q")
_FIRST_SIZE = 1 << 20  # then doubled as needed, 16 MiB at a time at most: each growth costs an fsync
_MAX_GROWTH = 16 << 20
_SCAN_CHUNK = 4 << 20
_ZEROS_SIZE = 1 << 20
_ZEROS = memoryview(bytes(_ZEROS_SIZE))  # sliced without a copy
# Epochs a file can hold beyond the last checkpoint: the active file's, the unretired one's, and one
# more for a switch whose checkpoint commit did not land.
_LIVE_EPOCHS = 3
NAMES = ("journal.0", "journal.1")
Seed = Callable[[int], int]  # epoch -> CRC seed


def unkeyed(epoch: int) -> int:
    """The seed of a journal without a key (stores of schema version 2, before their upgrade)."""
    return 0


def keyed(key: bytes, unkeyed_before: int = 0) -> Seed:
    """Seeds from the store's journal key, for epochs from `unkeyed_before` on."""
    key_crc = zlib.crc32(key)

    def seed(epoch: int) -> int:
        return zlib.crc32(_EPOCH.pack(epoch), key_crc) if epoch >= unkeyed_before else 0

    return seed


def _crc(body: bytes | memoryview, epoch: int, seed: int) -> int:
    return zlib.crc32(body, zlib.crc32(_LEN_EPOCH.pack(len(body), epoch), seed))


def record_at(fd: int, offset: int, size: int, seed: Seed) -> tuple[int, bytes] | None:
    """(epoch, body) of a valid record at `offset` of a file `size` bytes long, else None."""
    header = os.pread(fd, _HEADER.size, offset)
    if len(header) < _HEADER.size:
        return None
    length, crc, epoch = _HEADER.unpack(header)
    if epoch == 0 or length > size - offset - _HEADER.size:
        return None
    body = os.pread(fd, length, offset + _HEADER.size) if length else b""
    if len(body) != length or _crc(body, epoch, seed(epoch)) != crc:
        return None
    return int(epoch), body


def next_record(fd: int, start: int, size: int, checkpointed: int, seed: Seed) -> int | None:
    """Offset of the first valid record newer than the checkpoint at or after `start`, if any: what
    lies past a damaged record. Candidates are found by their epoch field (only a few epochs can be
    newer than the checkpoint), then checked whole."""
    patterns = [_EPOCH.pack(e) for e in range(checkpointed + 1, checkpointed + 1 + _LIVE_EPOCHS)]
    offset = start
    while offset < size:
        chunk = os.pread(fd, min(_SCAN_CHUNK + _HEADER.size, size - offset), offset)
        hits = sorted(at for pattern in patterns for at in _find_all(chunk, pattern) if at >= 8)
        for at in hits:
            if record_at(fd, offset + at - 8, size, seed) is not None:
                return offset + at - 8
        offset += _SCAN_CHUNK
    return None


def _find_all(data: bytes, pattern: bytes) -> list[int]:
    found, at = [], data.find(pattern)
    while at >= 0:
        found.append(at)
        at = data.find(pattern, at + 1)
    return found


@attrs.frozen
class FileScan:
    """What one journal file holds: the records of its newest use (epoch 0: none)."""

    epoch: int
    bodies: list[bytes]
    end: int  # where the next record would go: after the last record (on the close marker, if any)
    closed: bool  # the records end with the clean-close marker


class JournalFile:
    """One of the two files: where its next record goes and how much is preallocated."""

    def __init__(self, path: Path) -> None:
        self.path = path
        created = not path.exists()
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        self.allocated = os.fstat(self.fd).st_size
        self.epoch = 0
        self.end = 0  # where the next record goes
        self.created = created
        # Where the space this process allocated (and nothing but its own records wrote) starts: past
        # the last record it is zeros on disk that the filesystem still has to mark written.
        self.unwritten_from: int | None = None

    def reserve(self, size: int) -> None:
        """Make the file at least `size` bytes long, its length on disk, so an fdatasync after a write
        inside it does not have to flush the file's metadata too."""
        if size <= self.allocated:
            return
        grown = max(size, self.allocated + min(max(self.allocated, _FIRST_SIZE), _MAX_GROWTH))
        try:
            os.posix_fallocate(self.fd, 0, grown)
        except OSError as exc:
            if exc.errno == errno.ENOSPC and grown > size:
                grown = size  # a nearly full disk: what this record needs may still fit
                os.posix_fallocate(self.fd, 0, grown)
            elif exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                os.ftruncate(self.fd, grown)  # a filesystem without fallocate: extend by hand
            else:
                raise  # a sparse file would only fail later, in the middle of a write
        os.fsync(self.fd)
        if self.unwritten_from is None:
            self.unwritten_from = self.allocated
        self.allocated = grown

    def prefill(self, target: int) -> int:
        """Write zeros where a record may go next and the filesystem has no data yet: over the space
        `reserve` allocated past the last record, and on to `target` bytes. Returns the bytes written.

        Only for the file that takes no appends (the inactive one), off the event loop. An fdatasync
        after a write into allocated but never written space must also commit the filesystem's
        journal (the space becomes written), which makes it slower and makes it wait behind any
        other metadata commit of the disk (bench/README.md: 0.21 against 0.13 ms here, and the
        stalls of a commit's p99). Nothing is written over bytes this process did not allocate: past
        the last record they may be a second copy of checkpointed messages, which repair reads."""
        start = self.allocated if self.unwritten_from is None else max(self.unwritten_from, self.end)
        stop = max(target, self.allocated)
        if start >= stop:
            return 0
        before = self.allocated
        try:
            at = start
            while at < stop:
                size = min(_ZEROS_SIZE, stop - at)
                written = os.pwrite(self.fd, _ZEROS[:size], at)
                if written != size:
                    raise OSError(errno.ENOSPC, f"short write ({written} of {size} bytes)")
                at += size
            os.fdatasync(self.fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, before)  # the space goes back; below `before` only zeros went over zeros
            raise
        self.allocated, self.unwritten_from = stop, None
        return stop - start

    def scan(self, checkpointed: int, seed: Seed) -> FileScan:
        """The valid records at the start of the file (see the module docstring); raises
        DamagedStoreError when intact records newer than `checkpointed` lie past a damaged one."""
        bodies: list[bytes] = []
        epoch = offset = 0
        closed = False
        size = os.fstat(self.fd).st_size
        while (found := record_at(self.fd, offset, size, seed)) is not None:
            record_epoch, body = found
            if epoch and record_epoch != epoch:
                break
            epoch = record_epoch
            if not body:
                closed = True
                break
            bodies.append(body)
            offset += _HEADER.size + len(body)
        at_end = offset + _HEADER.size > size
        # A file whose first record is older than the checkpoint has not been written since: a reuse
        # starts at offset 0, so whatever lies behind that record is older still.
        if not (at_end or closed or 0 < epoch <= checkpointed):
            following = next_record(self.fd, offset + 1, size, checkpointed, seed)
            if following is not None:
                raise DamagedStoreError(
                    f"{self.path}: the record at offset {offset} is damaged (it fails its checksum) and an "
                    f"intact record written after it lies at offset {following}: acknowledged messages are "
                    "in the damaged part"
                )
        return FileScan(epoch, bodies, offset, closed)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@attrs.frozen
class Recovery:
    """What `Journal.recover` found: the bodies to replay, oldest first, and the epoch of a file that
    holds some of them but is not the active one (its checkpoint had failed), if any."""

    bodies: list[bytes]
    unretired: int | None


class Journal:
    """Appends records to the active file; `switch` makes the other one active under a new epoch."""

    def __init__(self, directory: Path, *, sync: bool, seed: Seed = unkeyed) -> None:
        self.sync_each = sync
        self.seed = seed
        self.files = [JournalFile(directory / name) for name in NAMES]
        self.active = 0
        if any(f.created for f in self.files):
            fsync_directory(directory)  # a new file must still be there after a crash

    def recover(self, checkpointed_epoch: int) -> Recovery:
        """Every record newer than `checkpointed_epoch`, and set up appending so that none of them is
        overwritten before a checkpoint has copied it: the newest file goes on after its last record,
        and the other one, if it holds records too, is left for the next checkpoint to retire.

        A file is written again only after its last epoch was checkpointed, so whatever lies past
        the valid records of a file is from an epoch <= the checkpointed one: never replayed."""
        scans = [f.scan(checkpointed_epoch, self.seed) for f in self.files]
        live = sorted((s.epoch, i) for i, s in enumerate(scans) if s.epoch > checkpointed_epoch and s.bodies)
        if not live:
            highest = max(checkpointed_epoch, *(s.epoch for s in scans))
            for i, f in enumerate(self.files):
                f.epoch, f.end = highest + 1 + i, 0
            self.active = 0
            return Recovery([], None)
        if len(live) == 2 and live[0][0] == live[1][0]:
            raise DamagedStoreError(f"{self.files[0].path.parent}: both journal files hold epoch {live[0][0]}")
        epoch, newest = live[-1]
        self.active = newest
        self.files[newest].epoch, self.files[newest].end = epoch, scans[newest].end
        unretired = None
        if len(live) == 2:
            older_epoch, older = live[0]
            self.files[older].epoch, self.files[older].end = older_epoch, scans[older].end
            unretired = older_epoch
        return Recovery([body for _, i in live for body in scans[i].bodies], unretired)

    @property
    def epoch(self) -> int:
        return self.files[self.active].epoch

    @property
    def active_bytes(self) -> int:
        return self.files[self.active].end

    def append(self, body: bytes) -> None:
        """Write one record; with `sync` it is on disk when this returns."""
        self._write(body)

    def mark_closed(self) -> None:
        """Write the clean-close marker (after the final checkpoint): the next open need not look past
        it for damage. Its place is taken by the next record if the store is opened again."""
        end = self.files[self.active].end
        self._write(b"")
        self.files[self.active].end = end

    def _write(self, body: bytes) -> None:
        f = self.files[self.active]
        record = _HEADER.pack(len(body), _crc(body, f.epoch, self.seed(f.epoch)), f.epoch) + body
        try:
            f.reserve(f.end + len(record))
            written = os.pwrite(f.fd, record, f.end)
            if written != len(record):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(record)} bytes)")
            if self.sync_each:
                os.fdatasync(f.fd)
        except OSError as exc:
            # The record may be partly on disk: overwrite its header with zeros so that a later record
            # in the same place cannot be mistaken for it (the next append starts at the same offset).
            with contextlib.suppress(OSError):
                os.pwrite(f.fd, bytes(_HEADER.size), f.end)
            raise write_failed(f.path, exc) from exc
        f.end += len(record)

    def switch(self) -> int:
        """Make the other file active (from offset 0, next epoch); return the retired file's epoch."""
        retired = self.files[self.active]
        self.active = 1 - self.active
        fresh = self.files[self.active]
        fresh.epoch, fresh.end = retired.epoch + 1, 0
        return retired.epoch

    def prefill_inactive(self, target: int) -> int:
        """`JournalFile.prefill` of the file that takes no appends until the next `switch`."""
        return self.files[1 - self.active].prefill(target)

    def flush(self) -> None:
        """fdatasync the active file (the periodic flush of a journal that does not sync each append)."""
        f = self.files[self.active]
        try:
            os.fdatasync(f.fd)
        except OSError as exc:
            raise write_failed(f.path, exc) from exc

    def close(self) -> None:
        for f in self.files:
            f.close()


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def salvage_records(fd: int, checkpointed: int, seed: Seed) -> tuple[list[tuple[int, bytes]], list[tuple[int, int]]]:
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
