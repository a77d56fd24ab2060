"""Checkpoints of the LMDB store: when to copy the journal into LMDB (the checkpoint thread), holding
appends back when the journal runs far ahead of it, and the one synced LMDB commit that copies it.

The store says what to copy (`LmdbStore.checkpoint`, which hands its in-memory messages over under
its locks); this module decides when, and writes it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import lmdb

from storage.codec import MSG_KEY, U64, decode_channel, encode_channel
from storage.environment import Environment
from storage.errors import IntegrityError, StoreError, StoreFullError
from storage.records import ChannelInfo

log = logging.getLogger(__name__)
_EMPTY: dict[int, tuple[bytes, bytes]] = {}


class Checkpointer:
    """The checkpoint thread: it checkpoints every `interval_s`, or as soon as the journal holds
    `every_bytes`; appends wait (`wait_for_room`) while it holds `max_bytes` not yet checkpointed."""

    def __init__(
        self,
        path: Path,
        checkpoint: Callable[[], None],
        journal_bytes: Callable[[], int],
        *,
        every_bytes: int,
        interval_s: float,
        max_bytes: int,
    ) -> None:
        self._path = path
        self._checkpoint = checkpoint
        self._journal_bytes = journal_bytes
        self._every_bytes = every_bytes
        self._interval_s = interval_s
        self._max_bytes = max_bytes
        self._wake = threading.Condition()  # the thread, and appends waiting for room
        self._closing = False
        self._thread: threading.Thread | None = None
        self.error: StoreError | None = None  # why the last checkpoint failed, until one succeeds

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"checkpoint {self._path}", daemon=True)
        self._thread.start()

    def stop(self) -> bool:
        """Stop the thread (True if it ran: the store then checkpoints one last time itself)."""
        if self._thread is None:
            return False
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        self._thread.join()
        self._thread = None
        return True

    @property
    def closing(self) -> bool:
        """The store is closing: the last checkpoint is the store's, and nothing is readied after it."""
        return self._closing

    def poke(self) -> None:
        """The journal grew past a checkpoint's worth, or a checkpoint made room: look again."""
        with self._wake:
            self._wake.notify_all()

    def due(self) -> bool:
        return self._journal_bytes() >= self._every_bytes

    def try_checkpoint(self) -> None:
        """Checkpoint; a store error is logged and kept, not raised: the journal still has it all."""
        try:
            self._checkpoint()
            self.error = None
        except StoreError as exc:
            if self.error is None:
                log.error("checkpoint failed (the journal keeps every message; retrying): %s", exc)
            self.error = exc

    def wait_for_room(self) -> None:
        """Hold an append while the journal is far past a checkpoint that has not caught up."""
        if self._journal_bytes() < self._max_bytes:
            return
        with self._wake:
            self._wake.notify_all()
            while self._journal_bytes() >= self._max_bytes and not self._closing:
                if self.error is not None:
                    raise StoreFullError(f"{self._path}: the journal is full and cannot be checkpointed ({self.error})")
                self._wake.wait(0.1)

    def _run(self) -> None:
        """Wait for enough journal, or for the interval, then checkpoint."""
        while True:
            with self._wake:
                deadline = time.monotonic() + self._interval_s
                while not self._closing and self._journal_bytes() < self._every_bytes:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                if self._closing:
                    return
            try:
                self.try_checkpoint()
            except Exception as exc:  # a bug: keep the journal (appends stop once it is full), say so
                log.exception("checkpoint failed")
                self.error = StoreError(f"checkpoint failed: {exc!r}")


def write_checkpoint(
    msgs: Environment,
    infos: list[ChannelInfo],
    copying: dict[int, dict[int, tuple[bytes, bytes]]],
    retired: int | None,
    journal_sizes: bytes,
    path: Path,
) -> None:
    """One synced commit: each channel's new messages (`copying`: channel id -> seq -> key and value)
    and its record, the rows its limits removed deleted, the retired journal epoch and the journal
    files' sizes (they only grow: a later open that finds one shorter knows it was cut)."""
    dbs = msgs.dbs

    def write(txn: lmdb.Transaction) -> None:
        cursor = txn.cursor(db=dbs["messages"])
        for info in infos:
            stored = txn.get(info.name.lower().encode(), db=dbs["channels"])
            old = None if stored is None else decode_channel(stored)
            if old is None or old.channel_id != info.channel_id:
                continue  # deleted meanwhile
            new = copying.get(info.channel_id, _EMPTY)
            start = max(info.first_seq, old.last_seq + 1)
            items = [new[seq] for seq in range(start, info.last_seq + 1)]
            _, added = cursor.putmulti(items, overwrite=False)
            if added != len(items):
                raise IntegrityError(
                    f"{path}: {len(items) - added} new message keys already exist: channel metadata "
                    "and the message log disagree"
                )
            if old.first_seq < info.first_seq and old.msgs:
                end = MSG_KEY.pack(info.channel_id, info.first_seq)
                if cursor.set_range(MSG_KEY.pack(info.channel_id, old.first_seq)):
                    while bytes(cursor.key()) < end and cursor.delete():
                        pass
            txn.put(info.name.lower().encode(), encode_channel(info), db=dbs["channels"])
        if retired is not None:
            txn.put(b"journal_epoch", U64.pack(retired), db=dbs["meta"])
        txn.put(b"journal_sizes", journal_sizes, db=dbs["meta"])

    with msgs.write_lock:
        msgs.write(write)
