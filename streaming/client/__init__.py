"""The Trio client library: `connect()` opens a STAN session (see streaming.client.stan)."""

from streaming.client.nats_conn import ConnectionClosedError, NatsConnection, NatsError, NatsMsg
from streaming.client.stan import Msg, PubAckFuture, StanClient, StanError, StartPosition, Subscription, connect

__all__ = [
    "ConnectionClosedError",
    "Msg",
    "NatsConnection",
    "NatsError",
    "NatsMsg",
    "PubAckFuture",
    "StanClient",
    "StanError",
    "StartPosition",
    "Subscription",
    "connect",
]
