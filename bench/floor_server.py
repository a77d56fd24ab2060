"""The least a server can do for a durable publish, for measuring the floor under one publish at a time.

    python bench/floor_server.py DIR echo|blocking|trio

Listens on a free loopback port (printed on the first line of stdout), takes one connection, and for
every read of it: appends a 186-byte record to a preallocated file in DIR (as the journal writes one
128 B message), fdatasyncs it, and sends what it read back. `blocking` serves with plain blocking
socket calls; `trio` with a Trio task reading a `trio.SocketStream`, as our server's connections are
read; `echo` only sends back (blocking), for the bare loopback round trip. Nothing is parsed or
encoded, so the gap between `blocking` and `trio` is what Trio costs a request, and the gap between `trio` and our
server what the server's own work costs (bench/publish.py reports both).
"""

from __future__ import annotations

import os
import socket
import sys

import trio

RECORD = b"x" * 186
_PREALLOCATED = 64 << 20


def _journal(directory: str) -> int:
    fd = os.open(os.path.join(directory, "floor-journal"), os.O_RDWR | os.O_CREAT)
    os.posix_fallocate(fd, 0, _PREALLOCATED)
    os.fsync(fd)
    return fd


def _blocking(fd: int | None) -> None:
    """Serve with blocking calls; `fd` None: echo only."""
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    offset = 0
    while data := conn.recv(65536):
        if fd is not None:
            os.pwrite(fd, RECORD, offset % _PREALLOCATED)
            offset += len(RECORD)
            os.fdatasync(fd)
        conn.sendall(data)


async def _trio(fd: int) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(listeners[0].socket.getsockname()[1], flush=True)
    stream = await listeners[0].accept()  # trio.SocketStream sets TCP_NODELAY
    offset = 0
    async with stream:
        async for data in stream:
            os.pwrite(fd, RECORD, offset % _PREALLOCATED)
            offset += len(RECORD)
            os.fdatasync(fd)
            await stream.send_all(data)


def main() -> None:
    directory, kind = sys.argv[1:3]
    if kind == "echo":
        _blocking(None)
    elif kind == "trio":
        trio.run(_trio, _journal(directory))
    else:
        _blocking(_journal(directory))


if __name__ == "__main__":
    main()
