"""Bayeux sessions and the ack extension's batches, sans-IO: message checks, replies, session
lifetimes and the unacknowledged queue. Time is given, never read; nothing here awaits or does I/O.

The ack extension (CometD's `AcknowledgedMessagesExtension`), per ack-enabled session:
- a message routed to the session is queued in `unacked` with the batch then open (`next_batch`);
- each successful `/meta/connect` reply closes the open batch B (`ext.ack = B`) and carries every
  queued entry, oldest first: those sent before and not acknowledged, then the new ones;
- the next connect's `ext.ack = A` removes the entries tagged <= A (A is clamped to the last closed
  batch: entries never sent are never dropped); what is removed is acknowledged to the engine;
- a connect is answered at once while anything is queued, so unacknowledged entries (a lost reply)
  go out again, ahead of newer ones, under a fresh batch number.
A session without the extension sends what is queued in the next connect reply and forgets it.
"""

from __future__ import annotations

import base64
import json
import math
import re
import secrets
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

import attrs
import orjson

from streaming.bayeux import channels
from streaming.core.outbound import MAX_NAK_DELAY_S, Message

SESSION_UNKNOWN: Final = "402::session_unknown"
CHANNEL_MISSING: Final = "400::channel_missing"
CHANNEL_INVALID: Final = "405::channel_invalid"
MESSAGE_ID_INVALID: Final = "405::message_id_invalid"
MESSAGE_INVALID: Final = "400::message_invalid"  # an array element that is not a JSON object
SUBSCRIPTION_MISSING: Final = "403::subscription_missing"
SUBSCRIPTION_INVALID: Final = "403::subscription_invalid"
SUBSCRIBE_FAILED: Final = "403::subscribe_failed"
PUBLISH_FAILED: Final = "500::publish_failed"  # the store refused the message (a full disk, ...)
SUBSCRIBE_DENIED: Final = "403::subscribe_denied"  # the user's permissions do not allow the channel
PUBLISH_DENIED: Final = "403::publish_denied"
CONNECTION_TYPE_UNSUPPORTED: Final = "409::connection_type_unsupported"
HANDSHAKE_ALONE: Final = "400::handshake_must_be_alone"
DURABLE_INVALID: Final = "400::durable_invalid"  # `ext.durable` is not a name
DURABLE_IN_USE: Final = "409::durable_in_use"  # another session holds the durable
_DURABLE_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")

VERSION: Final = "1.0"
CONNECTION_TYPES: Final = ["websocket", "long-polling"]


class BadBody(Exception):
    """The request body is not a JSON object or array of objects; `str()` says why."""


@attrs.frozen
class BayeuxSettings:
    timeout_s: float = 30.0  # longest a connect with nothing to deliver is held
    interval_s: float = 0.0  # the pause the client leaves between a connect reply and the next connect
    max_interval_s: float = 10.0  # a session with no connect for interval + this expires
    max_unacked: int = 1024  # messages per subscription outside the log, waiting for the client's ack
    sweep_s: float = 0.997  # how often expiry is checked (CometD's period)

    def advice(self) -> dict[str, Any]:
        return {"reconnect": "retry", "interval": int(self.interval_s * 1000), "timeout": int(self.timeout_s * 1000)}


class Entry:
    """One delivery queued for a session: `tag` is the batch open when it was queued; `sent` says
    whether a connect reply carried it already (it goes again until acknowledged). It is encoded the
    first time a connect reply carries it (`message`), not when the commit that stored it hands it
    over: a publisher's answer then does not wait for its subscribers' deliveries to be written."""

    __slots__ = ("_channel_json", "_message", "_stored", "channel", "sent", "seq", "sub_id", "tag")

    def __init__(
        self,
        tag: int,
        sub_id: int,
        seq: int,
        *,
        stored: Message | None = None,
        channel_json: bytes = b"",
        sent: bool = False,
        channel: bytes = b"",
    ) -> None:
        self.tag = tag
        self.sub_id = sub_id
        self.seq = seq
        self.sent = sent
        self.channel = channel  # its channel, when the session has overlapping (wildcard) subscriptions
        self._stored = stored  # the message until it is encoded, with its channel as JSON
        self._channel_json = channel_json
        self._message = b""

    @property
    def message(self) -> bytes:
        """The delivery, encoded (see `delivery`); empty for a copy riding on another entry."""
        m = self._stored
        if m is not None:
            self._message = delivery(self._channel_json, self.sub_id, self.seq, m.timestamp_unix_ns, m.data)
            self._stored = None
        return self._message


