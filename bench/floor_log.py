"""The floors' durable log (`bench/stan_floor.py`, `bench/bayeux_floor.py --durable`): records appended
to one file and `fdatasync`ed, the one step a server that stores what it acknowledges cannot skip.

The file is written full of zeros at start, as our journal's files are: an `fdatasync` into
allocated but never-written space also commits the file system's journal, which costs more. It
wraps around at its size, since rewriting written space costs the same.
"""

from __future__ import annotations

import os
from pathlib import Path

SIZE = 64 << 20


class FloorLog:
    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT)
        zeros = bytes(1 << 20)
        for offset in range(0, SIZE, len(zeros)):
            os.pwrite(self._fd, zeros, offset)
        os.fsync(self._fd)
        self._offset = 0

    def append(self, record: bytes) -> None:
        """`record` on disk when this returns."""
        if self._offset + len(record) > SIZE:
            self._offset = 0
        os.pwrite(self._fd, record, self._offset)
        self._offset += len(record)
        os.fdatasync(self._fd)
