"""Error texts STAN clients are shown, word for word as the reference server's, besides the engine's
own (streaming.engine.errors)."""

from __future__ import annotations

from typing import Final

from storage.base import MAX_NAME_BYTES
from storage.errors import StoreError, StoreFullError, StoreWriteError

INVALID_CONNECT: Final = "stan: invalid connection request"
INVALID_CLIENT_ID: Final = "stan: invalid clientID: only alphanumeric and `-` or `_` characters allowed"
CLIENT_ID_TOO_LONG: Final = f"stan: invalid clientID: longer than {MAX_NAME_BYTES} bytes"
CLIENT_ALREADY_REGISTERED: Final = "stan: clientID already registered"
INVALID_PUBLISH: Final = "stan: invalid publish request"
INVALID_SUB: Final = "stan: invalid subscription request"
CLIENT_ID_MISSING: Final = "stan: clientID missing"
INVALID_ACK_WAIT: Final = "stan: invalid ack wait time, should be >= 1s"
INVALID_MAX_INFLIGHT: Final = "stan: invalid MaxInflight, should be >= 1"
INVALID_START: Final = "stan: invalid start position"
INVALID_SUBJECT: Final = "stan: invalid subject"
SUBJECT_TOO_LONG: Final = f"stan: invalid subject: channel names are limited to {MAX_NAME_BYTES} bytes"
UNKNOWN_CLIENT: Final = "stan: unknown clientID"
INVALID_UNSUB: Final = "stan: invalid unsubscribe request"
INVALID_CLOSE: Final = "stan: invalid close request"
CHANNEL_BEING_DELETED: Final = "stan: channel is being deleted"
CLIENT_REPLACED: Final = "client has been replaced or is no longer registered"
UNKNOWN_CHANNEL_TEXT: Final = "stan: unknown channel"
INVALID_SUBSCRIPTION_TEXT: Final = "stan: invalid subscription"


def store_error(exc: StoreError) -> str:
    """What a client is told of a store failure: what happened to its request, never a server path
    or the storage engine's words (those go to the server log)."""
    if isinstance(exc, StoreFullError):
        return "stan: store error: the server's disk is full: not stored"
    if isinstance(exc, StoreWriteError):
        return "stan: store error: the server could not write to its disk: not stored"
    return "stan: store error (see the server log)"
