"""The NATS core wire protocol, sans-IO: bytes in, typed events out; events in, bytes out.

`ServerConnection` parses what a client sends (CONNECT, PUB, SUB, UNSUB, PING, PONG);
`ClientConnection` parses what a server sends (INFO, MSG, PING, PONG, +OK, -ERR). Neither touches a
socket: call `receive_data(bytes)`, then `next_event()` until it returns `NEED_DATA`. Chunk boundaries
do not matter. Operation names are case-insensitive, arguments are separated by runs of spaces or
tabs, and a bare LF ends a line as well as CRLF, as nats-server tolerates.

A peer that breaks the rules gets a `RemoteProtocolError` whose text is the `-ERR` to send it; `fatal`
says whether the connection must then be closed.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Final

import attrs

MAX_CONTROL_LINE: Final = 4096
MAX_PAYLOAD: Final = 1024 * 1024


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


class RemoteProtocolError(Exception):
    """The peer broke the protocol; `str()` is the text for `-ERR '...'`."""

    def __init__(self, text: str, *, fatal: bool = True) -> None:
        super().__init__(text)
        self.fatal = fatal


class LocalProtocolError(Exception):
    """We were asked to send something the protocol cannot express (a bug on our side)."""


# Exact texts clients match on (nats-server's -ERR texts); nats-server's "maximum control line" is lower-case.
UNKNOWN_OP: Final = "Unknown Protocol Operation"
MAX_CONTROL_EXCEEDED: Final = "maximum control line exceeded"
MAX_PAYLOAD_VIOLATION: Final = "Maximum Payload Violation"
INVALID_SUBJECT: Final = "Invalid Subject"
INVALID_PUBLISH_SUBJECT: Final = "Invalid Publish Subject"
SLOW_CONSUMER: Final = "Slow Consumer"
STALE_CONNECTION: Final = "Stale Connection"
AUTHENTICATION_TIMEOUT: Final = "Authentication Timeout"  # no CONNECT in time (nats-server's words)
AUTHORIZATION_VIOLATION: Final = "Authorization Violation"  # bad or missing credentials
PERMISSIONS_VIOLATION: Final = "Permissions Violation"  # + ' for Subscription to "subj"' (nats-server's words)


class Event:
    """Base class of everything a parser returns."""

    __slots__ = ()


@attrs.frozen(slots=True)
class Connect(Event):
    options: dict[str, Any]

    @property
    def verbose(self) -> bool:
        return bool(self.options.get("verbose", False))

    @property
    def pedantic(self) -> bool:
        return bool(self.options.get("pedantic", False))

    @property
    def echo(self) -> bool:
        return bool(self.options.get("echo", True))


# Pub and Msg are built once per message: not frozen, because frozen attrs classes cost about twice as
# much to create. Treat them as immutable all the same.
@attrs.define(slots=True)
class Pub(Event):
    subject: str
    reply: str
    payload: bytes


@attrs.frozen(slots=True)
class Sub(Event):
    subject: str
    queue: str
    sid: str


@attrs.frozen(slots=True)
class Unsub(Event):
    sid: str
    max_msgs: int | None = None


@attrs.frozen(slots=True)
class Ping(Event):
    pass


@attrs.frozen(slots=True)
class Pong(Event):
    pass


@attrs.frozen(slots=True)
class Info(Event):
    options: dict[str, Any]


@attrs.define(slots=True)
class Msg(Event):
    subject: str
    sid: str
    reply: str
    payload: bytes


@attrs.frozen(slots=True)
class Ok(Event):
    pass


@attrs.frozen(slots=True)
class Err(Event):
    text: str


PING: Final = Ping()
PONG: Final = Pong()
OK: Final = Ok()


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise RemoteProtocolError(UNKNOWN_OP) from None


def _size(raw: bytes) -> int:
    if not raw.isdigit():
        raise RemoteProtocolError(UNKNOWN_OP)
    return int(raw)


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise RemoteProtocolError(UNKNOWN_OP) from None
    if not isinstance(value, dict):
        raise RemoteProtocolError(UNKNOWN_OP)
    return value


class _Parser:
    """Line framing and payload collection shared by both directions."""

    # The subclass's message operation (PUB or MSG, with its space), how many header fields come
    # before its optional reply subject, and how `_fast_event` makes its event from the header's
    # fields (the reply last, if `with_reply`) and the payload.
    _verb: bytes
    _fields: int

    def _fast_event(self, args: list[bytearray], with_reply: int, payload: bytes) -> Event:
        raise NotImplementedError

    def _fast_message(self, buf: bytearray, pos: int) -> tuple[Event, int] | None:
        """The message operation at `pos` as peers write it (CRLF) with its payload already
        buffered, and where the next operation starts; None for anything else (every error
        included), which the general path then parses. Found and split with bytes methods, not a
        regex: a third less per message (bench/README.md, **wire**). What it makes of a line is what
        the general path makes of it (a property test holds it to that)."""
        if not buf.startswith(self._verb, pos):
            return None
        nl = buf.find(b"\n", pos, pos + self.max_control_line + 1)
        if nl < 0 or buf[nl - 1] != 13:  # 13: \r
            return None
        args = buf[pos + 4 : nl - 1].split()  # after the verb and its space
        with_reply = len(args) - 1 - self._fields
        if not (with_reply == 0 or with_reply == 1) or not args[-1].isdigit():
            return None
        start = nl + 1
        end = start + int(args[-1])
        if end - start > self.max_payload or buf[end : end + 2] != b"\r\n":
            return None
        try:
            event = self._fast_event(args, with_reply, bytes(buf[start:end]))
        except UnicodeDecodeError:
            return None  # the general path reports it
        self._line_at = pos
        return event, end + 2

    def __init__(self, max_payload: int, max_control_line: int) -> None:
        self.max_payload = max_payload
        self.max_control_line = max_control_line
        self._buf = bytearray()
        self._pos = 0
        self._payload: tuple[Any, int] | None = None  # (header, size) of a message awaiting its payload
        self._line_at = -1  # where the last event's control line starts, if the fast path made it
        self.closed = False

    def receive_data(self, data: bytes) -> None:
        buf = self._buf
        if self._pos:
            if self._pos >= len(buf):
                buf.clear()
                self._pos = 0
            elif self._pos > 65536:
                del buf[: self._pos]
                self._pos = 0
        self._line_at = -1
        buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def next_event(self) -> Event | _NeedData:
        buf = self._buf
        if self._payload is None:
            found = self._fast_message(buf, self._pos)
            if found is not None:
                event, self._pos = found
                return event
            self._line_at = -1
        else:
            self._line_at = -1
            header, size = self._payload
            end = self._pos + size
            if len(buf) < end + 2:
                return NEED_DATA
            if buf[end : end + 2] != b"\r\n":
                if buf[end : end + 1] != b"\n":
                    raise RemoteProtocolError(UNKNOWN_OP)
                self._pos = end + 1
            else:
                self._pos = end + 2
            self._payload = None
            return self._with_payload(header, bytes(buf[end - size : end]))
        nl = buf.find(b"\n", self._pos)
        if nl < 0:
            if len(buf) - self._pos > self.max_control_line:
                raise RemoteProtocolError(MAX_CONTROL_EXCEEDED)
            return NEED_DATA
        line = bytes(buf[self._pos : nl])
        if len(line) > self.max_control_line:
            raise RemoteProtocolError(MAX_CONTROL_EXCEEDED)
        self._pos = nl + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        parts = line.split(None, 1)
        if not parts:
            raise RemoteProtocolError(UNKNOWN_OP)
        op = parts[0].upper()
        rest = parts[1] if len(parts) > 1 else b""
        return self._control(op, rest)

    def repeats(self, limit: int) -> list[bytes]:
        """The payloads of up to `limit` operations right after the last event that repeat its control
        line byte for byte (the same verb, subject, reply and size): a burst of acks to one inbox, or
        of publishes to one channel, comes to a run-taking handler in one call. Only a message the
        fast path made has runs ([] otherwise); what follows a run is parsed as usual."""
        at = self._line_at
        buf, pos = self._buf, self._pos
        step = pos - at  # the last event, its line, payload and CRLF, ran from `at` to `pos`
        # When nothing repeats, the length of what follows mostly shows it, without a copy.
        if at < 0 or limit <= 0 or len(buf) < pos + step or buf[pos + step - 1] != 10:  # 10: \n
            return []
        skip = buf.find(b"\n", at, pos) + 1 - at
        line = bytes(buf[at : at + skip])
        # Mostly the whole rest of the buffer repeats (its last operation shows it): then the payloads
        # are sliced at their places, and the run they would make is compared with the buffer in one
        # C call, where checking each control line took two calls a message. Else, the loop.
        count = min(limit, (len(buf) - pos) // step)
        last = pos + (count - 1) * step
        if count > 1 and buf.startswith(line, last) and buf.startswith(b"\r\n", last + step - 2):
            chunk = bytes(buf[pos : last + step])
            payloads = [chunk[i + skip : i + step - 2] for i in range(0, count * step, step)]
            if _each_after(line, payloads) == chunk:
                self._pos, self._line_at = last + step, last
                return payloads
        starts, end = buf.startswith, pos
        while limit > 0 and starts(line, end) and starts(b"\r\n", end + step - 2):
            end += step
            limit -= 1
        if end == pos:
            return []
        chunk = bytes(buf[pos:end])  # the run is copied once, and each payload sliced from the copy
        self._pos, self._line_at = end, end - step
        return [chunk[i + skip : i + step - 2] for i in range(0, end - pos, step)]

    def _expect_payload(self, header: Any, size: int) -> Event | _NeedData:
        if size > self.max_payload:
            raise RemoteProtocolError(MAX_PAYLOAD_VIOLATION)
        buf, start = self._buf, self._pos
        end = start + size
        if buf[end : end + 2] == b"\r\n":  # the common case: the whole payload is here already
            self._pos = end + 2
            return self._with_payload(header, bytes(buf[start:end]))
        self._payload = (header, size)
        return self.next_event()

    def _control(self, op: bytes, rest: bytes) -> Event | _NeedData:
        raise NotImplementedError

    def _with_payload(self, header: Any, payload: bytes) -> Event:
        raise NotImplementedError


class ServerConnection(_Parser):
    """The server's side of one client connection: parses client operations."""

    _verb = b"PUB "
    _fields = 1  # subject

    def _fast_event(self, args: list[bytearray], with_reply: int, payload: bytes) -> Event:
        return Pub(args[0].decode(), args[1].decode() if with_reply else "", payload)

    def __init__(self, max_payload: int = MAX_PAYLOAD, max_control_line: int = MAX_CONTROL_LINE) -> None:
        super().__init__(max_payload, max_control_line)

    def _control(self, op: bytes, rest: bytes) -> Event | _NeedData:
        if op == b"PUB":
            args = rest.split()
            try:
                if len(args) == 2:
                    header = (args[0].decode(), "")
                elif len(args) == 3:
                    header = (args[0].decode(), args[1].decode())
                else:
                    raise RemoteProtocolError(UNKNOWN_OP)
            except UnicodeDecodeError:
                raise RemoteProtocolError(UNKNOWN_OP) from None
            return self._expect_payload(header, _size(args[-1]))
        if op == b"PING":
            return PING
        if op == b"PONG":
            return PONG
        if op == b"SUB":
            args = rest.split()
            if len(args) == 2:
                return Sub(_text(args[0]), "", _text(args[1]))
            if len(args) == 3:
                return Sub(_text(args[0]), _text(args[1]), _text(args[2]))
            raise RemoteProtocolError(UNKNOWN_OP)
        if op == b"UNSUB":
            args = rest.split()
            if len(args) == 1:
                return Unsub(_text(args[0]))
            if len(args) == 2:
                return Unsub(_text(args[0]), _size(args[1]))
            raise RemoteProtocolError(UNKNOWN_OP)
        if op == b"CONNECT":
            return Connect(_json(rest))
        raise RemoteProtocolError(UNKNOWN_OP)

    def _with_payload(self, header: Any, payload: bytes) -> Event:
        subject, reply = header
        return Pub(subject, reply, payload)


