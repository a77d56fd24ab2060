"""How Trio code calls the store: on a worker thread when the store may fsync (LMDB), else inline."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")


async def call_store(fn: Callable[[], T], *, in_thread: bool) -> T:
    """Run one store call: on a worker thread (LMDB in production, so the event loop never waits for
    an fsync), or inline followed by a checkpoint (memory store; tests under MockClock)."""
    if in_thread:
        return await trio.to_thread.run_sync(fn)
    result = fn()
    await trio.lowlevel.checkpoint()
    return result
