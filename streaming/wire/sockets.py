"""Writing to a socket without a task switch: one non-blocking write, for the broker's connections
and our client's (under Trio), whose writer task then sends whatever the socket did not take."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import trio


class _HasFileno(Protocol):
    def fileno(self) -> int: ...


def write_socket(sock: _HasFileno, data: bytes) -> int:
    """Write what the socket takes at once and return how much that was (0 when it is full, or broken:
    the writer's send then meets the error properly). Never blocks: Trio keeps its sockets
    non-blocking. Only when no send is under way on the socket, or the bytes would interleave."""
    try:
        # fileno() is -1 once the socket is closed; a cached number could be reused by then.
        return os.write(sock.fileno(), data)
    except OSError:
        return 0


def write_now(stream: trio.SocketStream, data: bytes) -> int:
    """`write_socket` on a Trio socket stream's socket."""
    return write_socket(stream.socket, data)