class ClientConnection(_Parser):
    """A client's side of its connection: parses server operations."""

    _verb = b"MSG "
    _fields = 2  # subject, sid

    def _fast_event(self, args: list[bytearray], with_reply: int, payload: bytes) -> Event:
        return Msg(args[0].decode(), args[1].decode(), args[2].decode() if with_reply else "", payload)

    def __init__(self, max_payload: int = 64 * MAX_PAYLOAD, max_control_line: int = MAX_CONTROL_LINE) -> None:
        super().__init__(max_payload, max_control_line)

    def _control(self, op: bytes, rest: bytes) -> Event | _NeedData:
        if op == b"MSG":
            args = rest.split()
            if len(args) == 3:
                return self._expect_payload((_text(args[0]), _text(args[1]), ""), _size(args[2]))
            if len(args) == 4:
                return self._expect_payload((_text(args[0]), _text(args[1]), _text(args[2])), _size(args[3]))
            raise RemoteProtocolError(UNKNOWN_OP)
        if op == b"PING":
            return PING
        if op == b"PONG":
            return PONG
        if op == b"+OK":
            return OK
        if op == b"-ERR":
            return Err(_text(rest).strip().strip("'"))
        if op == b"INFO":
            return Info(_json(rest))
        raise RemoteProtocolError(UNKNOWN_OP)

    def _with_payload(self, header: Any, payload: bytes) -> Event:
        subject, sid, reply = header
        return Msg(subject, sid, reply, payload)


