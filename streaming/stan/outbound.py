"""The STAN door's outbound port: deliveries become MsgProtos to the subscription's inbox, publish
outcomes become PubAcks to the publisher's ack inbox, both written through the embedded broker."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

from streaming.core.errors import ChannelError, StoreError, store_error
from streaming.core.outbound import Delivery, Outcome, Publish
from streaming.nats.bus import Bus
from streaming.wire.stan_pb import protocol_pb2 as pb

_STORED = {int}  # the type of a stored publish's outcome (its sequence)


def error_text(error: Exception) -> str:
    """What a STAN client is shown for a refused publish or request."""
    if isinstance(error, StoreError) and not isinstance(error, ChannelError):
        return store_error(error)  # never a server path or the storage engine's words
    return str(error)  # a refused channel name, a channel being deleted: the client's to fix


class StanOutbound:
    def __init__(self, broker: Bus) -> None:
        self._broker = broker

    def deliver(self, deliveries: Sequence[Delivery]) -> None:
        # A pass of the engine mostly sends runs of messages to one inbox (a backlog, a redelivery
        # chunk): each run is framed and written in one broker call. One MsgProto is re-filled per
        # delivery, setting only what differs from the one before: a new message object per delivery
        # and every field set on it cost twice as much (bench/README.md, **consume**). It lives for
        # this call only: protobuf copies every string and bytes value set on a message into memory
        # the message owns and frees only with it, so one kept for the server's life grew by each
        # delivery's payload.
        publish_many = self._broker.publish_many
        msg = pb.MsgProto()
        serialize = msg.SerializeToString
        inbox = ""
        run: list[bytes] = []
        subject: str | None = None  # what `msg` holds, tracked here: reading a field back costs too
        reply: str | None = None
        attempt = 0
        for d in deliveries:
            if d.inbox != inbox:
                if run:
                    publish_many(inbox, run)
                    run = []
                inbox = d.inbox
            m = d.message
            msg.sequence = m.seq
            if m.subject is not subject:
                msg.subject = subject = m.subject
            if m.reply is not reply:
                msg.reply = reply = m.reply
            msg.data = m.data
            msg.timestamp = m.timestamp_unix_ns
            if d.attempt != attempt:
                attempt = d.attempt
                msg.redelivered = attempt > 1
                msg.redeliveryCount = attempt - 1
            run.append(serialize())
        if run:
            publish_many(inbox, run)

    def published(self, publishes: Sequence[Publish], outcomes: Sequence[Outcome]) -> None:
        acks: dict[str, list[bytes]] = {}  # per ack inbox (one per client), in order
        # One message re-filled per publish, half the cost of a new one each; a new one per call, as
        # in `deliver`, or its memory would grow by every GUID set on it.
        pub_ack = pb.PubAck()
        serialize = pub_ack.SerializeToString
        text = pub_ack.error = ""  # what `pub_ack` holds, tracked here: reading a field back costs too
        inbox, run = "", []  # a commit's publishes come in runs from one publisher: one lookup a run
        # Whether any was refused, found in C: then each one's outcome is looked at, else none is.
        failed = not set(map(type, outcomes)) <= _STORED
        outcome_of = iter(outcomes)
        for p in publishes:
            outcome = next(outcome_of) if failed else None
            to = p.ack_to
            if not to:
                continue
            pub_ack.guid = p.guid
            if failed:
                wanted = error_text(outcome) if isinstance(outcome, Exception) else ""
                if wanted != text:
                    text = pub_ack.error = wanted
            if to != inbox:
                inbox, run = to, acks.setdefault(to, [])
            run.append(serialize())
        for subject, payloads in acks.items():
            self._broker.publish_many(subject, payloads)

    def holding(self) -> AbstractContextManager[None]:
        return self._broker.holding_writes()

    async def wait_reachable(self, inboxes: list[str]) -> None:
        await self._broker.wait_interest(inboxes)
