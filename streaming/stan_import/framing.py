"""nats-streaming-server's file framing (sans-IO: bytes in, records out): the version word every file
starts with, its records (`u32 LE header | u32 LE CRC-32 of the payload | payload`, the header being
the payload's size, with a record type in its top byte in clients.dat and subs.dat), the 32-byte
entries of its index files, and the CRC-32 with the polynomial the server was given.

Everything wrong with the bytes is a `StanFormatError` naming the file and the offset: a `TornRecordError`
for a record cut short by the end of the file (a crash while writing it), a `DamagedRecordError` for
any other. Nothing else is raised on any input (tested with arbitrary bytes).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator

import attrs

FILE_VERSION = 1
VERSION = struct.Struct("<I")
HEADER = struct.Struct("<II")  # header (type << 24 | size, or size), CRC-32 of the payload
INDEX_ENTRY = struct.Struct(
    "<QQqII"
)  # seq, offset of the record, timestamp, payload size, CRC-32 of the 28 bytes before
INDEX_BODY = 28
MAX_TYPED_SIZE = 0xFFFFFF
IEEE = 0xEDB88320  # Go's crc32.IEEE (reversed form), zlib's CRC-32
CASTAGNOLI = 0x82F63B78  # CRC-32C, the other polynomial servers were given


class StanFormatError(Exception):
    """The bytes of a file are not what nats-streaming-server writes."""

    def __init__(self, path: str, offset: int, why: str) -> None:
        super().__init__(f"{path}: {why} (at byte {offset})")
        self.path, self.offset, self.why = path, offset, why


class TornRecordError(StanFormatError):
    """The file ends inside a record: the last write before a crash, cut short."""


class DamagedRecordError(StanFormatError):
    """A record or header that cannot be what the server wrote (checksum, size, type, version)."""


class Crc32:
    """CRC-32 (reflected, initial value and final xor 0xFFFFFFFF) with a polynomial in Go's reversed
    form, as `crc32.MakeTable` takes it. IEEE is zlib's; any other is computed from a table here."""

    def __init__(self, poly: int = IEEE) -> None:
        if not 0 < poly <= 0xFFFFFFFF:
            raise ValueError(f"a CRC-32 polynomial is a 32-bit number, not {poly}")
        self.poly = poly
        self._table: list[int] = []
        # What callers on a hot path call: zlib's own function where it applies (no method call).
        self.function: Callable[[bytes | memoryview], int] = zlib.crc32 if poly == IEEE else self.__call__
        if poly != IEEE:
            for n in range(256):
                c = n
                for _ in range(8):
                    c = (c >> 1) ^ poly if c & 1 else c >> 1
                self._table.append(c)

    def __call__(self, data: bytes | memoryview) -> int:
        if not self._table:
            return zlib.crc32(data)
        table, crc = self._table, 0xFFFFFFFF
        for byte in bytes(data):
            crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF


@attrs.frozen(slots=True)
class Record:
    offset: int  # of its header in the file
    kind: int  # record type (typed files), 0 in untyped ones
    payload: bytes

    @property
    def end(self) -> int:
        return self.offset + HEADER.size + len(self.payload)


@attrs.frozen(slots=True)
class IndexEntry:
    seq: int
    offset: int
    timestamp_unix_ns: int
    size: int


def check_version(head: bytes, path: str) -> None:
    """The file's first 4 bytes: the format version, always 1."""
    if len(head) < VERSION.size:
        raise TornRecordError(path, 0, f"file of {len(head)} bytes has no version word")
    (version,) = VERSION.unpack_from(head)
    if version != FILE_VERSION:
        raise DamagedRecordError(
            path, 0, f"file version {version}, not {FILE_VERSION}: not a nats-streaming-server file"
        )


def read_record(data: bytes | memoryview, offset: int, *, path: str, typed: bool, crc: Crc32 | None) -> Record | None:
    """The record at `offset` of `data` (a whole file), or None at the end of the file or at zero padding
    (a header of zeros, where the server stops reading too). `crc` None: checksums are not checked."""
    left = len(data) - offset
    if left <= 0:
        return None
    if left < HEADER.size:
        raise TornRecordError(path, offset, f"the file ends {left} bytes into a record header")
    header, stored_crc = HEADER.unpack_from(data, offset)
    if header == 0 and stored_crc == 0:
        return None
    kind, size = (header >> 24, header & MAX_TYPED_SIZE) if typed else (0, header)
    if typed and kind == 0:
        raise DamagedRecordError(path, offset, "record of type 0")
    start = offset + HEADER.size
    if start + size > len(data):
        raise TornRecordError(path, offset, f"the file ends {len(data) - start} bytes into a record of {size} bytes")
    payload = bytes(data[start : start + size])
    if crc is not None and crc(payload) != stored_crc:
        why = f"checksum mismatch in a record of {size} bytes"
        if crc.poly == IEEE and Crc32(CASTAGNOLI)(payload) == stored_crc:  # the one other polynomial seen
            why += f": the checksums are CRC-32C (the server ran with --file_crc_poly 0x{CASTAGNOLI:08x}): "
            why += f"give --crc_poly 0x{CASTAGNOLI:08x}"
        raise DamagedRecordError(path, offset, why)
    return Record(offset, kind, payload)


def records(data: bytes | memoryview, *, path: str, typed: bool, crc: Crc32 | None) -> Iterator[Record]:
    """Every record of a whole file after its version word (checked), in order, up to its end or its
    zero padding."""
    check_version(bytes(data[: VERSION.size]), path)
    offset = VERSION.size
    while True:
        record = read_record(data, offset, path=path, typed=typed, crc=crc)
        if record is None:
            return
        yield record
        offset = record.end


def index_entries(data: bytes | memoryview, *, path: str, crc: Crc32) -> Iterator[IndexEntry]:
    """The entries of a whole index file, up to its end or its zero padding. Raises StanFormatError for
    a bad version, a partial entry or one whose checksum fails (the server then rebuilds the index)."""
    check_version(bytes(data[: VERSION.size]), path)
    offset = VERSION.size
    while offset < len(data):
        if len(data) - offset < INDEX_ENTRY.size:
            raise TornRecordError(path, offset, "the index ends inside an entry")
        seq, at, timestamp, size, stored_crc = INDEX_ENTRY.unpack_from(data, offset)
        if not (seq or at or timestamp or size or stored_crc):
            return
        if crc(data[offset : offset + INDEX_BODY]) != stored_crc:
            raise DamagedRecordError(path, offset, "index entry checksum mismatch")
        yield IndexEntry(seq, at, timestamp, size)
        offset += INDEX_ENTRY.size
