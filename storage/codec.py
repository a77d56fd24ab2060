"""Byte layouts of what the LMDB store writes: keys, message values with their checksum, records.

Keys are fixed-width big-endian integers so byte order is numeric order and a cursor's `set_range`
finds "first >= seq". A message value is

    timestamp_unix_ns (>q) | crc32 (>I) | reply length (>H) | reply (utf-8) | [content type] | data

where the reply length's high bit says that the publisher's content type follows the reply, as its
length (>B) and its bytes (ASCII, a media type as HTTP carries it). Values without one are laid out as
before the content type existed. The CRC covers the key (channel id and sequence, so a value found
under the wrong key is caught too), the timestamp and everything after the CRC. Records that change
rarely (subscriptions, clients, channel names) are JSON produced by cattrs, so adding a field does
not need a migration.
"""

from __future__ import annotations

import json
import struct
import zlib
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import cattrs.preconf.json

from storage.errors import IntegrityError
from storage.records import ChannelInfo, Message

U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
MSG_KEY = struct.Struct(">IQ")  # channel id, sequence
PENDING_KEY = struct.Struct(">QQ")  # subscription id, sequence
# A pending entry's value is its attempt count (U32); one given back with a nak and a delay also
# holds the time before which it is not sent again.
NAKED_PENDING = struct.Struct(">IQ")  # attempt count, not before (Unix ns)
_TS = struct.Struct(">q")
_REPLY_LEN = struct.Struct(">H")
_CRC = struct.Struct(">I")
MSG_HEADER_SIZE = _TS.size + _CRC.size + _REPLY_LEN.size
_HEADER = struct.Struct(">qIH")  # timestamp, crc, reply length: the value's first MSG_HEADER_SIZE bytes
_CRC_END = _TS.size + _CRC.size  # the checksum covers the key, the timestamp and everything from here
_SEQ_OF_KEY = struct.Struct(">Q")  # the sequence half of MSG_KEY, at offset 4
_HAS_TYPE = 0x8000  # in the reply length: a content type follows the reply
MAX_REPLY_BYTES = 0x7FFF  # a reply subject is a NATS subject: far shorter (the control line is 4 KiB)
MAX_CONTENT_TYPE_BYTES = 0xFF
_CHANNEL = struct.Struct(">IQQQQq")  # id, first, last, msgs, bytes, last timestamp
# A journal record's body is runs of one channel's messages: this header, then per message its value's
# length (U32) and the value. The values are the LMDB values, checksums and all.
JOURNAL_RUN = struct.Struct(">IQqI")  # channel id, first seq, timestamp, count

Raw = bytes | memoryview  # what LMDB hands back
_converter = cattrs.preconf.json.make_converter()
T = TypeVar("T")


def message_size(reply: bytes, data: bytes, content_type: str = "") -> int:
    """Bytes a message counts for against MaxBytes: its stored value (same in every store)."""
    return MSG_HEADER_SIZE + len(reply) + len(data) + (1 + len(content_type) if content_type else 0)


def value_size(head: bytes, data: bytes) -> int:
    """The size of a stored value with this head (from `encode_head`) and data."""
    return _TS.size + _CRC.size + len(head) + len(data)


EMPTY_HEAD = b"\x00\x00"  # the head of a message with neither reply nor content type


def encode_head(reply: str, content_type: str = "") -> bytes:
    """The part of a message value between its checksum and its data: the reply length (flagged when
    a content type follows), the reply, and the content type. Raises ValueError for either too long
    or a content type that is not printable ASCII."""
    if not reply and not content_type:
        return EMPTY_HEAD
    encoded = reply.encode()
    if len(encoded) > MAX_REPLY_BYTES:
        raise ValueError(f"reply subject of {len(encoded)} bytes exceeds {MAX_REPLY_BYTES}")
    if not content_type:
        return _REPLY_LEN.pack(len(encoded)) + encoded
    if not content_type.isascii() or not content_type.isprintable():
        raise ValueError("content type must be printable ASCII")
    if len(content_type) > MAX_CONTENT_TYPE_BYTES:
        raise ValueError(f"content type of {len(content_type)} bytes exceeds {MAX_CONTENT_TYPE_BYTES}")
    return b"".join(
        (_REPLY_LEN.pack(len(encoded) | _HAS_TYPE), encoded, bytes((len(content_type),)), content_type.encode())
    )


