"""The message value layout: what decode_message accepts and what it refuses as corrupt, and that
decode_messages (a read's many at once) answers exactly as it does."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.codec import (
    EMPTY_HEAD,
    MSG_HEADER_SIZE,
    decode_message,
    decode_messages,
    encode_head,
    encode_run,
    value_size,
)
from storage.errors import IntegrityError


@given(
    channel_id=st.integers(0, 2**32 - 1),
    first=st.integers(1, 2**63),
    ts=st.integers(-(2**63), 2**63 - 1),
    bodies=st.lists(
        st.tuples(
            st.text(max_size=40),
            st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60),
            st.binary(max_size=300),
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_what_encode_run_writes_decodes_to_the_same_message(
    channel_id: int, first: int, ts: int, bodies: list[tuple[str, str, bytes]]
) -> None:
    heads = [encode_head(r, t) for r, t, _ in bodies]
    pairs = encode_run(channel_id, first, ts, [(h, d) for h, (_, _, d) in zip(heads, bodies, strict=True)])
    for i, ((key, value), (reply, content_type, data)) in enumerate(zip(pairs, bodies, strict=True)):
        assert len(value) == value_size(heads[i], data)
        for raw in (value, memoryview(value)):  # LMDB hands back either
            m = decode_message(key, raw, "ch")
            got = (m.seq, m.timestamp_unix_ns, m.subject, m.reply, m.content_type, m.data)
            assert got == (first + i, ts, "ch", reply, content_type, data)


def test_a_value_without_reply_or_content_type_has_the_original_layout() -> None:
    """Stores written before content types existed read the same: the head is the bare length."""
    assert encode_head("", "") == EMPTY_HEAD == b"\x00\x00"
    assert encode_head("r", "") == b"\x00\x01r"


@pytest.mark.parametrize("content_type", ["caf\u00e9/x", "a\nb", "x" * 256])
def test_a_content_type_the_store_cannot_keep_is_refused(content_type: str) -> None:
    with pytest.raises(ValueError, match="content type"):
        encode_head("", content_type)


def test_a_content_type_past_the_end_is_corrupt_even_with_a_matching_checksum() -> None:
    key, value = _one(reply="", data=b"")
    tail = (0x8000).to_bytes(2, "big") + bytes([200]) + b"text/plain"  # says 200 bytes, holds 10
    crc = zlib.crc32(tail, zlib.crc32(value[:8], zlib.crc32(key)))
    forged = value[:8] + crc.to_bytes(4, "big") + tail
    with pytest.raises(IntegrityError, match="content type past the end"):
        decode_message(key, forged, "ch")


def _one(reply: str = "r", data: bytes = b"payload") -> tuple[bytes, bytes]:
    return encode_run(7, 42, 1, [(encode_head(reply), data)])[0]


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
    other_key, _ = encode_run(7, 43, 1, [(encode_head("r"), b"payload")])[0]
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        decode_message(other_key, value, "ch")


def test_a_reply_length_past_the_end_is_corrupt_even_with_a_matching_checksum() -> None:
    key, value = _one(reply="", data=b"")
    tail = (1000).to_bytes(2, "big")  # a reply length with nothing after it
    crc = zlib.crc32(tail, zlib.crc32(value[:8], zlib.crc32(key)))
    forged = value[:8] + crc.to_bytes(4, "big") + tail
    with pytest.raises(IntegrityError, match="reply length past the end"):
        decode_message(key, forged, "ch")


@given(
    bodies=st.lists(
        st.tuples(
            st.sampled_from(["", "", "_INBOX.r"]),
            st.sampled_from(["", "", "text/plain"]),
            st.binary(max_size=40),
        ),
        min_size=1,
        max_size=8,
    ),
    damage=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 80), st.integers(1, 255)), max_size=2),
    cut=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 20)), max_size=1),
    views=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_decode_messages_answers_as_decode_message_does_for_each(
    bodies: list[tuple[str, str, bytes]],
    damage: list[tuple[int, int, int]],
    cut: list[tuple[int, int]],
    views: list[bool],
) -> None:
    """Whatever the values hold (replies, content types, flipped bytes, short values, memoryviews):
    the same messages in the same order, or the same error for the first bad one."""
    pairs = encode_run(7, 1, 1_700_000_000_000_000_000, [(encode_head(r, t), d) for r, t, d in bodies])
    values = [bytearray(v) for _, v in pairs]
    for which, offset, xor in damage:
        if which < len(values) and offset < len(values[which]):
            values[which][offset] ^= xor
    for which, length in cut:
        if which < len(values):
            del values[which][length:]
    items = [
        (k, memoryview(bytes(v)) if view else bytes(v))
        for (k, _), v, view in zip(pairs, values, views[: len(pairs)], strict=True)
    ]
    try:
        expected: list[object] = [decode_message(k, v, "ch") for k, v in items]
    except IntegrityError as error:
        with pytest.raises(IntegrityError) as got:
            decode_messages(items, "ch")
        assert str(got.value) == str(error)
    else:
        assert decode_messages(items, "ch") == expected
