"""A pipelined publish whose PubAck never comes fails after the PubAck timeout and frees its room in
the window, on the client's clock (Trio's MockClock): no publisher waits for ever."""

from __future__ import annotations

import anyio
import pytest
import trio
from trio.testing import MockClock

from streaming.client.nats_conn import NatsConnection
from streaming.client.stan import PUB_ACK_TIMEOUT, StanClient, _Subjects, connect
from streaming.wire.stan_pb import protocol_pb2 as pb


def _client(window: int, timeout_s: float) -> StanClient:
    # Never connected: what it publishes goes nowhere, so no PubAck can come.
    nats = NatsConnection("127.0.0.1", 1)
    client = StanClient(
        nats,
        "test-cluster",
        "me",
        request_timeout_s=1,
        max_pub_acks_inflight=window,
        ping_interval_s=5,
        ping_max_out=3,
        pub_ack_timeout_s=timeout_s,
    )
    client.config_subjects = _Subjects(pb.ConnectResponse(pubPrefix="_STAN.pub.t"))
    return client


async def test_publishes_without_pub_acks_fail_after_the_timeout_oldest_first(autojump_clock: MockClock) -> None:
    client = _client(window=4, timeout_s=30)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client._expire_pub_acks)
        began = trio.current_time()
        first = [client.publish_nowait("orders", b"x") for _ in range(3)]
        await trio.sleep(10)
        second = client.publish_nowait("orders", b"y")
        with pytest.raises(anyio.WouldBlock):
            client.publish_nowait("orders", b"full")
        # A publisher waiting for room gets it when the first three fail: 30 to 33 s after they went.
        late = await client.publish_async("orders", b"z")
        failed_at = trio.current_time() - began
        assert 30 <= failed_at <= 33, failed_at
        assert [f.error for f in first] == [PUB_ACK_TIMEOUT] * 3
        assert not second.done(), "a younger publish still waits"
        await client.wait_pub_acks()
        assert 60 <= trio.current_time() - began <= 66.5
        assert second.error == late.error == PUB_ACK_TIMEOUT
        with pytest.raises(Exception, match="publish ack timeout"):
            await late.wait()
        client.closed = True
        nursery.cancel_scope.cancel()


async def test_an_awaited_publish_fails_on_time_and_leaves_the_window(autojump_clock: MockClock) -> None:
    client = _client(window=1, timeout_s=5)
    began = trio.current_time()
    with pytest.raises(Exception, match="publish ack timeout"):
        await client.publish("orders", b"x")
    assert trio.current_time() - began == pytest.approx(5)
    client.publish_nowait("orders", b"room again")  # the window of one is free


async def test_a_timeout_that_is_not_positive_is_refused_at_connect() -> None:
    with pytest.raises(ValueError, match="pub_ack_timeout_s"):
        async with connect("test-cluster", "me", port=1, pub_ack_timeout_s=0):
            pass
