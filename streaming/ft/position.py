"""Which log a member's data directory was made from, and how far into it the store on disk is.

A small JSON file beside the store (`ft-position.json`), replaced atomically, written only after the
store was flushed, so it never claims more than the disk holds; the store may hold more (the position
is saved lazily), which replay allows (see `streaming.ft.replay`).

Replay from behind the store is harmless except across a channel's deletion (an old append to it
cannot be told from a gap once it is gone). So a deletion is recorded here before it is done
(`deleting`), and the position moves past it, flushed, right after: a replay that starts before a
deletion the store may have done knows of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs

from streaming.ft.status import GroupError

FILE = "ft-position.json"


@attrs.define
class Position:
    path: Path
    log_id: str = ""  # the log's Genesis id; "" before the store holds anything of a log
    applied: int = 0  # the log sequence of the last record the store holds (at least)
    saved: int = 0
    deleting: tuple[int, str] | None = None  # (log sequence, channel) of a deletion under way

    @classmethod
    def load(cls, directory: Path) -> Position:
        path = directory / FILE
        try:
            data = json.loads(path.read_text())
            deleting = data.get("deleting")
            return cls(
                path,
                str(data["log_id"]),
                int(data["applied"]),
                int(data["applied"]),
                None if deleting is None else (int(deleting[0]), str(deleting[1])),
            )
        except FileNotFoundError:
            return cls(path)
        except (ValueError, KeyError, TypeError) as exc:
            raise GroupError(f"{path} is damaged ({exc}): empty the directory to rebuild it from the log") from None

    @staticmethod
    def damaged(directory: Path) -> bool:
        """Whether the position file in `directory` is there but unreadable."""
        try:
            Position.load(directory)
        except GroupError:
            return True
        return False

    def mark_delete(self, seq: int, channel: str) -> None:
        """Before the store deletes `channel` for the record at `seq`."""
        self.deleting = (seq, channel)
        self._write(self.saved)

    def save(self, applied: int) -> None:
        """The store on disk holds every record up to `applied` (it was flushed since)."""
        if self.deleting is not None and applied >= self.deleting[0]:
            self.deleting = None
        elif applied == self.saved and self.path.exists():
            return
        self._write(applied)
        self.saved = applied

    def _write(self, applied: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump({"log_id": self.log_id, "applied": applied, "deleting": self.deleting}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
