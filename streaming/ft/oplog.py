"""The records of a fault-tolerance group's replicated log, as bytes: what the active did to its store,
in the order it did it, so that every member's store can be rebuilt by doing the same (sans-IO).

One record is one store call:

- `Genesis`: the log's first record; a random id that names this log, so a member's data directory
  made from another log (the stream deleted and created again) is told apart and rebuilt.
- `Epoch`: a member became the active (its name, its epoch, a digest of its channel limits). Appended
  with the log's last sequence expected, it fences the previous active.
- `CreateChannel`, `DeleteChannel`, `Expire` (with the wall-clock time it used), `Apply` (subscription,
  pending and client updates, in order).
- `Append`: one batch of messages with the time it was stored at and, per channel, the sequence its
  first message gets. Replaying it on a store that already holds it (a replay from an older position)
  is recognised by those sequences and skipped, so that replay is idempotent; a store that is neither
  before nor at them has diverged, and says so.

Layout: a kind byte, then the kind's fields. Appends are binary (payloads are arbitrary bytes); the
rest are JSON: the store's own records as cattrs makes them, but for the updates that deliveries and acks
write by the thousand, which are flat lists of their numbers. `decode` raises `LogRecordError` for
anything that is not a record this version wrote, whatever the bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

import attrs
import cattrs.preconf.json
import orjson

from storage.records import (
    ClearPending,
    ClearPendingRun,
    DeleteClient,
    DeleteSubscription,
    MessageToAppend,
    NewMessage,
    SaveClient,
    SaveSubscription,
    SetLastSent,
    SetPending,
    SetPendingRun,
    SubUpdate,
)


class LogRecordError(ValueError):
    """Bytes that are not a log record (damage, or a writer of another version)."""


@attrs.frozen
class Genesis:
    log_id: str


@attrs.frozen
class Epoch:
    member: str
    epoch: int
    limits_digest: str


@attrs.frozen
class CreateChannel:
    name: str


@attrs.frozen
class DeleteChannel:
    name: str


@attrs.frozen
class Expire:
    now_unix_ns: int


@attrs.frozen
class Apply:
    updates: tuple[SubUpdate, ...]


@attrs.frozen
class Append:
    now_unix_ns: int
    first_seqs: dict[str, int]  # per channel of the batch: the sequence its first message gets
    messages: tuple[NewMessage, ...]


Record = Genesis | Epoch | CreateChannel | DeleteChannel | Expire | Apply | Append

_APPEND = b"A"
_JSON_KINDS: dict[bytes, type[Any]] = {
    b"G": Genesis,
    b"E": Epoch,
    b"C": CreateChannel,
    b"D": DeleteChannel,
    b"X": Expire,
}
_KIND_OF = {cls: kind for kind, cls in _JSON_KINDS.items()}
_UPDATES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        SaveSubscription,
        DeleteSubscription,
        SetLastSent,
        SetPending,
        ClearPending,
        SetPendingRun,
        ClearPendingRun,
        SaveClient,
        DeleteClient,
    )
}
_converter = cattrs.preconf.json.make_converter()
_HEAD = struct.Struct(">qHI")  # now, channels, messages
_CHANNEL = struct.Struct(">HQ")  # name length, first sequence
_MESSAGE = struct.Struct(">HHBI")  # channel index, reply length, content type length, data length


def encode(record: Record) -> bytes:
    if isinstance(record, Append):
        return _encode_append(record)
    if isinstance(record, Apply):
        return b"U" + orjson.dumps([_plain(u) for u in record.updates])
    return _KIND_OF[type(record)] + json.dumps(_converter.unstructure(record)).encode()


def append_record(messages: Sequence[MessageToAppend], now_unix_ns: int, first_seqs: dict[str, int]) -> Append:
    return Append(
        now_unix_ns,
        first_seqs,
        tuple(NewMessage(m.channel, m.data, m.reply, m.content_type) for m in messages),
    )


def _encode_append(record: Append) -> bytes:
    index = {name: i for i, name in enumerate(record.first_seqs)}
    parts = [_APPEND, _HEAD.pack(record.now_unix_ns, len(index), len(record.messages))]
    for name, first in record.first_seqs.items():
        raw = name.encode()
        parts += [_CHANNEL.pack(len(raw), first), raw]
    for m in record.messages:
        reply, content_type = m.reply.encode(), m.content_type.encode("ascii")
        parts += [_MESSAGE.pack(index[m.channel], len(reply), len(content_type), len(m.data)), reply, content_type]
        parts.append(m.data)
    return b"".join(parts)


def decode(raw: bytes) -> Record:
    if not raw:
        raise LogRecordError("empty log record")
    kind, body = raw[:1], raw[1:]
    try:
        if kind == _APPEND:
            return _decode_append(body)
        if kind == b"U":
            items = orjson.loads(body)
            if not isinstance(items, list):
                raise LogRecordError("updates are not a list")
            return Apply(tuple(_update(item) for item in items))
        cls = _JSON_KINDS.get(kind)
        if cls is None:
            raise LogRecordError(f"unknown log record kind {kind!r}")
        record: Record = _converter.structure(json.loads(body), cls)
        return record
    except LogRecordError:
        raise
    except (ValueError, TypeError, KeyError, struct.error, UnicodeDecodeError, cattrs.BaseValidationError) as exc:
        raise LogRecordError(f"damaged log record: {exc}") from None


def _plain(u: SubUpdate) -> list[Any]:
    """An update as JSON: the kinds a stream of deliveries and acks writes by the thousand as a flat
    list of their numbers (what the active and every standby encode and decode per record), the rest
    as cattrs makes them."""
    if isinstance(u, SetPendingRun | ClearPendingRun):
        return [type(u).__name__, u.sub_id, u.seqs]
    if isinstance(u, SetLastSent):
        return ["SetLastSent", u.sub_id, u.last_sent]
    if isinstance(u, ClearPending):
        return ["ClearPending", u.sub_id, u.seq]
    if isinstance(u, SetPending):
        if u.not_before_ns:
            return ["SetPending", u.sub_id, u.seq, u.attempt, u.fresh, u.not_before_ns]
        return ["SetPending", u.sub_id, u.seq, u.attempt, u.fresh]
    return [type(u).__name__, _converter.unstructure(u)]


def _ints(values: Any, count: int) -> bool:
    return len(values) == count and all(type(v) is int for v in values)


def _update(item: Any) -> SubUpdate:
    if not (isinstance(item, list) and item and isinstance(item[0], str) and item[0] in _UPDATES):
        raise LogRecordError(f"not a subscription update: {str(item)[:80]}")
    kind, rest = item[0], item[1:]
    if kind in ("SetPendingRun", "ClearPendingRun"):
        if len(rest) == 2 and type(rest[0]) is int and isinstance(rest[1], list) and _ints(rest[1], len(rest[1])):
            return SetPendingRun(rest[0], rest[1]) if kind == "SetPendingRun" else ClearPendingRun(rest[0], rest[1])
    elif kind in ("SetLastSent", "ClearPending"):
        if _ints(rest, 2):
            return SetLastSent(*rest) if kind == "SetLastSent" else ClearPending(*rest)
    elif kind == "SetPending":
        if _ints(rest[:3], 3) and len(rest) == 4 and type(rest[3]) is bool:
            return SetPending(*rest)
        if _ints(rest[:3], 3) and len(rest) == 5 and type(rest[3]) is bool and _ints(rest[4:], 1):
            return SetPending(*rest)
    elif len(rest) == 1:
        update: SubUpdate = _converter.structure(rest[0], _UPDATES[kind])
        return update
    raise LogRecordError(f"damaged {kind} update: {str(rest)[:80]}")


def _decode_append(body: bytes) -> Append:
    view = memoryview(body)
    now, channel_count, message_count = _HEAD.unpack_from(view, 0)
    pos = _HEAD.size
    names: list[str] = []
    first_seqs: dict[str, int] = {}
    for _ in range(channel_count):
        length, first = _CHANNEL.unpack_from(view, pos)
        pos += _CHANNEL.size
        name = bytes(view[pos : pos + length]).decode()
        pos += length
        if len(name.encode()) != length or not name or name in first_seqs:
            raise LogRecordError("damaged append record: bad channel table")
        names.append(name)
        first_seqs[name] = first
    messages: list[NewMessage] = []
    for _ in range(message_count):
        channel, reply_len, type_len, data_len = _MESSAGE.unpack_from(view, pos)
        pos += _MESSAGE.size
        end = pos + reply_len + type_len + data_len
        if channel >= len(names) or end > len(view):
            raise LogRecordError("damaged append record: a message runs past the record")
        reply = bytes(view[pos : pos + reply_len]).decode()
        content_type = bytes(view[pos + reply_len : pos + reply_len + type_len]).decode("ascii")
        messages.append(NewMessage(names[channel], bytes(view[end - data_len : end]), reply, content_type))
        pos = end
    if pos != len(view):
        raise LogRecordError("damaged append record: bytes after its last message")
    return Append(now, first_seqs, tuple(messages))
