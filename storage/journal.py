"""The publish journal: two preallocated files that take each appended batch with one write and one
fdatasync, so a PubAck waits for one flush instead of an LMDB commit's two plus its B-tree pages.

The LMDB store writes each batch here first and copies batches into LMDB later, in one synced commit
per checkpoint (see lmdb_store). Appends go to the active file; a checkpoint switches to the other
file, copies what the first file holds into LMDB, and records the first file's epoch as checkpointed.
A file is then written again from offset 0 under a new, higher epoch.

A record is

    body length (>I) | crc32 (>I) | epoch (>Q) | body

with the CRC over the length, the epoch and the body. Reading a file stops at the first record that
is empty (zeros: never written), fails its CRC (torn by a crash: it was never acknowledged), or has a
different epoch than the file's first record (left from an earlier use of the file). What a record's
body holds is the store's business.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from pathlib import Path

from storage.errors import write_failed

_HEADER = struct.Struct(">IIQ")  # body length, crc, epoch
_LEN_EPOCH = struct.Struct(">IQ")
_FIRST_SIZE = 1 << 20  # then doubled as needed, 16 MiB at a time at most: each growth costs an fsync
_MAX_GROWTH = 16 << 20
NAMES = ("journal.0", "journal.1")


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

    def reserve(self, size: int) -> None:
        """Make the file at least `size` bytes long, its length on disk, so an fdatasync after a write
        inside it does not have to flush the file's metadata too."""
        if size <= self.allocated:
            return
        size = max(size, self.allocated + min(max(self.allocated, _FIRST_SIZE), _MAX_GROWTH))
        try:
            os.posix_fallocate(self.fd, 0, size)
        except OSError:  # a filesystem without fallocate: extend by hand
            os.ftruncate(self.fd, size)
        os.fsync(self.fd)
        self.allocated = size

    def records(self) -> tuple[int, list[bytes]]:
        """The epoch and bodies of the valid records at the start of the file (epoch 0: none).

        Read record by record: a reused file is mostly stale, and it can be large."""
        bodies: list[bytes] = []
        epoch = 0
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            while True:
                header = f.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    break
                length, crc, record_epoch = _HEADER.unpack(header)
                if length == 0 or length > size - f.tell() or (epoch and record_epoch != epoch):
                    break
                body = f.read(length)
                if len(body) < length or zlib.crc32(body, zlib.crc32(_LEN_EPOCH.pack(length, record_epoch))) != crc:
                    break
                epoch = record_epoch
                bodies.append(body)
        return epoch, bodies

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Journal:
    """Appends records to the active file; `switch` makes the other one active under a new epoch."""

    def __init__(self, directory: Path, *, sync: bool) -> None:
        self.sync_each = sync
        self.files = [JournalFile(directory / name) for name in NAMES]
        self.active = 0
        if any(f.created for f in self.files):
            _fsync_directory(directory)  # a new file must still be there after a crash

    def recover(self, checkpointed_epoch: int) -> list[bytes]:
        """Bodies of every record newer than `checkpointed_epoch`, oldest first; then the journal
        starts afresh on an epoch above every one seen, so the caller must checkpoint them (as epoch
        `self.epoch - 1`) before appending.

        A file is written again only after its last epoch was checkpointed, so whatever lies past
        the valid records of a file is from an epoch <= the checkpointed one: never replayed."""
        found = sorted((f.records() for f in self.files), key=lambda pair: pair[0])
        highest = max(checkpointed_epoch, found[-1][0])
        for f in self.files:
            f.epoch, f.end = highest + 1, 0
        self.files[1].epoch = highest + 2
        self.active = 0
        return [body for epoch, bodies in found if epoch > checkpointed_epoch for body in bodies]

    @property
    def epoch(self) -> int:
        return self.files[self.active].epoch

    @property
    def active_bytes(self) -> int:
        return self.files[self.active].end

    def append(self, body: bytes) -> None:
        """Write one record; with `sync` it is on disk when this returns."""
        f = self.files[self.active]
        header = _HEADER.pack(len(body), zlib.crc32(body, zlib.crc32(_LEN_EPOCH.pack(len(body), f.epoch))), f.epoch)
        record = header + body
        try:
            f.reserve(f.end + len(record))
            written = os.pwrite(f.fd, record, f.end)
            if written != len(record):
                raise OSError(f"short write ({written} of {len(record)} bytes)")
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


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
