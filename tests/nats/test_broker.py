"""The embedded NATS broker over real TCP: framing, routing, errors, slow consumers."""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import Awaitable

import trio

from streaming.nats.bus import Origin
from streaming.wire import nats as p
from tests.support.servers import RawClient, config, eventually, running


async def test_info_has_what_clients_need() -> None:
    async with running(config()) as server:
        client = await RawClient.open(server.port)
        assert client.info["max_payload"] == 1024 * 1024
        assert client.info["headers"] is False and client.info["proto"] == 1
        await client.aclose()


async def test_routing_wildcards_queues_and_verbose() -> None:
    async with running(config()) as server:
        sub = await RawClient.open(server.port, b'CONNECT {"verbose":true}\r\n')
        await sub.send(b"SUB foo.* 1\r\nSUB foo.> 2\r\nSUB foo.bar q 3\r\nSUB foo.bar q 4\r\nPING\r\n")
        for _ in range(4):
            assert await sub.next() == p.OK
        assert await sub.next() == p.PONG
        pub = await RawClient.open(server.port)
        await pub.send(b"PUB foo.bar reply 2\r\nhi\r\nPUB foo.bar.baz 0\r\n\r\nPING\r\n")
        assert await pub.next() == p.PONG
        got = [await sub.next() for _ in range(4)]
        assert all(isinstance(m, p.Msg) for m in got)
        msgs = [m for m in got if isinstance(m, p.Msg)]
        assert sorted((m.sid, m.subject, m.payload) for m in msgs if m.sid in ("1", "2")) == [
            ("1", "foo.bar", b"hi"),
            ("2", "foo.bar", b"hi"),
            ("2", "foo.bar.baz", b""),
        ]
        assert len([m for m in msgs if m.sid in ("3", "4")]) == 1  # one queue member
        assert all(m.reply == "reply" for m in msgs if m.subject == "foo.bar")


async def test_unsub_with_max_and_echo_off() -> None:
    async with running(config()) as server:
        c = await RawClient.open(server.port, b'CONNECT {"echo":false}\r\n')
        other = await RawClient.open(server.port)
        await other.send(b"SUB x 1\r\nUNSUB 1 2\r\nPING\r\n")
        assert await other.next() == p.PONG
        await c.send(b"SUB x 9\r\n" + b"PUB x 1\r\na\r\n" * 3 + b"PING\r\n")
        assert await c.next() == p.PONG  # nothing of its own came back (echo off)
        await other.send(b"PING\r\n")
        got = [await other.next() for _ in range(3)]
        assert [type(e) for e in got] == [p.Msg, p.Msg, p.Pong]  # auto-unsubscribed after two


async def test_errors_are_quoted_and_only_the_offender_is_closed() -> None:
    async with running(config(max_payload=1000)) as server:
        bystander = await RawClient.open(server.port)
        await bystander.send(b"SUB ok 1\r\nPING\r\n")
        assert await bystander.next() == p.PONG

        bad_subject = await RawClient.open(server.port)
        await bad_subject.send(b"SUB foo..bar 1\r\nPING\r\n")
        assert await bad_subject.next() == p.Err("Invalid Subject")
        assert await bad_subject.next() == p.PONG  # still connected

        for data, text in [
            (b"HELLO\r\n", "Unknown Protocol Operation"),
            (b"PUB foo 5000\r\n", "Maximum Payload Violation"),
            (b"SUB " + b"a" * 5000 + b" 1\r\n", "maximum control line exceeded"),
        ]:
            offender = await RawClient.open(server.port)
            await offender.send(data)
            assert await offender.until_closed() == [p.Err(text)]

        await bystander.send(b"PUB ok 2\r\nhi\r\nPING\r\n")
        assert await bystander.next() == p.Msg("ok", "1", "", b"hi")
        assert await bystander.next() == p.PONG