def encode_run(
    channel_id: int, first_seq: int, timestamp_unix_ns: int, messages: Sequence[tuple[bytes, bytes]]
) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs for consecutive messages of one channel sharing one timestamp.

    `messages` are (head, data) pairs, the head from `encode_head`. This is the publish hot path: names
    are bound locally and each message costs one key pack, two CRC calls and one join.
    """
    ts = _TS.pack(timestamp_unix_ns)
    pack_key, pack_crc, crc32 = MSG_KEY.pack, _CRC.pack, zlib.crc32
    out = []
    seq = first_seq
    for head, data in messages:
        key = pack_key(channel_id, seq)
        crc = crc32(data, crc32(head, crc32(key + ts)))
        out.append((key, b"".join((ts, pack_crc(crc), head, data))))
        seq += 1
    return out


def encode_message(channel_id: int, seq: int, timestamp_unix_ns: int, head: bytes, data: bytes) -> tuple[bytes, bytes]:
    """(key, value) of one message with a timestamp of its own (a bulk load keeps each message's)."""
    key = MSG_KEY.pack(channel_id, seq)
    ts = _TS.pack(timestamp_unix_ns)
    return key, b"".join((ts, _CRC.pack(zlib.crc32(data, zlib.crc32(key + ts + head))), head, data))


def message_timestamp(value: Raw) -> int:
    """The timestamp of an encoded message, without verifying it (used by eviction only)."""
    return int(_TS.unpack_from(value)[0])


def decode_message(key: Raw, value: Raw, channel: str) -> Message:
    """The stored message under `key`, checksum verified. This is the read path of every delivery
    and redelivery that is not in memory, so it does one header unpack and one CRC chain over the
    key and two slices of the value."""
    if len(value) < MSG_HEADER_SIZE:
        raise _corrupt(key, channel, f"value of {len(value)} bytes is shorter than its header")
    timestamp, stored_crc, reply_len = _HEADER.unpack_from(value)
    crc32 = zlib.crc32
    if crc32(value[_CRC_END:], crc32(value[: _TS.size], crc32(key))) != stored_crc:
        raise _corrupt(key, channel, "checksum mismatch")
    if reply_len & _HAS_TYPE:
        return _decode_typed(key, value, channel, timestamp, reply_len & ~_HAS_TYPE)
    reply_end = MSG_HEADER_SIZE + reply_len
    if reply_end > len(value):
        raise _corrupt(key, channel, "reply length past the end of the value")
    data = value[reply_end:]  # already a new bytes object unless `value` is a memoryview: copy only then
    return Message(
        _SEQ_OF_KEY.unpack_from(key, 4)[0],
        timestamp,
        channel,
        str(value[MSG_HEADER_SIZE:reply_end], "utf-8") if reply_len else "",
        data if type(data) is bytes else bytes(data),
    )


def decode_messages(items: Iterable[tuple[Raw, Raw]], channel: str) -> list[Message]:
    """`decode_message` of each (key, value) in order, for a read of many: a message with neither
    reply nor content type (what a read mostly meets) is decoded here with names bound once, every
    other one, and any that fails a check, by `decode_message`, which raises as it does."""
    unpack_header, seq_of_key, crc32, new = _HEADER.unpack_from, _SEQ_OF_KEY.unpack_from, zlib.crc32, Message
    out: list[Message] = []
    append = out.append
    for key, value in items:
        if type(value) is not bytes or len(value) < MSG_HEADER_SIZE:
            append(decode_message(key, value, channel))
            continue
        timestamp, stored_crc, reply_len = unpack_header(value)
        if reply_len or crc32(value[_CRC_END:], crc32(value[: _TS.size], crc32(key))) != stored_crc:
            append(decode_message(key, value, channel))
        else:
            append(new(seq_of_key(key, 4)[0], timestamp, channel, "", value[MSG_HEADER_SIZE:]))
    return out


def _decode_typed(key: Raw, value: Raw, channel: str, timestamp: int, reply_len: int) -> Message:
    """`decode_message` for a value that carries a content type (checksum already verified)."""
    reply_end = MSG_HEADER_SIZE + reply_len
    if reply_end >= len(value) or reply_end + 1 + value[reply_end] > len(value):
        raise _corrupt(key, channel, "reply or content type past the end of the value")
    type_end = reply_end + 1 + value[reply_end]
    content_type = bytes(value[reply_end + 1 : type_end])
    if not content_type.isascii():
        raise _corrupt(key, channel, "content type is not ASCII")
    return Message(
        _SEQ_OF_KEY.unpack_from(key, 4)[0],
        timestamp,
        channel,
        str(value[MSG_HEADER_SIZE:reply_end], "utf-8"),
        bytes(value[type_end:]),
        content_type.decode("ascii"),
    )


def value_intact(key: Raw, value: Raw) -> bool:
    """Whether a stored message value passes its checksum (the full check, without decoding)."""
    if len(value) < MSG_HEADER_SIZE:
        return False
    crc32 = zlib.crc32
    stored: int = _CRC.unpack_from(value, _TS.size)[0]
    return crc32(value[_CRC_END:], crc32(value[: _TS.size], crc32(key))) == stored


def key_seq(key: Raw) -> int:
    """The sequence half of a message key."""
    return int(_SEQ_OF_KEY.unpack_from(key, 4)[0])


def _corrupt(key: Raw, channel: str, why: str) -> IntegrityError:
    if len(key) != MSG_KEY.size:  # no sequence to name: say what is wrong instead
        return IntegrityError(f"channel {channel!r}: a message's key is damaged ({len(key)} bytes)")
    return IntegrityError(f"channel {channel!r} message {MSG_KEY.unpack(key)[1]}: stored value is corrupt ({why})")


def encode_channel(info: ChannelInfo) -> bytes:
    return (
        _CHANNEL.pack(
            info.channel_id, info.first_seq, info.last_seq, info.msgs, info.bytes, info.last_timestamp_unix_ns
        )
        + info.name.encode()
    )


def decode_channel(value: Raw) -> ChannelInfo:
    if len(value) < _CHANNEL.size:
        raise IntegrityError(f"channel record of {len(value)} bytes is truncated")
    channel_id, first, last, msgs, size, last_ts = _CHANNEL.unpack_from(value)
    return ChannelInfo(
        name=bytes(value[_CHANNEL.size :]).decode(),
        channel_id=channel_id,
        first_seq=first,
        last_seq=last,
        msgs=msgs,
        bytes=size,
        last_timestamp_unix_ns=last_ts,
    )


def spans(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Sequences as (first, last) runs."""
    return merge_spans((seq, seq) for seq in seqs)


def lost_key(channel_id: int) -> bytes:
    """Where a repair records (in the message file's meta) the sequences of a channel it could not save."""
    return b"lost/" + U32.pack(channel_id)


def merge_spans(runs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(first, last) runs sorted, with those that overlap or touch joined."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(runs):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def in_spans(seq: int, runs: list[tuple[int, int]]) -> bool:
    """Whether `seq` lies in one of `runs` (sorted and joined, as `merge_spans` gives them)."""
    i = bisect_right(runs, (seq, _NO_END)) - 1
    return i >= 0 and runs[i][0] <= seq <= runs[i][1]


_NO_END = 1 << 64  # past any sequence: (seq, _NO_END) sorts after every run that starts at seq


def subtract_spans(runs: list[tuple[int, int]], taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`runs` less every sequence in `taken` (both sorted and joined)."""
    out: list[tuple[int, int]] = []
    j = 0
    for first, last in runs:
        while j < len(taken) and taken[j][1] < first:
            j += 1
        at, k = first, j
        while k < len(taken) and taken[k][0] <= last:
            if taken[k][0] > at:
                out.append((at, taken[k][0] - 1))
            at = max(at, taken[k][1] + 1)
            k += 1
        if at <= last:
            out.append((at, last))
    return out


def encode_lost(runs: Iterable[tuple[int, int]]) -> bytes:
    """A channel's lost sequences as runs: a run of any length costs the same (never one per seq)."""
    return json.dumps([list(span) for span in merge_spans(runs)]).encode()


def decode_lost(raw: Raw | None) -> list[tuple[int, int]]:
    if raw is None:
        return []
    return merge_spans((int(first), int(last)) for first, last in json.loads(bytes(raw)))


def encode_record(record: Any) -> bytes:
    return json.dumps(_converter.unstructure(record), separators=(",", ":")).encode()


def decode_record(value: Raw, cls: type[T]) -> T:
    try:
        return _converter.structure(json.loads(bytes(value)), cls)
    except (ValueError, cattrs.BaseValidationError) as exc:
        raise IntegrityError(f"stored {cls.__name__} record is unreadable: {exc}") from exc
