"""Our client against the real server over TCP: the features users rely on, end to end, each under
Trio and under asyncio (the server runs in a thread of its own: tests/support/backends.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import anyio
import pytest
import trio

from streaming.client import Msg, NakNotSupportedError, StanClient, StanError, StartPosition, Subscription, connect
from tests.support.backends import ServerThread, eventually, on_both_backends, server_thread
from tests.support.servers import ServerProcess, config, free_port, state_stored
from tests.support.stan_peer import needs_stan, stan_peer

EMBEDDED = pytest.mark.parametrize("server", ["embedded"], indirect=True)  # it drops the broker's connections

CID = "test-cluster"


async def take(sub: Subscription, n: int, within: float = 5.0) -> list[Msg]:
    with anyio.fail_after(within):
        return [await sub.next_msg() for _ in range(n)]


async def nothing_more(sub: Subscription, wait: float = 0.3) -> None:
    with anyio.move_on_after(wait):
        msg = await sub.next_msg()
        raise AssertionError(f"unexpected {msg}")


@on_both_backends
async def test_publish_and_subscribe(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port) as sc:
        assert await sc.publish("foo", b"one")
        futures = [await sc.publish_async("foo", b"%d" % i) for i in range(2000)]
        assert len({await f.wait() for f in futures}) == 2000
        async with sc.subscribe("foo", start_at=StartPosition.FIRST) as sub:
            got = await take(sub, 2001)
            assert [m.seq for m in got] == list(range(1, 2002))
            assert got[0].data == b"one" and got[-1].data == b"1999" and not any(m.redelivered for m in got)
            await sc.publish("foo", b"live")
            (live,) = await take(sub, 1)
            assert live.seq == 2002 and live.data == b"live"


@on_both_backends
async def test_ackwait_redelivery_and_ack(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port) as sc:
        async with sc.subscribe("foo", manual_ack=True, ack_wait=0.2) as sub:
            await sc.publish("foo", b"x")
            (first,) = await take(sub, 1)
            assert not first.redelivered and first.attempt == 1
            (again,) = await take(sub, 1)  # not acked: back after AckWait
            assert again.seq == first.seq and again.redelivered and again.redelivery_count == 1
            again.ack()
            await nothing_more(sub, 0.5)


@on_both_backends
async def test_max_inflight_holds_back_until_acks(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port) as sc:
        for i in range(10):
            await sc.publish("foo", b"%d" % i)
        async with sc.subscribe("foo", manual_ack=True, max_inflight=3, start_at=StartPosition.FIRST) as sub:
            got = await take(sub, 3)
            await nothing_more(sub)
            got[0].ack()
            (fourth,) = await take(sub, 1)
            assert fourth.seq == 4
            await nothing_more(sub)


@on_both_backends
async def test_a_burst_of_acks_is_taken_ack_by_ack(server: ServerThread) -> None:
    """Acks sent back to back repeat one NATS line and may reach the server as one run: each is taken,
    an in-progress one restarts only its own wait, and what was not acked comes back."""
    async with connect(CID, "me", port=server.port) as sc:
        for i in range(8):
            await sc.publish("burst", b"%d" % i)
        async with sc.subscribe("burst", manual_ack=True, ack_wait=1.0, start_at=StartPosition.FIRST) as sub:
            got = await take(sub, 8)
            for msg in got[:5]:
                msg.ack()
            await anyio.sleep(0.5)
            got[5].in_progress()
            got[6].in_progress()
            (first,) = await take(sub, 1, within=2.0)
            assert (first.seq, first.redelivered) == (8, True)  # 6 and 7 asked for more time
            again = await take(sub, 2)
            assert [(m.seq, m.redelivered) for m in again] == [(6, True), (7, True)]
            for msg in [first, *again]:
                msg.ack()
            await nothing_more(sub, 0.8)


@on_both_backends
async def test_durable_resume_after_close(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port) as sc:
        for i in range(1, 4):
            await sc.publish("foo", b"%d" % i)
        async with sc.subscribe(
            "foo", durable="dur", manual_ack=True, start_at=StartPosition.FIRST, close_on_exit=True
        ) as sub:
            got = await take(sub, 3)
            got[0].ack()
            got[2].ack()  # seq 2 stays pending
        await sc.publish("foo", b"4")
        async with sc.subscribe("foo", durable="dur", manual_ack=True, start_at=StartPosition.NEW_ONLY) as sub:
            got = await take(sub, 2)
            assert [(m.seq, m.redelivered) for m in got] == [(2, True), (4, False)]
            for m in got:
                m.ack()
        # That block unsubscribed: the durable is gone, a new one honours its start position.
        async with sc.subscribe("foo", durable="dur", start_at=StartPosition.FIRST) as sub:
            assert [m.seq for m in await take(sub, 4)] == [1, 2, 3, 4]


@on_both_backends
async def test_queue_member_leaving_hands_its_messages_to_the_others(server: ServerThread) -> None:
    async with (
        connect(CID, "a", port=server.port) as a,
        connect(CID, "b", port=server.port) as b,
    ):
        sub_a = await a.open_subscription("work", queue="q", manual_ack=True, ack_wait=60)
        async with b.subscribe("work", queue="q", manual_ack=True, ack_wait=60) as sub_b:
            for i in range(6):
                await a.publish("work", b"%d" % i)
            await eventually(lambda: sub_a.pending() + sub_b.pending() >= 6)
            held_by_a = [m.seq for m in await take(sub_a, sub_a.pending())]
            assert held_by_a, "round-robin gives both members messages"
            got_b = await take(sub_b, sub_b.pending())
            for m in got_b:
                m.ack()
            started = anyio.current_time()
            await sub_a.close()  # leaves with its messages unacked (AckWait is a minute)
            moved = await take(sub_b, len(held_by_a), within=2)
            assert sorted(m.seq for m in moved) == held_by_a and all(m.redelivered for m in moved)
            assert anyio.current_time() - started < 1.0


@on_both_backends
@EMBEDDED
async def test_client_survives_tcp_drop_and_keeps_its_session(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port, reconnect_wait_s=0.1) as sc:
        async with sc.subscribe("foo", manual_ack=True, ack_wait=0.3) as sub:
            await sc.publish("foo", b"before")
            (msg,) = await take(sub, 1)
            msg.ack()
            reconnects = sc.nats.reconnects
            drop_connections(server)
            await eventually(lambda: sc.nats.reconnects > reconnects)
            await sc.publish("foo", b"after")
            (msg,) = await take(sub, 1)
            assert msg.data == b"after" and msg.seq == 2
            msg.ack()
            await nothing_more(sub, 0.6)


def drop_connections(server: ServerThread) -> None:
    """The network drops every connection of the server (done in the server's own loop)."""

    async def drop() -> None:
        assert server.running is not None
        for conn in list(server.running.broker._conns.values()):
            await trio.aclose_forcefully(conn.stream)

    server.call(drop)


def pending_of_the_only_subscription(server: ServerThread) -> dict[int, object]:
    """What the server holds pending for its one subscription (read in the server's own loop)."""

    async def read() -> dict[int, object]:
        assert server.running is not None
        engine = server.running.core.engine
        (sub_id,) = engine.subscriptions()
        return dict(engine.inspect.pending(sub_id))

    return server.call(read)


@on_both_backends
@EMBEDDED
async def test_redelivered_copies_of_acked_or_queued_messages_are_suppressed(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port, reconnect_wait_s=0.1) as sc:
        async with sc.subscribe("foo", manual_ack=True, ack_wait=0.1) as sub:
            await sc.publish("foo", b"slow")
            await anyio.sleep(0.55)  # the application is busy: copies pile up after each AckWait
            (msg,) = await take(sub, 1)
            assert sub.suppressed >= 3 and sub.pending() == 0
            msg.ack()
            await nothing_more(sub, 0.3)

            # An ack lost with the TCP connection: the redelivery is dropped here and re-acknowledged.
            await sc.publish("foo", b"lost-ack")
            (msg,) = await take(sub, 1)
            drop_connections(server)
            msg.ack()  # goes nowhere: we are disconnected
            before = sub.suppressed
            await eventually(lambda: sub.suppressed > before)
            await nothing_more(sub, 0.3)
            assert pending_of_the_only_subscription(server) == {}


@on_both_backends
async def test_without_suppression_every_copy_reaches_the_application(server: ServerThread) -> None:
    # What the reference clients do, and what makes a redelivery storm (bench/storm.py's stock run).
    async with connect(CID, "me", port=server.port) as sc:
        async with sc.subscribe("foo", manual_ack=True, ack_wait=0.1, suppress_copies=False) as sub:
            await sc.publish("foo", b"slow")
            await anyio.sleep(0.45)  # the application is busy: copies pile up after each AckWait
            copies = await take(sub, sub.pending())
            assert len(copies) >= 3 and {m.seq for m in copies} == {1} and sub.suppressed == 0
            assert [m.attempt for m in copies] == list(range(1, len(copies) + 1))


@on_both_backends
async def test_progress_held_keeps_held_messages_from_redelivery(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port) as sc:
        async with sc.subscribe("foo", manual_ack=True, ack_wait=0.2, suppress_copies=False) as sub:
            for i in range(3):
                await sc.publish("foo", b"%d" % i)
            (first,) = await take(sub, 1)  # handed to the application, the other two wait here
            for _ in range(10):  # 0.6 s: three AckWaits
                await anyio.sleep(0.06)
                assert sub.progress_held() == 3
            first.ack()
            rest = await take(sub, 2)
            assert [m.attempt for m in rest] == [1, 1] and sub.pending() == 0, "nothing was redelivered"
            for msg in rest:
                msg.ack()
            await nothing_more(sub, 0.4)
            assert sub.progress_held() == 0


@on_both_backends
@EMBEDDED
async def test_queue_members_suppress_copies_of_acked_messages(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port, reconnect_wait_s=0.1) as sc:
        async with sc.subscribe("foo", queue="q", manual_ack=True, ack_wait=0.15) as sub:
            await sc.publish("foo", b"x")
            (msg,) = await take(sub, 1)
            drop_connections(server)
            msg.ack()
            await eventually(lambda: sub.suppressed > 0)
            await nothing_more(sub, 0.3)


@on_both_backends
async def test_restart_recovery_redelivers_pending_before_new(tmp_path: Path) -> None:
    cfg = config(tmp_path / "data", port=free_port(), http_port=-1)
    server = ServerThread(cfg).start()
    try:
        async with connect(CID, "me", port=cfg.port, reconnect_wait_s=0.1) as sc:
            sub = await sc.open_subscription("foo", manual_ack=True, ack_wait=60, durable="d")
            for i in range(1, 6):
                await sc.publish("foo", b"%d" % i)
            got = await take(sub, 5)
            got[0].ack()
            got[1].ack()
            await sc.nats.flush()  # the server has the acks...
            assert server.running is not None
            await state_stored(server.running.http_port)  # ...and has stored them
            await anyio.to_thread.run_sync(server.stop)  # the server stops; the client keeps reconnecting
            await anyio.sleep(0.3)
            with server_thread(cfg) as again:
                await sc.publish("foo", b"6")  # waits for the reconnect and the recovery hold
                await sc.publish("foo", b"7")
                after = await take(sub, 5)
                assert [(m.seq, m.redelivered) for m in after] == [
                    (3, True),
                    (4, True),
                    (5, True),
                    (6, False),
                    (7, False),
                ]
                for m in after:
                    m.ack()
                await nothing_more(sub)
                await sub.unsubscribe()
                assert again.running is not None and again.running.store.channel_info("foo") is not None
    finally:
        server.stop()


@on_both_backends
async def test_requests_to_a_closed_client_fail_clearly(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port) as sc:
        await sc.close()
        with pytest.raises(Exception, match="closed"):
            await sc.publish("foo", b"x")
    assert isinstance(sc, StanClient)


@on_both_backends
async def test_unknown_cluster_id_times_out_with_the_stan_message(server: ServerThread) -> None:
    with pytest.raises(StanError, match="connect request timeout"):
        async with connect("other-cluster", "me", port=server.port, request_timeout_s=0.5):
            pass


@on_both_backends
async def test_publish_window_publish_nowait_and_wait_pub_acks(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port, max_pub_acks_inflight=8) as sc:
        futures = [sc.publish_nowait("foo", b"%d" % i) for i in range(8)]
        with pytest.raises(anyio.WouldBlock):
            sc.publish_nowait("foo", b"too many")
        await sc.wait_pub_acks()
        assert [f.error for f in futures] == [""] * 8
        assert await futures[0].wait() == futures[0].guid
        later = [await sc.publish_async("foo", b"more") for _ in range(20)]  # waits for room by itself
        await sc.wait_pub_acks()
        assert all(f.done() and f.error == "" for f in later)
        assert server.running is not None
        info = server.running.store.channel_info("foo")
        assert info is not None and info.last_seq == 28


@on_both_backends
async def test_extensions_over_the_wire_dead_letter_backoff_and_in_progress(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port) as sc:
        async with (
            sc.subscribe("dlq", start_at=StartPosition.FIRST) as dead,
            sc.subscribe(
                "jobs", manual_ack=True, ack_wait=0.1, max_deliver=2, dead_letter_channel="dlq", backoff_s=(0.1, 0.2)
            ) as sub,
        ):
            await sc.publish("jobs", b"poison")
            got = await take(sub, 2)  # two attempts, never acked
            assert [m.attempt for m in got] == [1, 2]
            (letter,) = await take(dead, 1)
            body = json.loads(letter.data)
            assert (body["channel"], body["seq"], body["attempts"]) == ("jobs", 1, 2)
            assert base64.b64decode(body["data_b64"]) == b"poison"
            await nothing_more(sub, 0.5)

        async with sc.subscribe("slow", manual_ack=True, ack_wait=0.6) as sub:
            await sc.publish("slow", b"long job")
            (msg,) = await take(sub, 1)
            for _ in range(6):  # "still working" every 0.15 s resets the 0.6 s AckWait: no redelivery
                await anyio.sleep(0.15)
                msg.in_progress()
            msg.ack()
            await nothing_more(sub, 0.5)


@on_both_backends
async def test_the_session_survives_a_sigkilled_server_and_its_restart(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(["-p", str(port), "--http_port=-1", "--dir", str(tmp_path / "data")]).start()
    try:
        async with connect(CID, "me", port=port, reconnect_wait_s=0.1) as sc:
            async with sc.subscribe("foo", durable="d", manual_ack=True, ack_wait=60) as sub:
                await sc.publish("foo", b"before")
                await take(sub, 1)
                await state_stored(server.http_port)  # its pending entry is stored (within ~30 ms)
                await anyio.to_thread.run_sync(server.kill)  # not acked: pending when the server dies
                await anyio.to_thread.run_sync(server.start)
                await sc.publish("foo", b"after")  # once reconnected: the session is still known
                again = await take(sub, 2)
                assert [(m.seq, m.redelivered, m.data) for m in again] == [(1, True, b"before"), (2, False, b"after")]
                for m in again:
                    m.ack()
                await nothing_more(sub)
    finally:
        server.stop()


@on_both_backends
async def test_a_nak_over_the_wire_brings_the_message_back_after_its_delay(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port) as sc:
        async with sc.subscribe("naks", manual_ack=True, ack_wait=30, start_at=StartPosition.FIRST) as sub:
            for i in range(3):
                await sc.publish("naks", b"%d" % i)
            got = await take(sub, 3)
            got[0].nak(delay=0.6)
            got[1].nak()  # no delay: at once
            got[2].ack()
            (now,) = await take(sub, 1)
            assert (now.seq, now.redelivered, now.attempt) == (2, True, 2)
            now.ack()
            await nothing_more(sub, 0.3)  # 1 is not back before its delay
            (later,) = await take(sub, 1, within=2.0)
            assert (later.seq, later.redelivered, later.attempt) == (1, True, 2)
            later.ack()
            await nothing_more(sub, 0.3)


@on_both_backends
async def test_a_nak_in_auto_ack_mode_is_not_acked_by_the_next_read(server: ServerThread) -> None:
    async with connect(CID, "me", port=server.port) as sc:
        async with sc.subscribe("auto", ack_wait=30) as sub:
            await sc.publish("auto", b"x")
            (msg,) = await take(sub, 1)
            msg.nak(delay=0.2)
            (again,) = await take(sub, 1, within=2.0)  # the read that would have acked it
            assert (again.seq, again.attempt) == (1, 2)


async def test_a_nak_waits_out_its_delay_across_a_sigkill_and_restart(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(["-p", str(port), "--http_port=-1", "--dir", str(tmp_path / "data")]).start()
    try:
        async with connect(CID, "me", port=port, reconnect_wait_s=0.1) as sc:
            async with sc.subscribe("foo", durable="d", manual_ack=True, ack_wait=60) as sub:
                await sc.publish("foo", b"later")
                (msg,) = await take(sub, 1)
                naked_at = trio.current_time()
                msg.nak(delay=4.0)
                await anyio.sleep(0.1)
                await state_stored(server.http_port)  # the nak and its end are stored
                await anyio.to_thread.run_sync(server.kill)
                await anyio.to_thread.run_sync(server.start)
                await sc.publish("foo", b"new")  # once reconnected
                (new,) = await take(sub, 1)
                assert (new.seq, new.redelivered) == (2, False), "new messages do not wait for a nak'd one"
                new.ack()
                (back,) = await take(sub, 1, within=8.0)
                assert trio.current_time() - naked_at >= 4.0 - 0.05, "not back before its delay, restart or not"
                assert (back.seq, back.redelivered, back.data) == (1, True, b"later")
                back.ack()
                await nothing_more(sub)
    finally:
        server.stop()


@needs_stan
async def test_a_nak_to_nats_streaming_server_raises_instead_of_sending(tmp_path: Path) -> None:
    """nats-streaming-server announces no nak subject: the client says so rather than send a nak
    that server would not understand (there the message comes back after its AckWait)."""
    with stan_peer(tmp_path / "stan") as peer:
        async with connect("test-cluster", "me", port=peer.port) as sc:
            assert sc.nak_suffix == ""
            async with sc.subscribe("foo", manual_ack=True) as sub:
                await sc.publish("foo", b"x")
                (msg,) = await take(sub, 1)
                with pytest.raises(NakNotSupportedError):
                    msg.nak(delay=1)
                msg.ack()


@on_both_backends
async def test_a_wildcard_subscription_over_the_wire(server: ServerThread) -> None:
    """Our client on `orders.*`: each message names its channel, acks go back per channel, what is not
    acked comes back on its own channel, and unsubscribing ends it on every channel."""
    async with connect(CID, "me", port=server.port) as sc:
        await sc.publish("orders.eu", b"eu1")
        async with sc.subscribe(
            "orders.*", manual_ack=True, ack_wait=1, start_at=StartPosition.FIRST, max_inflight=10
        ) as sub:
            await sc.publish("orders.us", b"us1")  # a channel made after the subscription
            await sc.publish("orders.eu", b"eu2")
            await sc.publish("orders.eu.archive", b"not one token below")
            got = await take(sub, 3)
            assert [(m.subject, m.seq, m.data) for m in got] == [
                ("orders.eu", 1, b"eu1"),
                ("orders.us", 1, b"us1"),
                ("orders.eu", 2, b"eu2"),
            ]
            got[0].ack()
            got[2].ack()
            (again,) = await take(sub, 1, within=3.0)  # orders.us 1: the same seq as eu 1, acked
            assert (again.subject, again.seq, again.redelivered) == ("orders.us", 1, True)
            again.nak(delay=0.2)  # naks name the channel too
            (back,) = await take(sub, 1, within=3.0)
            assert (back.subject, back.seq, back.attempt) == ("orders.us", 1, 3)
            back.ack()
            await nothing_more(sub, 1.3)


async def test_a_durable_wildcard_keeps_each_channels_place_across_a_sigkill(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(["-p", str(port), "--http_port=-1", "--dir", str(tmp_path / "data")]).start()
    try:
        async with connect(CID, "me", port=port, reconnect_wait_s=0.1) as sc:
            async with sc.subscribe("jobs.>", durable="d", manual_ack=True, ack_wait=60) as sub:
                await sc.publish("jobs.a", b"a1")
                await sc.publish("jobs.b.x", b"bx1")
                first = await take(sub, 2)
                first[0].ack()  # jobs.b.x 1 stays pending
                await sc.nats.flush()
                await anyio.sleep(0.1)
                await state_stored(server.http_port)
                await anyio.to_thread.run_sync(server.kill)
                await anyio.to_thread.run_sync(server.start)
                await sc.publish("jobs.a", b"a2")  # once reconnected
                await sc.publish("jobs.c", b"c1")  # a channel made after the restart
                after = await take(sub, 3, within=10.0)
                assert [(m.subject, m.seq, m.redelivered) for m in after[:1]] == [("jobs.b.x", 1, True)], (
                    "what was pending comes before anything new"
                )
                assert sorted((m.subject, m.seq) for m in after[1:]) == [("jobs.a", 2), ("jobs.c", 1)]
                for m in after:
                    m.ack()
                await nothing_more(sub)
    finally:
        server.stop()


async def test_wildcard_subscriptions_can_be_turned_off(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(["-p", str(port), "--store", "memory", "--wildcard_subscriptions", "false"]).start()
    try:
        async with connect(CID, "me", port=port) as sc:
            with pytest.raises(StanError, match="invalid subject"):
                await sc.open_subscription("orders.*")
    finally:
        server.stop()


@on_both_backends
async def test_an_ordered_queue_group_over_a_pattern_keeps_each_channels_order(server: ServerThread) -> None:
    """Two members of an ordered group on `jobs.*`, each slow to ack: every message once, each channel
    in order, never two of one channel at once, and the channels spread over both members."""
    channels = [f"jobs.{name}" for name in "abcd"]
    busy: dict[str, int] = {}
    seen: dict[str, list[int]] = {c: [] for c in channels}
    by_member: dict[int, set[str]] = {0: set(), 1: set()}
    done = anyio.Event()

    async def member(index: int, sub: Subscription) -> None:
        async for msg in sub:
            assert busy.get(msg.subject, 0) == 0, f"two messages of {msg.subject} out at once"
            busy[msg.subject] = 1
            await anyio.sleep(0.02)
            seen[msg.subject].append(msg.seq)
            by_member[index].add(msg.subject)
            busy[msg.subject] = 0
            msg.ack()
            if sum(len(s) for s in seen.values()) == 12:
                done.set()

    async with connect(CID, "me", port=server.port) as sc, anyio.create_task_group() as nursery:
        for index in range(2):
            sub = await sc.open_subscription("jobs.*", queue="w", ordered=True, manual_ack=True, ack_wait=30)
            nursery.start_soon(member, index, sub)
        for i in range(3):
            for channel in channels:
                await sc.publish(channel, b"%d" % i)
        with anyio.fail_after(10):
            await done.wait()
        nursery.cancel_scope.cancel()
    assert seen == {c: [1, 2, 3] for c in channels}
    assert by_member[0] and by_member[1], "the channels were spread over the members"