# -- serialising -----------------------------------------------------------------------------------


_WHITESPACE = re.compile(r"\s")


@functools.lru_cache(maxsize=4096)  # a client publishes to few subjects, many times each
def _valid_token(value: str) -> bool:
    return bool(value) and _WHITESPACE.search(value) is None


def _check_token(value: str, what: str) -> None:
    if not _valid_token(value):
        raise LocalProtocolError(f"invalid {what}: {value!r}")


def encode_info(options: dict[str, Any]) -> bytes:
    return b"INFO " + json.dumps(options, separators=(",", ":")).encode() + b"\r\n"


def encode_connect(options: dict[str, Any]) -> bytes:
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + b"\r\n"


def encode_msg(subject: str, sid: str, reply: str, payload: bytes) -> bytes:
    if reply:
        return f"MSG {subject} {sid} {reply} {len(payload)}\r\n".encode() + payload + b"\r\n"
    return f"MSG {subject} {sid} {len(payload)}\r\n".encode() + payload + b"\r\n"


def encode_msgs(subject: str, sid: str, payloads: list[bytes]) -> bytes:
    """Several MSGs to one subscription, without reply subjects, as one buffer (a run of deliveries,
    the PubAcks of a commit). When the payloads are all one size, as a publisher's PubAcks and a run of
    equal messages mostly are, they share one control line and the buffer is one join: a fifth of the
    cost of a line formatted per message (bench/README.md, **wire**)."""
    prefix = f"MSG {subject} {sid} ".encode()
    if len(payloads) > 1 and len(set(map(len, payloads))) == 1:
        return _each_after(b"%b%d\r\n" % (prefix, len(payloads[0])), payloads)
    return b"".join(b"%b%d\r\n%b\r\n" % (prefix, len(p), p) for p in payloads)