async def test_random_bytes_never_hurt_other_clients() -> None:
    rng = random.Random(4)
    async with running(config()) as server:
        bystander = await RawClient.open(server.port)
        await bystander.send(b"SUB ok 1\r\n")
        for i in range(40):
            junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
            if i % 3 == 0:  # garbage that starts like a real operation
                junk = rng.choice([b"PUB x ", b"SUB ", b"CONNECT ", b"UNSUB ", b"MSG "]) + junk
            offender = await RawClient.open(server.port, connect=b"")
            await offender.send(junk + b"\r\n")
            with trio.move_on_after(0.5):
                events = await offender.until_closed()
                errs = [e for e in events if isinstance(e, p.Err)]
                assert all(e.text for e in errs)
            await offender.aclose()
            await bystander.send(b"PUB ok %d\r\n%d\r\nPING\r\n" % (len(str(i)), i))
            assert await bystander.next() == p.Msg("ok", "1", "", str(i).encode())
            assert await bystander.next() == p.PONG


async def test_slow_consumer_is_cut_off_at_once_and_nobody_else_notices() -> None:
    """A subscriber that stops reading: once its pending bytes pass the limit the connection is closed
    there and then (its socket is full, so nothing queued behind it, not even the -ERR, would go out),
    while the publisher and the other subscriber carry on."""
    async with running(config(max_pending=1024 * 1024)) as server:
        slow = await RawClient.open(server.port)  # subscribes, then never reads
        await slow.send(b"SUB firehose 1\r\nPING\r\n")
        assert await slow.next() == p.PONG
        fast = await RawClient.open(server.port)
        await fast.send(b"SUB firehose 1\r\nPING\r\n")
        assert await fast.next() == p.PONG
        publisher = await RawClient.open(server.port)
        frame = b"PUB firehose 8192\r\n" + b"x" * 8192 + b"\r\n"
        count = 4000  # 32 MB: far beyond what the slow client's socket buffers and 1 MiB hold

        async def read_all(received: list[int]) -> None:
            n = 0
            while n < count:
                n += isinstance(await fast.next(), p.Msg)
            received.append(n)

        received: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all, received)
            for _ in range(count // 20):
                # Paced by PING/PONG, so the fast reader is never far behind; the slow one falls behind.
                await publisher.send(frame * 20 + b"PING\r\n")
                assert await publisher.next() == p.PONG
        assert received == [count]
        assert server.broker.statistics().slow_consumers == 1
        assert server.broker.statistics().connections == 2, "the slow one is gone while the others are served"
        events = await slow.until_closed()
        assert sum(isinstance(e, p.Msg) for e in events) < count


async def test_a_burst_past_the_limit_gets_the_error_when_the_socket_takes_it() -> None:
    """Past the limit in one go, onto a socket with room: the -ERR goes out before the close."""
    async with running(config(max_pending=64 * 1024)) as server:
        burst = await RawClient.open(server.port)
        await burst.send(b"SUB big 1\r\nPING\r\n")
        assert await burst.next() == p.PONG
        publisher = await RawClient.open(server.port)
        await publisher.send(b"PUB big 100000\r\n" + bytes(100_000) + b"\r\nPING\r\n")
        assert await publisher.next() == p.PONG
        with trio.fail_after(5):
            assert await burst.until_closed() == [p.Err("Slow Consumer")]


async def test_a_long_read_is_handled_in_slices() -> None:
    """Thousands of frames in one read (a subscriber's acks) must not hold the loop for all of them:
    each slice is its own input span, and other tasks get their turn every few hundred events."""
    async with running(config()) as server:
        broker = server.broker
        handled: list[int] = [0]
        hooks: list[int] = []
        seen_by_others: set[int] = set()

        def handler(subject: str, reply: str, payload: bytes, origin: Origin) -> None:
            handled[0] += 1

        broker.subscribe("acks", handler)

        class Spans:
            def span_started(self) -> None:
                pass

            def span_ended(self, *, more_input: bool) -> None:
                hooks.append(handled[0])

        broker.add_span_listener(Spans())
        count = 2000
        client = await RawClient.open(server.port)
        done = trio.Event()

        async def other_task() -> None:
            while not done.is_set():
                seen_by_others.add(handled[0])
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_task)
            await client.send(b"PUB acks 4\r\nack!\r\n" * count + b"PING\r\n")  # 36 KB: one read or few
            assert await client.next() == p.PONG
            done.set()
        assert handled[0] == count
        in_between = {n for n in seen_by_others if 0 < n < count}
        assert len(in_between) >= count // 256  # a read's events are sliced, not handled in one step
        assert len([n for n in hooks if 0 < n < count]) >= count // 256
        await client.aclose()


