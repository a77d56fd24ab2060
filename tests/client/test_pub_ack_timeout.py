"""A pipelined publish whose PubAck never comes fails after the PubAck timeout and frees its room in
the window, on the client's clock (Trio's MockClock): no publisher waits for ever. Hypothesis drives
publishes, PubAcks and time against the rule: a publish fails if and only if its PubAck did not come
in time, and then between one and 1.1 timeouts after it was made."""

from __future__ import annotations

import anyio
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from streaming.client.nats_conn import NatsConnection, NatsMsg
from streaming.client.stan import PUB_ACK_TIMEOUT, PubAckFuture, StanClient, _Subjects, connect
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


TIMEOUT_S = 10.0
# One step: publish n, PubAck the i-th oldest waiting publish (modulo how many wait), or let s seconds pass.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 5)),
        st.tuples(st.just("ack"), st.integers(0, 20)),
        st.tuples(st.just("sleep"), st.floats(0.1, 8.0)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(STEPS)
def test_a_publish_fails_exactly_when_its_pub_ack_is_late(steps: list[tuple[str, float]]) -> None:
    async def run() -> None:
        client = _client(window=1_000, timeout_s=TIMEOUT_S)
        made: dict[str, float] = {}  # guid -> when it was published
        acked: dict[str, float] = {}  # guid -> when its PubAck came
        failed_at: dict[str, float] = {}
        futures: list[PubAckFuture] = []

        def failures() -> None:  # note when each failure is first seen
            for future in futures:
                if future.error and future.guid not in failed_at:
                    failed_at[future.guid] = trio.current_time()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._expire_pub_acks)
            for kind, value in steps:
                if kind == "publish":
                    for _ in range(int(value)):
                        futures.append(client.publish_nowait("orders", b"x"))
                        made[futures[-1].guid] = trio.current_time()
                elif kind == "ack" and client._pubs:
                    guid = list(client._pubs)[int(value) % len(client._pubs)]
                    client._on_pub_ack(NatsMsg("", "", pb.PubAck(guid=guid).SerializeToString()))
                    acked[guid] = trio.current_time()
                else:
                    # In small steps, so each failure is seen within 0.05 s of when it happened.
                    for _ in range(int(value / 0.05)):
                        await trio.sleep(0.05)
                        failures()
            for _ in range(int(1.2 * TIMEOUT_S / 0.05)):  # everything still waiting fails by then
                await trio.sleep(0.05)
                failures()
            client.closed = True
            nursery.cancel_scope.cancel()

        assert not client._pubs, "nothing waits for ever"
        for future in futures:
            guid = future.guid
            if guid in acked:
                assert future.error == "", "a PubAck that came in time is the outcome"
                assert acked[guid] - made[guid] < 1.1 * TIMEOUT_S + 1e-9
            else:
                assert future.error == PUB_ACK_TIMEOUT
                age = failed_at[guid] - made[guid]
                assert TIMEOUT_S - 1e-9 <= age <= 1.1 * TIMEOUT_S + 0.05 + 1e-9, age

    trio.run(run, clock=MockClock(autojump_threshold=0))
