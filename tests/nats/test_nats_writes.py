"""Our NATS connection's two ways of writing (straight to the socket, or through the writer task)
against a peer that reads only when the test says: with small socket buffers, a direct write is
partial and the writer is caught in the middle of a send, and the peer still reads every frame whole
and in order."""

from __future__ import annotations

import socket
import time

import trio

from streaming.client.nats_conn import NatsConnection
from streaming.wire import nats as p

BUFFER = 16 * 1024  # the kernel doubles it; either way far less than one of the large payloads


async def test_direct_and_writer_writes_keep_frames_whole_and_in_order() -> None:
    listener = trio.socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)  # accepted sockets inherit it
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    nc = NatsConnection("127.0.0.1", port)
    parser = p.ServerConnection(max_payload=8 * 1024 * 1024)
    received: list[bytes] = []

    async def read(peer: trio.socket.SocketType, at_most: int) -> None:
        data = await peer.recv(at_most)
        parser.receive_data(data)
        while (event := parser.next_event()) is not p.NEED_DATA:
            if isinstance(event, p.Pub):
                received.append(event.payload)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            peers: list[trio.socket.SocketType] = []

            async def handshake() -> None:
                peer, _ = await listener.accept()
                await peer.send(p.encode_info({"max_payload": 8 * 1024 * 1024, "proto": 1}))
                await read(peer, 65536)  # CONNECT and PING
                await peer.send(p.PONG_BYTES)
                peers.append(peer)

            nursery.start_soon(handshake)
            await nursery.start(nc.run)  # started once the PONG came back
            (peer,) = peers
            assert nc._socket is not None, "under Trio, on plain TCP: direct writes are on"
            nc._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)

            sent: list[bytes] = []

            def publish(size: int) -> None:
                data = b"%04d" % len(sent) + b"x" * size
                assert nc.publish("s", data, at_once=True)
                sent.append(data)

            for _ in range(5):
                # Quiet spells that hold the loop: the next publish is written at once, and
                # nothing else (the writer) runs meanwhile.
                time.sleep(0.0002)  # noqa: ASYNC251
                publish(300_000)  # more than the socket takes: a partial write, the writer has the rest
                await trio.sleep(0.01)  # the writer sends what is left and blocks on the full socket
                await read(peer, 4096)  # some room: the writer is woken, but has not run yet
                time.sleep(0.0002)  # noqa: ASYNC251
                publish(10)  # must not be written into that room past the writer's unsent bytes
                publish(10)
                while len(received) < len(sent):
                    await read(peer, 65536)
            assert received == sent
            await nc.close()
            peer.close()
            listener.close()
