"""Error texts STAN clients are shown (spec §3.12), besides the engine's own (streaming.engine.errors)."""

from __future__ import annotations

from typing import Final

INVALID_CONNECT: Final = "stan: invalid connection request"
INVALID_CLIENT_ID: Final = "stan: invalid clientID: only alphanumeric and `-` or `_` characters allowed"
CLIENT_ALREADY_REGISTERED: Final = "stan: clientID already registered"
INVALID_PUBLISH: Final = "stan: invalid publish request"
INVALID_SUB: Final = "stan: invalid subscription request"
CLIENT_ID_MISSING: Final = "stan: clientID missing"
INVALID_ACK_WAIT: Final = "stan: invalid ack wait time, should be >= 1s"
INVALID_MAX_INFLIGHT: Final = "stan: invalid MaxInflight, should be >= 1"
INVALID_START: Final = "stan: invalid start position"
INVALID_SUBJECT: Final = "stan: invalid subject"
UNKNOWN_CLIENT: Final = "stan: unknown clientID"
INVALID_UNSUB: Final = "stan: invalid unsubscribe request"
INVALID_CLOSE: Final = "stan: invalid close request"
CHANNEL_BEING_DELETED: Final = "stan: channel is being deleted"
CLIENT_REPLACED: Final = "client has been replaced or is no longer registered"
UNKNOWN_CHANNEL_TEXT: Final = "stan: unknown channel"
INVALID_SUBSCRIPTION_TEXT: Final = "stan: invalid subscription"