class Session:
    """One Bayeux client: its batches, its queue, its subscriptions (Bayeux channel -> engine sub id).

    A message reaches a session once, however many of its subscriptions match it (`/chat/*` and
    `/chat/**` both match `/chat/a`), as on any Bayeux server: the client hands it to every matching
    listener itself. The other subscriptions' copies *ride* on the one queued: not sent, and
    acknowledged (or given back) with it.
    """

    def __init__(self, client_id: str, *, ack_enabled: bool, expires_at: float) -> None:
        self.client_id = client_id
        self.ack_enabled = ack_enabled
        self.next_batch = 1  # the open batch
        self.unacked: deque[Entry] = deque()
        self._queued: set[tuple[int, int]] = set()  # (sub_id, seq) of every entry in `unacked`
        self.connected = False  # a first connect was answered
        self.expires_at = expires_at  # inf while a connect is held
        self.subscriptions: dict[str, int] = {}
        self.overlapping = False  # it has a wildcard subscription: `queue_run` is given the channel
        self._holders: dict[tuple[bytes, int], tuple[int, int]] = {}  # (channel, seq) -> the entry carrying it
        self._riders: dict[tuple[int, int], list[tuple[int, int]]] = {}  # carrying entry -> copies riding on it
        self._riding: set[tuple[int, int]] = set()

    def queue(self, sub_id: int, channel_json: bytes, message: Message) -> bool:
        """A delivery routed to the session, tagged with the open batch; False (and nothing queued)
        when that message of that subscription is queued already."""
        return self.queue_run(sub_id, channel_json, [message]) == 1

    def queue_run(self, sub_id: int, channel_json: bytes, run: Sequence[Message]) -> int:
        """`queue` of each message of one subscription (on the channel `channel_json` names), in
        order: how many were queued. When the session's subscriptions may overlap, a message queued
        already by another subscription is not queued again but rides on it."""
        tag, queued, append = self.next_batch, self._queued, self.unacked.append
        channel = channel_json if self.overlapping else b""
        count = 0
        for m in run:
            seq = m.seq
            key = (sub_id, seq)
            if key in queued or key in self._riding:
                continue
            if channel:
                carrier = self._holders.setdefault((channel, seq), key)
                if carrier != key:
                    self._riders.setdefault(carrier, []).append(key)
                    self._riding.add(key)
                    continue
            queued.add(key)
            append(Entry(tag, sub_id, seq, stored=m, channel_json=channel_json, channel=channel))
            count += 1
        return count

    def riders(self, entries: list[Entry]) -> list[Entry]:
        """The copies riding on `entries` (which leave the queue), as entries to acknowledge with them."""
        if not self._riders:
            for entry in entries:
                if entry.channel:
                    self._holders.pop((entry.channel, entry.seq), None)
            return []
        out: list[Entry] = []
        for entry in entries:
            if entry.channel:
                self._holders.pop((entry.channel, entry.seq), None)
            for sub_id, seq in self._riders.pop((entry.sub_id, entry.seq), ()):
                self._riding.discard((sub_id, seq))
                out.append(Entry(entry.tag, sub_id, seq, sent=True))
        return out

    def clear(self) -> None:
        """The session ends: its queue goes (nothing in it is acknowledged)."""
        self.unacked.clear()
        self._queued.clear()
        self._holders.clear()
        self._riders.clear()
        self._riding.clear()

    def has_to_send(self) -> bool:
        return bool(self.unacked)

    def acknowledge(self, ack: object) -> list[Entry]:
        """The entries a connect's `ext.ack` acknowledges, removed from the queue. A missing or
        non-numeric value acknowledges nothing; one past the last closed batch is clamped to it."""
        if not self.ack_enabled or isinstance(ack, bool) or not isinstance(ack, int | float):
            return []
        upto = min(int(ack), self.next_batch - 1)
        acked: list[Entry] = []
        unacked, queued = self.unacked, self._queued
        while unacked and unacked[0].tag <= upto:
            entry = unacked.popleft()
            queued.discard((entry.sub_id, entry.seq))
            acked.append(entry)
        return acked + self.riders(acked)

    def give_back(self, naks: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
        """The (sub_id, seq, delay) of `naks` (see `naks_of`) that name a delivery sent to this session
        and not yet acknowledged, removed from the queue (the engine sends each again after its delay,
        and a later `ext.ack` must not acknowledge it). A scan of the queue (at most `max_unacked`
        entries) per connect that carries naks, none for the others."""
        wanted = {(sub_id, seq): delay for sub_id, seq, delay in naks if (sub_id, seq) in self._queued}
        if not wanted:
            return []
        taken: list[tuple[int, int, float]] = []
        kept: deque[Entry] = deque()
        for entry in self.unacked:
            key = (entry.sub_id, entry.seq)
            if entry.sent and key in wanted:
                self._queued.discard(key)
                taken.append((entry.sub_id, entry.seq, wanted[key]))
                taken += [(r.sub_id, r.seq, wanted[key]) for r in self.riders([entry])]
            else:
                kept.append(entry)
        self.unacked = kept
        return taken

    def close_batch(self) -> tuple[int | None, list[Entry], int]:
        """For a connect reply: the batch number it carries (None without the extension), the
        entries it delivers, and how many of those go again. Without the extension the entries leave
        the queue (acknowledge them to the engine at once)."""
        entries = list(self.unacked)
        resent = 0
        for entry in entries:
            resent += entry.sent
            entry.sent = True
        if not self.ack_enabled:
            riding = self.riders(entries)  # acknowledged with what they ride on, at once
            self.clear()
            return None, entries + riding, 0
        batch = self.next_batch
        self.next_batch += 1
        return batch, entries, resent


def new_client_id() -> str:
    """160 random bits, alphanumeric (hex)."""
    return secrets.token_hex(20)


def parse_body(body: bytes) -> list[Any]:
    """The messages of a request body: a JSON array, or a single object. `NaN` and `Infinity` are
    refused (they are not JSON, and JavaScript's `JSON.parse` refuses them too), and so is a number no
    double holds (`1e999`): once parsed, it could only be written back as one of them."""
    try:
        value = json.loads(body, parse_constant=_no_constants, parse_float=_finite)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise BadBody(f"the body is not JSON: {exc}") from None
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list) and value:
        return value
    raise BadBody("the body must be a JSON array of Bayeux messages (or one message object)")