async def test_held_writes_keep_their_order_with_the_writer_and_a_full_socket() -> None:
    """Sends inside `holding_writes` go straight to the socket at its end, the others through the
    writer task; with a client that reads nothing for a while, the socket fills, direct writes are
    partial or refused, and the writer is caught mid-send: every message still arrives, in order."""
    async with running(config()) as server:
        broker = server.broker
        client = await RawClient.open(server.port)
        await client.send(b"SUB data 1\r\nPING\r\n")
        assert await client.next() == p.PONG
        rng = random.Random(7)
        filler = b"x" * 40_000  # 16 MB in all: far more than loopback sockets buffer
        sent: list[bytes] = []
        for i in range(400):
            payload = b"%06d" % i + filler[: rng.randrange(len(filler))]
            if rng.random() < 0.6:
                with broker.holding_writes():
                    broker.publish("data", payload)
                    sent.append(payload)
                    if rng.random() < 0.5:
                        broker.publish("data", b"%06d+" % i)
                        sent.append(b"%06d+" % i)
            else:
                broker.publish("data", payload)
                sent.append(payload)
            if rng.random() < 0.2:
                await trio.lowlevel.checkpoint()  # the writer runs now and then, and may block mid-send
        got: list[bytes] = []
        with trio.fail_after(30):
            while len(got) < len(sent):
                event = await client.next()
                assert isinstance(event, p.Msg)
                got.append(event.payload)
        assert got == sent
        assert broker.statistics().slow_consumers == 0
        await client.aclose()


async def test_a_held_write_to_a_vanished_client_harms_nobody() -> None:
    """A direct write to a peer that reset its connection fails inside `write_now`; the writer then
    meets the error and closes that connection, and everyone else is served as before."""
    async with running(config()) as server:
        broker = server.broker
        gone = await RawClient.open(server.port)
        await gone.send(b"SUB news 1\r\nPING\r\n")
        assert await gone.next() == p.PONG
        other = await RawClient.open(server.port)
        await other.send(b"SUB news 1\r\nPING\r\n")
        assert await other.next() == p.PONG
        # An RST, not a FIN: the server's next write to it fails at once (EPIPE / ECONNRESET).
        gone.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        gone.stream.socket.close()  # no checkpoint: the server's reader has not seen it yet
        for i in range(20):
            with broker.holding_writes():
                broker.publish("news", b"%d" % i)
            await trio.sleep(0.001)
        got = [await other.next() for _ in range(20)]
        assert [e.payload for e in got if isinstance(e, p.Msg)] == [b"%d" % i for i in range(20)]
        await eventually(lambda: broker.statistics().connections == 1)
        await other.aclose()


async def test_a_handler_knows_who_sent_its_message_across_its_awaits() -> None:
    """The sending connection is handed to the handler with the message: one that awaits before it
    looks (a connect's duplicate-ID probe, a subscription's channel creation) still sees its own
    sender, while other connections' messages are handled meanwhile."""
    async with running(config()) as server:
        broker = server.broker
        seen: list[tuple[bytes, int]] = []

        async def slow(subject: str, reply: str, payload: bytes, origin: Origin) -> None:
            await trio.sleep(0.05)  # the other connection's message is handled meanwhile
            seen.append((payload, origin.conn))

        def handler(subject: str, reply: str, payload: bytes, origin: Origin) -> Awaitable[None] | None:
            if payload == b"first":
                return slow(subject, reply, payload, origin)
            seen.append((payload, origin.conn))
            return None

        broker.subscribe("who", handler)
        a = await RawClient.open(server.port)
        b = await RawClient.open(server.port)
        await a.send(b"PUB who 5\r\nfirst\r\n")
        await trio.sleep(0.01)
        await b.send(b"PUB who 6\r\nsecond\r\n")
        await eventually(lambda: len(seen) == 2)
        conns = dict(seen)
        assert conns[b"first"] != conns[b"second"] and 0 not in conns.values()
        await a.aclose()
        await b.aclose()
