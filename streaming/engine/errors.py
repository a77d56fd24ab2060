"""Requests the engine refuses; str() of each is the exact text a STAN client is shown."""

from __future__ import annotations


class RequestError(Exception):
    """A subscribe/unsubscribe/close request that cannot be honoured (the client's fault, not ours)."""


UNKNOWN_CLIENT = "stan: unknown clientID"
DUPLICATE_DURABLE = "stan: duplicate durable registration"
DURABLE_QUEUE_COLON = "stan: durable name of a durable queue subscriber can't contain the character ':'"
TOO_MANY_SUBS = "too many subscriptions per channel"
UNKNOWN_CHANNEL = "stan: unknown channel"
INVALID_SUBSCRIPTION = "stan: invalid subscription"