def reply(message: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A reply to `message`: its id (when it had one), its channel, then `fields`."""
    out: dict[str, Any] = {}
    if "id" in message:
        out["id"] = message["id"]
    out["channel"] = message.get("channel")
    out.update(fields)
    return out


def error(message: dict[str, Any], text: str, **fields: Any) -> dict[str, Any]:
    return reply(message, successful=False, error=text, **fields)


def session_unknown(message: dict[str, Any]) -> dict[str, Any]:
    """CometD's answer to an unknown, expired or disconnected clientId (re-handshake advice on meta
    handshake and connect replies only)."""
    if message.get("channel") in ("/meta/handshake", "/meta/connect"):
        return error(message, SESSION_UNKNOWN, advice={"reconnect": "handshake", "interval": 0})
    return error(message, SESSION_UNKNOWN)


def check(message: object) -> dict[str, Any] | None:
    """The error reply for a message no handler may take (not an object, no or a bad channel, a bad
    id); None when it is well formed."""
    if not isinstance(message, dict):
        return {"channel": None, "successful": False, "error": MESSAGE_INVALID}
    msg_id = message.get("id")
    if msg_id is not None and not (isinstance(msg_id, str) and msg_id.isalnum() and msg_id.isascii()):
        return error({k: v for k, v in message.items() if k != "id"}, MESSAGE_ID_INVALID)
    channel = message.get("channel")
    if channel is None:
        return error(message, CHANNEL_MISSING)
    if not channels.valid(channel):
        return error(message, CHANNEL_INVALID)
    return None


def wants_ack(message: dict[str, Any]) -> bool:
    ext = message.get("ext")
    return isinstance(ext, dict) and ext.get("ack") is True


def handshake(message: dict[str, Any], settings: BayeuxSettings, now: float) -> tuple[dict[str, Any], Session | None]:
    """The handshake reply, and the new session (None when refused)."""
    types = message.get("supportedConnectionTypes")
    if isinstance(types, list) and not any(t in CONNECTION_TYPES for t in types):
        return error(message, CONNECTION_TYPE_UNSUPPORTED, supportedConnectionTypes=CONNECTION_TYPES), None
    ack = wants_ack(message)
    session = Session(new_client_id(), ack_enabled=ack, expires_at=now + settings.interval_s + settings.max_interval_s)
    out = reply(
        message,
        successful=True,
        clientId=session.client_id,
        version=VERSION,
        minimumVersion=VERSION,
        supportedConnectionTypes=CONNECTION_TYPES,
        advice=settings.advice(),
    )
    if ack:
        out["ext"] = {"ack": True}
    return out, session


def client_wants_now(message: dict[str, Any]) -> bool:
    """The connect asks for an immediate answer (`advice.timeout == 0`: the client is reconnecting)."""
    advice = message.get("advice")
    return isinstance(advice, dict) and advice.get("timeout") == 0


def connect_reply(
    message: dict[str, Any], batch: int | None, settings: BayeuxSettings, naks: int | None = None
) -> dict[str, Any]:
    """`naks`: how many of the connect's `ext.nak` were taken (None: it carried none)."""
    out = reply(message, successful=True, advice=settings.advice())
    if batch is not None:
        out["ext"] = {"ack": batch}
    if naks is not None:
        out.setdefault("ext", {})["nak"] = naks
    return out


