"""Writing to a Trio socket stream without a task switch: one non-blocking write, for the broker's
connections and our client's, whose writer task then sends whatever the socket did not take."""

from __future__ import annotations

import os

import trio


def write_now(stream: trio.SocketStream, data: bytes) -> int:
    """Write what the socket takes at once and return how much that was (0 when it is full, or broken:
    the writer's `send_all` then meets the error properly). Never blocks: Trio keeps its sockets
    non-blocking. Only when no `send_all` is under way on `stream`, or the bytes would interleave."""
    try:
        # fileno() is -1 once Trio has closed the socket; a cached number could be reused by then.
        return os.write(stream.socket.fileno(), data)
    except OSError:
        return 0
