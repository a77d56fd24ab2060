"""What the LMDB store checks before it trusts the files of a data directory.

LMDB maps its data file and follows page numbers and offsets found in it without checks of its own:
a truncated file makes the process die with SIGBUS the first time a page past the end is touched, and
damaged page headers can send it anywhere. So nothing here hands a file to LMDB:

- `lmdb_file_problem` reads an LMDB data file's two meta pages with plain reads and compares the last
  page they name with the file's size, before the file is ever mapped; a file that ends early must
  have only free pages past its end (its free list, read by storage.lmdb_pages, or else the walk
  below, says whether it does);
- `structure_problems` (storage.state_walk) runs py-lmdb's offline verifier (`lmdb.verify`), a
  pure-Python walk of every page reachable from the roots, before LMDB reads any of them;
- `missing_files` says which of the files a store needs are gone or empty, given what the others show.

The message-level checks (every checksum, every channel's count) read through LMDB once these pass
(lmdb_store). `Damage` collects what a full check finds, for `streaming-server check` and `repair`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs

from storage.codec import spans
from storage.lmdb_pages import free_pages
from storage.records import RecoveredState, RecoveredSubscription
from storage.state_walk import structure_problems

_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_PAGE_HEADER = 16  # mp_pgno, mp_pad, mp_flags, mp_lower, mp_upper (64-bit LMDB 0.9)
# mm_magic, mm_version, mm_address, mm_mapsize, mm_dbs[FREE], mm_dbs[MAIN], mm_last_pg, mm_txnid
_META = struct.Struct("=IIQQ48s48sQQ")
_DB = struct.Struct("=IHHQQQQQ")  # md_pad (the page size, in the free DB's record), flags, depth, ..., md_root
_NO_PAGE = (1 << 64) - 1


def lmdb_file_problem(data_file: Path, walk: Callable[[], list[str]] | None = None) -> str | None:
    """What is wrong with an LMDB data file's meta pages or length, in words (None: nothing).

    A file may legally end before the last page its meta page names: LMDB writes only the pages a
    transaction leaves in use, so pages it took from the end of the file and freed again before
    committing stay on the free list, unwritten, and LMDB never reads a free page (it writes a fresh
    copy when it reuses one). So a short file is damaged only if a page the trees reach lies past
    its end. When the free list holds every page past the end, that settles it; otherwise the
    structure walk decides (`walk`: that walk's findings, if it is run anyway; else it is run here:
    0.6 s for a message file of 250,000 messages, so only for a file the free list does not explain)."""
    try:
        size = data_file.stat().st_size
        with open(data_file, "rb") as f:
            first = _meta(f.read(_PAGE_HEADER + _META.size))
            second = None
            if first is not None:
                f.seek(first.psize)
                second = _meta(f.read(_PAGE_HEADER + _META.size))
    except OSError as exc:
        return f"cannot be read ({exc})"
    if size == 0:
        return "is empty"
    if first is None:
        return "is not an LMDB data file, or its first meta page is damaged"
    if second is None or second.psize != first.psize:
        return "has a damaged second meta page"
    # LMDB uses the meta page of the newer transaction.
    meta = max(first, second, key=lambda m: m.txnid)
    needed = (meta.last_page + 1) * meta.psize
    if size < needed and not _only_free_pages_past_end(data_file, meta, size):
        found = walk() if walk is not None else structure_problems(data_file.parent)
        if found:
            return f"is truncated: it is {size} bytes long, but its pages run to byte {needed} ({found[0]})"
    for name, root in (("free-page", meta.free_root), ("main", meta.main_root)):
        if root != _NO_PAGE and not 2 <= root <= meta.last_page:
            return f"has a damaged meta page (transaction {meta.txnid}): the {name} tree's root is page {root}"
    return None


def _only_free_pages_past_end(data_file: Path, meta: _Meta, size: int) -> bool:
    """Whether the free list (read from its own tree, a few pages) holds every page past the file's
    end: then nothing reaches them, and the walk of the whole file is not needed to say so."""
    if meta.free_root == _NO_PAGE:
        return False
    try:
        free = free_pages(data_file, meta.psize, meta.free_root, meta.last_page)
    except OSError:
        return False  # the walk that follows says what is wrong
    return free is not None and all(page in free for page in range(size // meta.psize, meta.last_page + 1))


@attrs.frozen
class _Meta:
    psize: int
    last_page: int
    txnid: int
    free_root: int
    main_root: int


def _meta(raw: bytes) -> _Meta | None:
    """One meta page, or None if it is not one."""
    if len(raw) < _PAGE_HEADER + _META.size:
        return None
    magic, version, _, _, free, main, last_page, txnid = _META.unpack_from(raw, _PAGE_HEADER)
    if magic != _MAGIC or version != _DATA_VERSION:
        return None
    psize = _DB.unpack(free)[0]
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        return None
    return _Meta(psize, last_page, txnid, _DB.unpack(free)[-1], _DB.unpack(main)[-1])


def is_empty_or_missing(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except FileNotFoundError:
        return True


def ranges(seqs: Iterable[int]) -> str:
    """`1-4, 9, 12-13`: sequences as runs, for messages a person reads."""
    return ", ".join(f"{a}-{b}" if b != a else f"{a}" for a, b in spans(seqs))


def messages(count: int) -> str:
    return "1 message" if count == 1 else f"{count} messages"


@attrs.define
class Damage:
    """What a check found: problems in words (each naming its file), and per channel the sequences
    that are damaged (fail their checksum) or missing (counted by the channel, not stored)."""

    problems: list[str] = attrs.Factory(list)
    damaged: dict[str, set[int]] = attrs.Factory(dict)
    missing: dict[str, set[int]] = attrs.Factory(dict)

    def __bool__(self) -> bool:
        return bool(self.problems or self.damaged or self.missing)

    def lines(self) -> list[str]:
        out = list(self.problems)
        for channel, seqs in sorted(self.damaged.items()):
            fail = "message fails its" if len(seqs) == 1 else "messages fail their"
            out.append(f"channel {channel!r}: {len(seqs)} {fail} checksum: {ranges(seqs)}")
        for channel, seqs in sorted(self.missing.items()):
            out.append(f"channel {channel!r}: {messages(len(seqs))} missing: {ranges(seqs)}")
        return out


def beyond_channels(state: RecoveredState) -> tuple[RecoveredState, list[str]]:
    """Subscriptions that were sent further than their channel's last stored message, and the state
    with their positions and pending entries cut back to it.

    Nothing is delivered before it is stored, so with every commit synced this only happens when
    acknowledged messages are gone: a damaged last journal record looks just like a write torn by a
    crash, except that subscribers had already received what it held. Without file sync it is what a
    machine crash may do (the journal and the state are flushed at different moments)."""
    last = {c.name: c.last_seq for c in state.channels}
    problems: list[str] = []
    subs: list[RecoveredSubscription] = []
    for sub in state.subscriptions:
        record, end = sub.record, last.get(sub.record.channel)
        if record.is_pattern:
            subs.append(sub)  # a wildcard subscription's own record: its parts are on channels
            continue
        if end is None:
            problems.append(
                f"subscription {record.sub_id} of client {record.client_id!r} is on channel "
                f"{record.channel!r}, which the store does not hold"
            )
            continue
        if record.last_sent > end:
            problems.append(
                f"subscription {record.sub_id} of client {record.client_id!r} was sent channel {record.channel!r} "
                f"up to {record.last_sent}, but the store holds it only up to {end}: {end + 1}-{record.last_sent} "
                "are lost"
            )
            pending = {seq: n for seq, n in sub.pending.items() if seq <= end}
            naks = {seq: ns for seq, ns in sub.naks.items() if seq <= end}
            sub = RecoveredSubscription(attrs.evolve(record, last_sent=end), pending, naks)
        subs.append(sub)
    return attrs.evolve(state, subscriptions=subs), problems