_NAK_ID = re.compile(r"([0-9]{1,18})x([0-9]{1,19})")


def naks_of(message: dict[str, Any]) -> list[tuple[int, int, float]] | None:
    """A connect's `ext.nak` (our extension: messages given back, to come again after a delay): a list
    of delivery ids (`"<sub>x<seq>"`, back at once) or `{"id": ..., "delay": seconds}` objects, as
    (sub_id, seq, delay). None when the connect has no `ext.nak`; elements that are not one of these
    (or a delay outside 0 to 30 days) are left out, and the reply's `ext.nak` says how many were taken."""
    ext = message.get("ext")
    given = ext.get("nak") if isinstance(ext, dict) else None
    if given is None:
        return None
    if not isinstance(given, list):
        return []
    out: list[tuple[int, int, float]] = []
    for item in given[:4096]:
        ident, delay = (item.get("id"), item.get("delay", 0)) if isinstance(item, dict) else (item, 0)
        if not isinstance(ident, str) or isinstance(delay, bool) or not isinstance(delay, int | float):
            continue
        found = _NAK_ID.fullmatch(ident)
        if found is None or not 0 <= delay <= MAX_NAK_DELAY_S:
            continue
        out.append((int(found[1]), int(found[2]), float(delay)))
    return out


def superseded_reply(message: dict[str, Any], settings: BayeuxSettings) -> dict[str, Any]:
    """A held connect another connect of its session replaced: no messages and no batch number (the
    client has abandoned it; a batch number could make it acknowledge what it never saw)."""
    return reply(message, successful=True, advice=settings.advice())


def disconnected_reply(message: dict[str, Any]) -> dict[str, Any]:
    return reply(message, successful=True, advice={"reconnect": "none", "interval": 0})


def subscriptions_of(message: dict[str, Any]) -> list[str] | dict[str, Any]:
    """The channels a subscribe or unsubscribe names, or its error reply."""
    value = message.get("subscription")
    if value is None:
        return error(message, SUBSCRIPTION_MISSING)
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(channels.valid(n) for n in names):
        return error(message, SUBSCRIPTION_INVALID, subscription=value)
    return names


