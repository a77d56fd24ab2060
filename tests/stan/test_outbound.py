"""The STAN door's outbound port keeps no memory per message sent: its deliveries and PubAcks are
what each message says, and a long run of them leaves the server's memory where it was."""

from __future__ import annotations

import gc
import os
from typing import cast

from storage.records import Message
from streaming.core.engine.events import Delivery, Reason
from streaming.core.outbound import Publish
from streaming.nats.bus import Bus
from streaming.stan.outbound import StanOutbound
from streaming.wire.stan_pb import protocol_pb2 as pb
from tests.stan.memory_bus import MemoryBus


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Discarding(MemoryBus):
    """A bus that drops what is sent (a long run would otherwise be kept by the test itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def publish_many(self, subject: str, payloads: list[bytes]) -> None:
        self.count += len(payloads)


def test_deliveries_and_pub_acks_say_what_each_message_says() -> None:
    bus = MemoryBus()
    out = StanOutbound(cast(Bus, bus))
    first = Message(1, 10, "c", "", b"one")
    again = Message(2, 20, "c", "r", b"two")
    out.deliver([Delivery(1, "in.a", first, 1, Reason.NEW), Delivery(1, "in.a", again, 3, Reason.ACK_TIMEOUT)])
    out.deliver([Delivery(2, "in.b", first, 1, Reason.NEW)])
    sent = [(s.subject, pb.MsgProto.FromString(s.payload)) for s in bus.take()]
    assert [(subject, m.sequence, m.data, m.reply, m.redelivered, m.redeliveryCount) for subject, m in sent] == [
        ("in.a", 1, b"one", "", False, 0),
        ("in.a", 2, b"two", "r", True, 2),
        ("in.b", 1, b"one", "", False, 0),
    ]
    publishes = [Publish("c", b"x", "", f"guid-{i}", "acks", out) for i in range(3)]
    out.published(publishes, [1, ValueError("refused"), 3])
    acks = [pb.PubAck.FromString(s.payload) for s in bus.take()]
    assert [(a.guid, a.error) for a in acks] == [("guid-0", ""), ("guid-1", "refused"), ("guid-2", "")]


def test_a_long_run_of_deliveries_and_pub_acks_does_not_grow_the_server() -> None:
    # 200,000 deliveries of 1 KiB and as many PubAcks: a message object kept across calls held a
    # copy of every payload and GUID set on it (~220 MB here).
    bus = _Discarding()
    out = StanOutbound(cast(Bus, bus))
    payload = os.urandom(1024)
    deliveries = [Delivery(1, "inbox", Message(seq, 0, "c", "", payload), 1, Reason.NEW) for seq in range(1, 1001)]
    publishes = [Publish("c", b"", "", f"{seq:022d}", "acks", out) for seq in range(1, 1001)]
    outcomes = list(range(1, 1001))
    out.deliver(deliveries)
    out.published(publishes, outcomes)
    gc.collect()
    before = _resident_bytes()
    for _ in range(200):
        out.deliver(deliveries)
        out.published(publishes, outcomes)
    gc.collect()
    grown = _resident_bytes() - before
    assert bus.count == 201 * 2000
    assert grown < 30 << 20, f"resident memory grew by {grown >> 20} MiB"
