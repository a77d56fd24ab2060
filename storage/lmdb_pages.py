"""Reading an LMDB data file page by page, without LMDB, with plain reads and bounds checks, so that
nothing in a damaged file can make it fail or read outside the file: every (key, value) on every leaf
page, live or freed (repair uses it when a file's structure does not verify: storage.salvage), and
the pages the free list holds (the length check uses it: storage.integrity)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_U16 = struct.Struct("=H")
_U64N = struct.Struct("=Q")
_NODE = struct.Struct("=HHHH")  # mn_lo, mn_hi (data size), mn_flags, mn_ksize
_PAGE_HEADER = 16
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META, _P_LEAF2, _P_SUBP = 0x01, 0x02, 0x04, 0x08, 0x20, 0x40
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 0x01, 0x02, 0x04


def raw_items(data_file: Path) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) on every leaf page of an LMDB data file, live or freed, read with plain reads
    and bounds-checked: nothing in the file can make this fail or read outside it."""
    size = data_file.stat().st_size
    with open(data_file, "rb") as f:
        psize = page_size(f)
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


def free_pages(data_file: Path, psize: int, root: int, last_page: int) -> set[int] | None:
    """The page numbers LMDB's free list holds, read from the free database's tree (`root`, from the
    meta page in use), or None if that tree cannot be read whole: a page of it missing, out of range,
    visited twice or not of the kind expected."""
    size = data_file.stat().st_size
    free: set[int] = set()
    seen: set[int] = set()
    with open(data_file, "rb") as f:

        def read(offset: int, length: int) -> bytes | None:
            if offset < 0 or offset + length > size:
                return None
            f.seek(offset)
            raw = f.read(length)
            return raw if len(raw) == length else None

        stack = [(root, 0)]
        while stack:
            pgno, depth = stack.pop()
            if not 2 <= pgno <= last_page or pgno in seen or depth > 32:
                return None
            seen.add(pgno)
            page = read(pgno * psize, psize)
            if page is None:
                return None
            flags = _U16.unpack_from(page, 10)[0]
            lower, upper = _U16.unpack_from(page, 12)[0], _U16.unpack_from(page, 14)[0]
            if flags & (_P_BRANCH | _P_LEAF) not in (_P_BRANCH, _P_LEAF) or not _PAGE_HEADER <= lower <= upper <= psize:
                return None
            for i in range((lower - _PAGE_HEADER) >> 1):
                node = _U16.unpack_from(page, _PAGE_HEADER + 2 * i)[0]
                if node < upper or node + _NODE.size > psize:
                    return None
                lo, hi, nflags, ksize = _NODE.unpack_from(page, node)
                if flags & _P_BRANCH:  # the child's page number: mn_lo, mn_hi and mn_flags, 48 bits
                    stack.append((lo | hi << 16 | nflags << 32, depth + 1))
                    continue
                dsize, doff = lo | hi << 16, node + _NODE.size + ksize
                if nflags & _F_BIGDATA:
                    if doff + 8 > psize:
                        return None
                    overflow = _U64N.unpack_from(page, doff)[0]
                    if not 2 <= overflow <= last_page:
                        return None
                    value = read(overflow * psize + _PAGE_HEADER, dsize)
                elif doff + dsize <= psize:
                    value = page[doff : doff + dsize]
                else:
                    return None
                if value is None or len(value) < 8:
                    return None
                count = _U64N.unpack_from(value, 0)[0]
                if len(value) < 8 * (count + 1):
                    return None
                free.update(struct.unpack_from(f"={count}Q", value, 8))
    return free


def page_size(f: BinaryIO) -> int:
    """The page size the first meta page gives, else the usual 4096."""
    f.seek(0)
    head = f.read(_PAGE_HEADER + 64)
    if len(head) >= _PAGE_HEADER + 28:
        psize = struct.unpack_from("=I", head, _PAGE_HEADER + 24)[0]
        if 512 <= psize <= 65536 and not psize & (psize - 1):
            return int(psize)
    return 4096
