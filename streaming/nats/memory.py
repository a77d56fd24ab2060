"""Giving freed memory back to the operating system.

glibc keeps the memory of freed large buffers (a connection's half-received 1 MB message, a slow
consumer's pending output) in its heap for later use: 100 connections that each leave one behind
keep that memory resident after they are gone. `malloc_trim` returns it, cheaply (bench/README.md,
**soak**). Elsewhere than glibc this does nothing. The C library is looked up on first use, not at
import: importing the module (the client, a test) loads nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable

_TRIM_EVERY_S = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_trim: Callable[[int], int] | None = None
_looked_up = False
_last = 0.0


def release_freed_memory() -> None:
    """Return freed heap memory to the system (at most once a second; a no-op without glibc)."""
    global _last, _looked_up, _trim
    now = time.monotonic()
    if now - _last < _TRIM_EVERY_S:
        return
    _last = now
    if not _looked_up:
        _looked_up = True
        _trim = _malloc_trim()
    if _trim is not None:
        _trim(0)
