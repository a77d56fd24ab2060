"""An exclusive, process-wide lock on a data directory (flock on `<dir>/LOCK`).

LMDB itself happily lets several processes write one environment, and two servers delivering from one
store would double-deliver and corrupt each other's positions, so the server takes this lock first.
The kernel drops it when the process dies, so a SIGKILLed server never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from storage.errors import StoreLockedError


class DirectoryLock:
    def __init__(self, directory: Path) -> None:
        self.path = directory / "LOCK"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLockedError(
                f"data directory {self.path.parent} is in use by another process (pid {holder}); "
                "only one server may use a data directory at a time"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
