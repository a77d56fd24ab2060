"""STAN requests, sans-IO: protobuf bytes in, a validated request (or the exact error text) out.

This holds the checks that need nothing but the request itself (a connect's client ID and heartbeat
inbox, a publish's guid and subject, a subscription's fields in the order the reference server
checks them); checks against server state (registered clients, channels, durables) are the server's
and the engine's.
"""

from __future__ import annotations

import functools
import re

from google.protobuf.message import DecodeError, Message

from streaming.core import errors
from streaming.core.outbound import MAX_NAME_BYTES, MAX_REPLY_BYTES, StartPosition, SubOptions, SubscribeRequest
from streaming.wire.stan_pb import protocol_pb2 as pb
from streaming.wire.subjects import has_wildcard

_CLIENT_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


class InvalidRequest(Exception):
    """str() is the error to put in the response; `guid` that of a PubMsg that did parse."""

    def __init__(self, text: str, guid: str = "") -> None:
        super().__init__(text)
        self.guid = guid


def valid_client_id(client_id: str) -> bool:
    return _CLIENT_ID.match(client_id) is not None and len(client_id) <= MAX_NAME_BYTES  # ASCII: one byte each


_CHANNEL = re.compile(r"[^./*>\s]+(\.[^./*>\s]+)*")


# Every publish asks, for the same few names: a regex each time was a measurable share of the
# server's CPU per publish (bench/README.md, **wire**).
@functools.lru_cache(maxsize=4096)
def valid_channel(name: str) -> bool:
    """A channel name: a literal NATS subject (no wildcards, no `/`) of at most MAX_NAME_BYTES."""
    return _CHANNEL.fullmatch(name) is not None and len(name.encode()) <= MAX_NAME_BYTES


def parse(message_type: type[Message], payload: bytes, error: str) -> Message:
    try:
        return message_type.FromString(payload)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise InvalidRequest(error) from exc


def parse_connect(payload: bytes) -> pb.ConnectRequest:
    request = parse(pb.ConnectRequest, payload, errors.INVALID_CONNECT)
    assert isinstance(request, pb.ConnectRequest)
    if not request.heartbeatInbox:
        raise InvalidRequest(errors.INVALID_CONNECT)
    if len(request.clientID) > MAX_NAME_BYTES:
        raise InvalidRequest(errors.CLIENT_ID_TOO_LONG)
    if not valid_client_id(request.clientID):
        raise InvalidRequest(errors.INVALID_CLIENT_ID)
    return request


def parse_publish(payload: bytes) -> tuple[pb.PubMsg, str, str, str]:
    """The message with its channel, guid and reply subject, each read once (a read of a field
    builds a new object each time). Raises InvalidRequest (with the guid, if the message parsed)."""
    try:
        message: pb.PubMsg = pb.PubMsg.FromString(payload)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise InvalidRequest(errors.INVALID_PUBLISH, "") from exc
    guid, channel, reply = message.guid, message.subject, message.reply
    if not guid or not valid_channel(channel):
        raise InvalidRequest(errors.INVALID_PUBLISH, guid)
    if len(reply) > MAX_REPLY_BYTES // 4 and len(reply.encode()) > MAX_REPLY_BYTES:
        raise InvalidRequest(errors.INVALID_PUBLISH, guid)  # the store could not keep it
    return message, channel, guid, reply


def ack_wait_ms(ack_wait_in_secs: int, *, ms_mode: bool) -> int:
    """AckWait in ms from the wire: whole seconds, or with the test-only ms mode a negative value
    meaning milliseconds (as the reference server's test switch). Raises InvalidRequest."""
    if ack_wait_in_secs > 0:
        return ack_wait_in_secs * 1000
    if ms_mode and ack_wait_in_secs < 0:
        return -ack_wait_in_secs
    raise InvalidRequest(errors.INVALID_ACK_WAIT)


def valid_pattern(name: str) -> bool:
    """A wildcard subscription's subject: channel-name tokens and at least one `*` (one token) or a
    final `>` (the rest)."""
    tokens = name.split(".")
    if not has_wildcard(name) or ">" in tokens[:-1]:
        return False
    return valid_channel(".".join("x" if token in ("*", ">") else token for token in tokens))


def parse_subscribe(
    payload: bytes, ack_inbox: str, *, ms_mode: bool = False, wildcards: bool = False
) -> SubscribeRequest:
    """A subscription request's own checks, in the reference server's order; the request for the
    engine. `wildcards`: a pattern is taken as the subject (our extension), else refused as there."""
    request = parse(pb.SubscriptionRequest, payload, errors.INVALID_SUB)
    assert isinstance(request, pb.SubscriptionRequest)
    if not request.clientID:
        raise InvalidRequest(errors.CLIENT_ID_MISSING)
    wait_ms = ack_wait_ms(request.ackWaitInSecs, ms_mode=ms_mode)
    if request.maxInFlight <= 0:
        raise InvalidRequest(errors.INVALID_MAX_INFLIGHT)
    if not 0 <= request.startPosition <= 4:
        raise InvalidRequest(errors.INVALID_START)
    if len(request.subject.encode()) > MAX_NAME_BYTES:
        raise InvalidRequest(errors.SUBJECT_TOO_LONG)
    if not (valid_channel(request.subject) or (wildcards and valid_pattern(request.subject))):
        raise InvalidRequest(errors.INVALID_SUBJECT)
    if not request.inbox:
        raise InvalidRequest(errors.INVALID_SUB)
    if request.deadLetterChannel and not valid_channel(request.deadLetterChannel):
        raise InvalidRequest(errors.INVALID_SUBJECT)
    options = SubOptions(
        max_deliver=request.maxDeliver,
        dead_letter_channel=request.deadLetterChannel,
        backoff_ms=tuple(request.backoffMs),
        max_inflight_redeliveries=request.maxInflightRedeliveries,
        ordered=request.ordered,
    )
    if request.ordered and not request.qGroup:
        raise InvalidRequest(errors.ORDERED_NOT_QUEUE)
    return SubscribeRequest(
        client_id=request.clientID,
        channel=request.subject,
        inbox=request.inbox,
        ack_inbox=ack_inbox,
        ack_wait_ms=wait_ms,
        max_inflight=request.maxInFlight,
        durable_name=request.durableName,
        queue_group=request.qGroup,
        start_position=StartPosition(request.startPosition),
        start_sequence=request.startSequence,
        start_time_delta_ns=request.startTimeDelta,
        options=options,
    )


def parse_unsubscribe(payload: bytes) -> pb.UnsubscribeRequest:
    request = parse(pb.UnsubscribeRequest, payload, errors.INVALID_UNSUB)
    assert isinstance(request, pb.UnsubscribeRequest)
    if not request.clientID or not request.subject or not request.inbox:
        raise InvalidRequest(errors.INVALID_UNSUB)
    return request


def parse_close(payload: bytes) -> pb.CloseRequest:
    request = parse(pb.CloseRequest, payload, errors.INVALID_CLOSE)
    assert isinstance(request, pb.CloseRequest)
    if not request.clientID:
        raise InvalidRequest(errors.INVALID_CLOSE)
    return request
