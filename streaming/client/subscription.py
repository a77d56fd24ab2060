"""A STAN subscription of the client library: the messages it received and not yet handed out, the
acks it sends, and the redelivered copies it drops (of messages the application already acknowledged,
or that still wait here) instead of handing them to the application twice."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Protocol, Self, TypedDict

import anyio

from streaming.client.dedup import AckFloor, RecentAcks
from streaming.client.nats_conn import ConnectionClosedError, NatsConnection, NatsMsg, new_inbox
from streaming.wire.positions import StartPosition
from streaming.wire.stan_pb import protocol_pb2 as pb

log = logging.getLogger(__name__)


class Owner(Protocol):
    """What a subscription needs of the client session it belongs to (streaming.client.stan)."""

    @property
    def nats(self) -> NatsConnection: ...

    @property
    def closed(self) -> bool: ...

    @property
    def nak_suffix(self) -> str:
        """Where negative acks go, after a subscription's ack inbox ("": the server takes none)."""
        ...

    async def end_subscription(self, sub: Subscription, *, close: bool) -> None:
        """Ask the server to remove (or, `close`, to close) `sub`, and stop taking its messages."""


class NakNotSupportedError(Exception):
    """The server takes no negative acks (nats-streaming-server: only this server's extension does)."""


class Msg:
    __slots__ = ("_sub", "data", "redelivered", "redelivery_count", "reply", "seq", "subject", "timestamp_unix_ns")

    def __init__(self, sub: Subscription, proto: pb.MsgProto) -> None:
        self._sub = sub
        self.seq: int = proto.sequence
        self.subject: str = proto.subject
        self.reply: str = proto.reply
        self.data: bytes = proto.data
        self.timestamp_unix_ns: int = proto.timestamp
        self.redelivered: bool = proto.redelivered
        self.redelivery_count: int = proto.redeliveryCount

    @property
    def attempt(self) -> int:
        return self.redelivery_count + 1

    def ack(self) -> None:
        """Acknowledge (never blocks)."""
        self._sub._ack(self.subject, self.seq)

    def in_progress(self) -> None:
        """Ask for another AckWait without acknowledging (this server's extension; others ignore it)."""
        self._sub._send_ack(self.subject, self.seq, in_progress=True)

    def nak(self, delay: float = 0.0) -> None:
        """Give the message back unacknowledged: the server sends it again once `delay` seconds have
        passed (0: at once; at most 30 days), as its next attempt (MaxDeliver counts it), to this
        subscription or, in a queue group, to whichever member can take it then. In auto-ack mode it is
        not acknowledged by the next `next_msg`. Never blocks. This server's extension: raises
        NakNotSupportedError on a server without it, where the message would come back after AckWait."""
        if delay < 0:
            raise ValueError("a nak's delay cannot be negative")
        self._sub._nak(self, delay)

    def __repr__(self) -> str:
        return f"Msg(seq={self.seq}, subject={self.subject!r}, redelivered={self.redelivered}, data={self.data!r})"


class SubscribeOptions(TypedDict, total=False):
    """The keyword options of `StanClient.open_subscription` (its signature has the defaults)."""

    queue: str
    durable: str
    ack_wait: float
    max_inflight: int
    start_at: StartPosition
    start_sequence: int
    start_time_delta_s: float
    manual_ack: bool
    max_deliver: int
    dead_letter_channel: str
    backoff_s: tuple[float, ...]
    max_inflight_redeliveries: bool
    ordered: bool
    suppress_copies: bool