def _each_after(line: bytes, payloads: list[bytes]) -> bytes:
    """Operations that share one control line (so payloads of one size): each payload after `line`
    and before CRLF, in one join."""
    return line + (b"\r\n" + line).join(payloads) + b"\r\n"


def encode_pub(subject: str, reply: str, payload: bytes) -> bytes:
    _check_token(subject, "subject")
    if reply:
        _check_token(reply, "reply subject")
        return f"PUB {subject} {reply} {len(payload)}\r\n".encode() + payload + b"\r\n"
    return f"PUB {subject} {len(payload)}\r\n".encode() + payload + b"\r\n"


def encode_sub(subject: str, sid: str, queue: str = "") -> bytes:
    _check_token(subject, "subject")
    return f"SUB {subject} {queue} {sid}\r\n".encode() if queue else f"SUB {subject} {sid}\r\n".encode()


def encode_unsub(sid: str, max_msgs: int | None = None) -> bytes:
    return f"UNSUB {sid} {max_msgs}\r\n".encode() if max_msgs is not None else f"UNSUB {sid}\r\n".encode()


def encode_err(text: str) -> bytes:
    if "'" in text or "\r" in text or "\n" in text:
        raise LocalProtocolError(f"-ERR text cannot contain quotes or line breaks: {text!r}")
    return f"-ERR '{text}'\r\n".encode()


PING_BYTES: Final = b"PING\r\n"
PONG_BYTES: Final = b"PONG\r\n"
OK_BYTES: Final = b"+OK\r\n"
