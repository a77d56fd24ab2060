"""The message value layout: what decode_message accepts and what it refuses as corrupt."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.codec import MSG_HEADER_SIZE, decode_message, encode_reply, encode_run
from storage.errors import IntegrityError


@given(
    channel_id=st.integers(0, 2**32 - 1),
    first=st.integers(1, 2**63),
    ts=st.integers(-(2**63), 2**63 - 1),
    bodies=st.lists(st.tuples(st.text(max_size=40), st.binary(max_size=300)), min_size=1, max_size=5),
)
def test_what_encode_run_writes_decodes_to_the_same_message(
    channel_id: int, first: int, ts: int, bodies: list[tuple[str, bytes]]
) -> None:
    pairs = encode_run(channel_id, first, ts, [(encode_reply(r), d) for r, d in bodies])
    for i, ((key, value), (reply, data)) in enumerate(zip(pairs, bodies, strict=True)):
        for raw in (value, memoryview(value)):  # LMDB hands back either
            m = decode_message(key, raw, "ch")
            assert (m.seq, m.timestamp_unix_ns, m.subject, m.reply, m.data) == (first + i, ts, "ch", reply, data)


def _one(reply: str = "r", data: bytes = b"payload") -> tuple[bytes, bytes]:
    return encode_run(7, 42, 1, [(encode_reply(reply), data)])[0]


def test_a_value_shorter_than_its_header_is_corrupt() -> None:
    key, value = _one()
    with pytest.raises(IntegrityError, match="shorter than its header"):
        decode_message(key, value[: MSG_HEADER_SIZE - 1], "ch")


def test_any_flipped_byte_fails_the_checksum() -> None:
    key, value = _one()
    for i in list(range(8)) + list(range(MSG_HEADER_SIZE - 2, len(value))):  # all but the CRC itself
        damaged = bytearray(value)
        damaged[i] ^= 0x01
        with pytest.raises(IntegrityError, match="checksum mismatch"):
            decode_message(key, bytes(damaged), "ch")


def test_a_value_under_another_key_fails_the_checksum() -> None:
    _, value = _one()
    other_key, _ = encode_run(7, 43, 1, [(b"r", b"payload")])[0]
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        decode_message(other_key, value, "ch")


def test_a_reply_length_past_the_end_is_corrupt_even_with_a_matching_checksum() -> None:
    key, value = _one(reply="", data=b"")
    tail = (1000).to_bytes(2, "big")  # a reply length with nothing after it
    crc = zlib.crc32(tail, zlib.crc32(value[:8], zlib.crc32(key)))
    forged = value[:8] + crc.to_bytes(4, "big") + tail
    with pytest.raises(IntegrityError, match="reply length past the end"):
        decode_message(key, forged, "ch")
