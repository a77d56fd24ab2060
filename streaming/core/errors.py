"""Every error text a client is shown, in one place, and the exception for a refused request.

The texts are word for word the reference NATS Streaming server's where it has one, because STAN
clients (and their users' code) match on them; every front door shows the same words.
"""

from __future__ import annotations

from typing import Final

from storage.base import MAX_NAME_BYTES
from storage.errors import ChannelError, StoreError, StoreFullError, StoreWriteError

__all__ = [
    "ChannelBeingDeleted",
    "ChannelError",
    "NotPermitted",
    "RequestError",
    "StoreError",
    "StoreFullError",
    "not_permitted",
    "store_error",
]


class RequestError(Exception):
    """A request that cannot be honoured (the client's fault, not ours); str() is the client's text."""


class ChannelBeingDeleted(RequestError):
    """A publish to, or a subscription on, a channel the server is deleting (its MaxInactivity)."""

    def __init__(self) -> None:
        super().__init__(CHANNEL_BEING_DELETED)


class NotPermitted(RequestError):
    """The user's permissions do not allow this `action` ("publish" or "subscribe") on `channel`."""

    def __init__(self, action: str, channel: str) -> None:
        super().__init__(not_permitted(action, channel))
        self.action = action
        self.channel = channel


# Connecting and closing.
INVALID_CONNECT: Final = "stan: invalid connection request"
INVALID_CLIENT_ID: Final = "stan: invalid clientID: only alphanumeric and `-` or `_` characters allowed"
CLIENT_ID_TOO_LONG: Final = f"stan: invalid clientID: longer than {MAX_NAME_BYTES} bytes"
CLIENT_ID_MISSING: Final = "stan: clientID missing"
CLIENT_ALREADY_REGISTERED: Final = "stan: clientID already registered"
UNKNOWN_CLIENT: Final = "stan: unknown clientID"
CLIENT_REPLACED: Final = "client has been replaced or is no longer registered"


INVALID_CLOSE: Final = "stan: invalid close request"

# Publishing.
INVALID_PUBLISH: Final = "stan: invalid publish request"
CHANNEL_BEING_DELETED: Final = "stan: channel is being deleted"
INTERNAL_ERROR: Final = "stan: internal error (see the server log)"

# Subscribing.
INVALID_SUB: Final = "stan: invalid subscription request"
INVALID_ACK_WAIT: Final = "stan: invalid ack wait time, should be >= 1s"
INVALID_MAX_INFLIGHT: Final = "stan: invalid MaxInflight, should be >= 1"
INVALID_START: Final = "stan: invalid start position"
INVALID_SUBJECT: Final = "stan: invalid subject"
SUBJECT_TOO_LONG: Final = f"stan: invalid subject: channel names are limited to {MAX_NAME_BYTES} bytes"
DUPLICATE_DURABLE: Final = "stan: duplicate durable registration"
DURABLE_QUEUE_COLON: Final = "stan: durable name of a durable queue subscriber can't contain the character ':'"
TOO_MANY_SUBS: Final = "too many subscriptions per channel"
ORDERED_NOT_QUEUE: Final = "stan: only a queue subscription can keep each channel's order (ordered)"
ORDERED_MISMATCH: Final = "stan: a queue group keeps each channel's order or not, for every member alike"
WILDCARD_ON_DEMAND: Final = "a wildcard cannot be followed on demand"

# Unsubscribing and closing a subscription.
INVALID_UNSUB: Final = "stan: invalid unsubscribe request"
UNKNOWN_CHANNEL: Final = "stan: unknown channel"
INVALID_SUBSCRIPTION: Final = "stan: invalid subscription"


def store_error(exc: StoreError) -> str:
    """What a client is told of a store failure: what happened to its request, never a server path
    or the storage engine's words (those go to the server log)."""
    if isinstance(exc, StoreFullError):
        return "stan: store error: the server's disk is full: not stored"
    if isinstance(exc, StoreWriteError):
        return "stan: store error: the server could not write to its disk: not stored"
    return "stan: store error (see the server log)"


def not_permitted(action: str, channel: str) -> str:
    """A STAN request refused by the user's permissions (our words: the reference server has none)."""
    return f"stan: permissions violation: may not {action} to channel {channel!r}"
