"""The record reader over arbitrary bytes and cut points: records written in nats-streaming-server's
framing come back as written; a file cut anywhere gives the records before the cut, then a
TornRecordError at the cut record's offset; any bytes at all give only StanFormatError, and end. So
does the whole store reader, over directories of arbitrary files."""

from __future__ import annotations

import struct
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.stan_import.crypto import DecryptionError
from streaming.stan_import.filestore import FileStoreReader
from streaming.stan_import.framing import (
    CASTAGNOLI,
    Crc32,
    DamagedRecordError,
    StanFormatError,
    TornRecordError,
    index_entries,
    records,
)
from streaming.stan_import.model import ReadOptions, RefusedError
from tests.stan_import.support import STORES, copy


def frame(payloads: list[tuple[int, bytes]], crc: Crc32, *, typed: bool) -> bytes:
    out = [struct.pack("<I", 1)]
    for kind, payload in payloads:
        header = (kind << 24 | len(payload)) if typed else len(payload)
        out.append(struct.pack("<II", header, crc(payload)) + payload)
    return b"".join(out)


def test_crc32_known_answers() -> None:
    assert Crc32()(b"123456789") == 0xCBF43926 == zlib.crc32(b"123456789")
    assert Crc32(CASTAGNOLI)(b"123456789") == 0xE3069283
    with pytest.raises(ValueError, match="32-bit number"):
        Crc32(0)


payloads = st.lists(st.tuples(st.integers(1, 255), st.binary(max_size=64)), max_size=8)


@given(payloads, st.booleans(), st.sampled_from([0xEDB88320, CASTAGNOLI]))
def test_records_come_back_as_written(written: list[tuple[int, bytes]], typed: bool, poly: int) -> None:
    if not typed:  # an empty untyped record is all zeros: zero padding, as the server reads it too
        written = [(kind, payload or b"x") for kind, payload in written]
    crc = Crc32(poly)
    data = frame(written, crc, typed=typed)
    found = [(r.kind, r.payload) for r in records(data, path="f", typed=typed, crc=crc)]
    assert found == [(kind if typed else 0, payload) for kind, payload in written]


@given(payloads.filter(bool), st.data())
def test_a_file_cut_anywhere_gives_the_records_before_then_a_torn_one(
    written: list[tuple[int, bytes]], data: st.DataObject
) -> None:
    crc = Crc32()
    whole = frame(written, crc, typed=True)
    cut = data.draw(st.integers(4, len(whole) - 1))
    starts = [4]
    for _, payload in written:
        starts.append(starts[-1] + 8 + len(payload))
    found = []
    try:
        for r in records(whole[:cut], path="f", typed=True, crc=crc):
            found.append(r.payload)
    except TornRecordError as exc:
        assert exc.offset == max(s for s in starts if s <= cut) and exc.offset < cut
        assert len(found) == starts.index(exc.offset)
    else:
        assert cut in starts  # cut at a record boundary: the records before it, whole
        assert len(found) == starts.index(cut)


@settings(max_examples=300)
@given(st.binary(max_size=400), st.booleans(), st.booleans())
def test_arbitrary_bytes_give_records_or_a_format_error(data: bytes, typed: bool, check: bool) -> None:
    try:
        for _ in records(data, path="f", typed=typed, crc=Crc32() if check else None):
            pass
    except StanFormatError as exc:
        assert exc.path == "f" and 0 <= exc.offset <= len(data)
    try:
        for _ in index_entries(data, path="f", crc=Crc32()):
            pass
    except StanFormatError:
        pass


def test_a_bad_version_word_is_named() -> None:
    with pytest.raises(DamagedRecordError, match="file version 0"):
        list(records(b"\x00\x00\x00\x00", path="f", typed=False, crc=None))
    with pytest.raises(TornRecordError, match="no version word"):
        list(records(b"\x01\x00", path="f", typed=False, crc=None))


files = st.sampled_from(["clients.dat", "audit/subs.dat", "audit/msgs.1.dat", "audit/msgs.1.idx", "server.dat"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(files, st.integers(0, 10_000), st.binary(min_size=1, max_size=40)), min_size=1, max_size=4))
def test_the_store_reader_over_damaged_files_raises_only_its_errors(damage: list[tuple[str, int, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as where:
        source = copy("basic", Path(where))
        for name, at, junk in damage:
            path = source / name
            raw = bytearray(path.read_bytes())
            at = min(at, len(raw))
            raw[at : at + len(junk)] = junk
            path.write_bytes(bytes(raw))
        try:
            store = FileStoreReader(source, ReadOptions()).read()
            for channel in store.channels:
                for _ in channel.messages():
                    pass
        except (StanFormatError, RefusedError, DecryptionError):
            pass


def test_the_fixtures_read_clean() -> None:
    for name, options in [("basic", ReadOptions()), ("crc_poly", ReadOptions(crc_poly=CASTAGNOLI))]:
        store = FileStoreReader(STORES / name, options).read()
        assert all(sum(1 for _ in c.messages()) == c.msgs for c in store.channels)
        assert store.notes == []