class Subscription:
    def __init__(
        self, client: Owner, channel: str, queue: str, durable: str, manual_ack: bool, suppress_copies: bool = True
    ) -> None:
        self.client = client
        self.suppress_copies = suppress_copies
        self.channel = channel
        self.queue = queue
        self.durable = durable
        self.manual_ack = manual_ack
        self.inbox = new_inbox(client.nats.inbox_prefix)
        self.ack_inbox = ""
        self.suppressed = 0  # redelivered copies not handed to the application
        self._queue: deque[Msg] = deque()
        # Messages waiting here, by (channel, seq): a wildcard subscription's channels each have their
        # own sequences, and so their own ack floors.
        self._queued: set[tuple[str, int]] = set()
        self._ready = anyio.Event()
        self._floor = AckFloor()
        self._floors: dict[str, AckFloor] = {channel: self._floor}
        self._recent = RecentAcks()
        self.sid = ""  # its NATS subscription
        self._last: Msg | None = None
        self._closed = False

    def on_msg(self, raw: NatsMsg) -> None:
        """A message of this subscription arrived (its NATS subscription's handler)."""
        try:
            proto = pb.MsgProto.FromString(raw.data)
        except Exception:
            log.warning("undecodable message on %s", raw.subject)
            return
        seq, key = proto.sequence, (proto.subject, proto.sequence)
        if proto.redelivered and self.suppress_copies:
            if self._is_acked(proto.subject, seq):
                self.suppressed += 1
                self._send_ack(proto.subject, seq)  # our earlier ack was lost: say it again
                return
            if key in self._queued:
                self.suppressed += 1  # a copy of one still waiting here: the application will get it once
                return
        if not self.queue:
            self._floor_of(proto.subject).delivered(seq)
        self._queue.append(Msg(self, proto))
        self._queued.add(key)
        if len(self._queue) == 1:  # a reader waits only on an empty queue
            self._ready.set()

    def _floor_of(self, channel: str) -> AckFloor:
        floor = self._floors.get(channel)
        if floor is None:  # a wildcard subscription's channel seen for the first time
            floor = self._floors[channel] = AckFloor()
        return floor

    def _is_acked(self, channel: str, seq: int) -> bool:
        if self.queue:
            return self._recent.is_acked(seq, time.monotonic())
        return self._floor_of(channel).is_acked(seq)

    def _ack(self, channel: str, seq: int) -> None:
        if self.queue:
            self._recent.acked(seq, time.monotonic())
        else:
            self._floor_of(channel).acked(seq)
        self._send_ack(channel, seq)

    def _nak(self, msg: Msg, delay: float) -> None:
        suffix = self.client.nak_suffix
        if not suffix:
            raise NakNotSupportedError("the server takes no negative acks (nats-streaming-server does not)")
        if self._last is msg:
            self._last = None  # given back: the next `next_msg` must not acknowledge it
        if self.ack_inbox and not self.client.nats.closed:
            nak = pb.Nak(subject=msg.subject, sequence=msg.seq, delayMs=round(delay * 1000))
            self.client.nats.publish(self.ack_inbox + suffix, nak.SerializeToString())

    def _send_ack(self, channel: str, seq: int, *, in_progress: bool = False) -> None:
        """An ack names the message's channel: for a wildcard subscription, which of its channels."""
        if self.ack_inbox and not self.client.nats.closed:
            ack = pb.Ack(subject=channel, sequence=seq, inProgress=in_progress)
            self.client.nats.publish(self.ack_inbox, ack.SerializeToString())

    async def next_msg(self) -> Msg:
        """The next message (bound the wait with `anyio.fail_after`); in auto-ack mode the previous one
        is acknowledged first."""
        if self._last is not None and not self.manual_ack:
            self._last.ack()
            self._last = None
        while not self._queue:
            if self._closed or self.client.closed:
                raise ConnectionClosedError("subscription closed")
            await self._ready.wait()
            self._ready = anyio.Event()
        msg = self._queue.popleft()
        self._queued.discard((msg.subject, msg.seq))
        self._last = msg
        return msg

    def pending(self) -> int:
        return len(self._queue)

    def progress_held(self) -> int:
        """Ask for another AckWait for every message this subscription holds unacknowledged: those
        waiting here and the one last handed to the application. Called more often than AckWait by an
        application whose handler is slow, it keeps held messages from being redelivered (a server
        without this extension ignores it). Returns how many were touched."""
        held = [(msg.subject, msg.seq) for msg in self._queue]
        last = self._last
        if last is not None and (key := (last.subject, last.seq)) not in self._queued and not self._is_acked(*key):
            held.append(key)
        for channel, seq in held:
            self._send_ack(channel, seq, in_progress=True)
        return len(held)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Msg:
        try:
            return await self.next_msg()
        except ConnectionClosedError:
            raise StopAsyncIteration from None

    async def unsubscribe(self) -> None:
        """Remove the subscription (a durable is deleted)."""
        await self._end(close=False)

    async def close(self) -> None:
        """Stop receiving; a durable (or durable queue group) keeps its position for later."""
        await self._end(close=True)

    async def _end(self, *, close: bool) -> None:
        if self._closed:
            return
        if self._last is not None and not self.manual_ack:
            self._last.ack()
        self._closed = True
        self._ready.set()
        await self.client.end_subscription(self, close=close)
