"""The client library, on AnyIO (asyncio or Trio): `connect()` opens a STAN session (see streaming.client.stan)."""

from streaming.client.nats_conn import ConnectionClosedError, NatsConnection, NatsError, NatsMsg
from streaming.client.stan import PubAckFuture, StanClient, StanError, connect
from streaming.client.subscription import Msg, NakNotSupportedError, SubscribeOptions, Subscription
from streaming.wire.positions import StartPosition

__all__ = [
    "ConnectionClosedError",
    "Msg",
    "NatsConnection",
    "NatsError",
    "NakNotSupportedError",
    "NatsMsg",
    "PubAckFuture",
    "StanClient",
    "StanError",
    "StartPosition",
    "SubscribeOptions",
    "Subscription",
    "connect",
]