def durable_of(message: dict[str, Any]) -> str | dict[str, Any] | None:
    """The durable name a subscribe asks for in `ext.durable` (None: a plain subscription), or its
    error reply."""
    ext = message.get("ext")
    name = ext.get("durable") if isinstance(ext, dict) else None
    if name is None:
        return None
    if not isinstance(name, str) or not _DURABLE_NAME.fullmatch(name):
        return error(message, DURABLE_INVALID, subscription=message.get("subscription"))
    return name


def encode_data(data: Any) -> bytes:
    """A Bayeux message's `data` as stored: compact JSON."""
    return json_bytes(data)


def json_bytes(value: Any) -> bytes:
    """`value` (as parsed by `parse_body`) as compact JSON in UTF-8. A string holding half of a UTF-16
    surrogate pair (JSON allows `"\\ud800"`, JavaScript strings hold them, UTF-8 cannot) is written
    as JSON's escape instead, so the value reaches the other side unchanged."""
    try:
        # orjson writes what the standard library writes (exponents aside: 1e-7, not 1e-07) in a
        # twentieth of the time; this is a tenth of a Bayeux publish's cost (bench/README.md).
        return orjson.dumps(value)
    except TypeError:  # surrogate halves, integers beyond 64 bits: the standard library writes both
        try:
            return _compact.encode(value).encode()
        except UnicodeEncodeError:
            return _compact_ascii.encode(value).encode()


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # json.loads would take NaN and Infinity; JSON.parse does not


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999: JSON's syntax, but no double holds it and JSON cannot write inf
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


_strict = json.JSONDecoder(parse_constant=_no_constants)


DATA_CONTENT_TYPE = "application/json"  # stored with what Bayeux clients publish, for HTTP pull consumers


def data_json(raw: bytes) -> tuple[bytes, str]:
    """Stored bytes as the JSON text of a Bayeux `data` value, and how they were read: "json" (what
    Bayeux clients store: the bytes themselves, not parsed and written again), "text" (UTF-8 that is
    not JSON, from a STAN client: a JSON string) or "base64" (any other bytes: a base64 string).
    JSON nested deeper than a parser's limit (about a thousand levels) is "text". Never raises: a
    delivery runs inside a commit that is already stored."""
    try:
        orjson.loads(raw)  # what Bayeux clients store passes here, at a third of the cost
    except orjson.JSONDecodeError:
        pass  # not valid as orjson reads JSON: surrogate halves and deep nesting, or not JSON at all
    else:
        return raw, "json"
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return b'"' + base64.b64encode(raw) + b'"', "base64"
    try:
        _strict.decode(text)
    except (ValueError, RecursionError):
        return json.dumps(text, ensure_ascii=False).encode(), "text"
    return raw, "json"


def delivery(channel_json: bytes, sub_id: int, seq: int, timestamp_unix_ns: int, raw: bytes) -> bytes:
    """One delivery as it goes into a connect reply, encoded once: `{channel, data, id, ext}`; its id
    is `<sub_id>x<seq>`, unique within the session."""
    data, how = data_json(raw)
    encoding = b"" if how == "json" else b',"encoding":"' + how.encode() + b'"'
    return b'{"channel":%s,"data":%s,"id":"%dx%d","ext":{"seq":%d,"timestamp":%d%s}}' % (
        channel_json,
        data,
        sub_id,
        seq,
        seq,
        timestamp_unix_ns,
        encoding,
    )


def published(message: dict[str, Any]) -> bytes:
    """The reply to a stored publish, encoded: a checked id is alphanumeric and a valid channel name
    holds no character JSON escapes, so both go in as they are."""
    if "id" in message:
        return b'{"id":"%s","channel":"%s","successful":true}' % (message["id"].encode(), message["channel"].encode())
    return b'{"channel":"%s","successful":true}' % message["channel"].encode()


def encode_answer(parts: list[dict[str, Any] | bytes]) -> bytes:
    """A response body: a JSON array of replies (dicts) and deliveries (already encoded)."""
    return b"[" + b",".join(p if isinstance(p, bytes) else json_bytes(p) for p in parts) + b"]"


_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_compact_ascii = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
