"""`streaming-server check` and `streaming-server repair`: look over a stopped server's data directory,
and rebuild a store from everything in it that is intact.

`check` reports every problem, each naming its file, and per channel exactly which sequences would be
lost: those that fail their checksum, are missing from the message file, or were only in a damaged
part of the journal. It writes nothing.

`repair` builds new message and state files from what is intact (storage.salvage reads it):
The old `msgs/` and `state/` move to `damaged-<UTC time>/` in the data directory, the new ones take
their place, and the report lists exactly which sequences of which channels are lost. They stay gaps in
their channels (subscribers get the messages around them), recorded in the new message file so that
later checks do not report them again.

Both take the directory lock: the server must be stopped.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import attrs
import lmdb

from storage.base import SCHEMA_VERSION
from storage.codec import (
    PENDING_KEY,
    U32,
    U64,
    encode_channel,
    encode_lost,
    encode_record,
    lost_key,
    merge_spans,
)
from storage.dirlock import DirectoryLock
from storage.environment import Environment
from storage.errors import StoreError
from storage.integrity import messages
from storage.journal import NAMES as JOURNAL_NAMES
from storage.journal import fsync_directory
from storage.records import ChannelInfo
from storage.salvage import MSGS_DBS, STATE_DBS, Salvage

_WRITE_BATCH_BYTES = 32 << 20


@attrs.frozen
class Report:
    """What `check` found or `repair` did. `lost`: per channel, the sequences that are (or would be)
    lost, as ranges; `problems`: everything else that is wrong, each naming its file."""

    directory: Path
    problems: list[str]
    lost: dict[str, list[tuple[int, int]]]
    notes: list[str] = attrs.Factory(list)
    moved_to: Path | None = None

    @property
    def clean(self) -> bool:
        return not (self.problems or self.lost)

    def lines(self) -> list[str]:
        out = list(self.problems)
        for channel, runs in sorted(self.lost.items()):
            count = sum(last - first + 1 for first, last in runs)
            seqs = ", ".join(f"{a}-{b}" if b != a else f"{a}" for a, b in runs)
            out.append(f"channel {channel!r}: {messages(count)} lost: {seqs}")
        return out + self.notes


def check(directory: str | os.PathLike[str]) -> Report:
    """Everything wrong with a stopped server's data directory; nothing is written."""
    path = Path(directory)
    with _locked(path):
        salvage = Salvage(path)
        salvage.run(sink=None)
        return Report(path, salvage.problems, salvage.lost_ranges(), salvage.notes)


def repair(directory: str | os.PathLike[str], cluster_id: str | None = None) -> Report:
    """Rebuild the store from what is intact and move the old files aside (see the module docstring);
    an intact store is left as it is. `cluster_id` is needed only when the server record is lost with
    the message file."""
    path = Path(directory)
    with _locked(path):
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        staging = path / f".repair-{stamp}"
        staging.mkdir()
        salvage = Salvage(path)
        writer = _Writer(staging)
        try:
            salvage.run(sink=writer)  # one pass: what is intact goes to the new files as it is read
            intact = not (salvage.problems or salvage.lost_ranges())
            if not intact:
                writer.finish(salvage, cluster_id)
        except BaseException:
            writer.close()
            shutil.rmtree(staging, ignore_errors=True)
            raise
        writer.close()
        if intact:
            shutil.rmtree(staging)
            return Report(path, [], {}, ["the store is intact: nothing to repair"])
        aside = path / f"damaged-{stamp}"
        aside.mkdir()
        for name in ("msgs", "state"):
            if (path / name).exists():
                os.rename(path / name, aside / name)
        fsync_directory(aside)
        for name in ("msgs", "state"):
            os.rename(staging / name, path / name)
        os.rmdir(staging)
        fsync_directory(path)
        notes = [*salvage.notes, f"the old files are in {aside}"]
        return Report(path, salvage.problems, salvage.lost_ranges(), notes, aside)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    if not path.is_dir():
        raise StoreError(f"{path} is not a directory")
    lock = DirectoryLock(path)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


class _Writer:
    """The new message and state files, written in `staging` (then moved into place)."""

    def __init__(self, staging: Path) -> None:
        self.staging = staging
        self.msgs = Environment(staging / "msgs", MSGS_DBS, 64 << 20, 1 << 40)
        self.state = Environment(staging / "state", STATE_DBS, 16 << 20, 1 << 40, metasync=False)
        self._batch: list[tuple[bytes, bytes]] = []
        self._batch_bytes = 0

    def message(self, key: bytes, value: bytes) -> None:
        self._batch.append((key, value))
        self._batch_bytes += len(value)
        if self._batch_bytes >= _WRITE_BATCH_BYTES:
            self._flush()

    def _flush(self) -> None:
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if batch:
            db = self.msgs.dbs["messages"]
            self.msgs.write(lambda txn: txn.cursor(db=db).putmulti(batch, overwrite=False))

    def finish(self, salvage: Salvage, given_cluster_id: str | None) -> None:
        self._flush()
        meta = salvage.meta
        created = meta.get(b"created_unix_ns")
        cluster_id = meta.get(b"cluster_id") or (given_cluster_id.encode() if given_cluster_id else None)
        if cluster_id is None:
            raise StoreError(
                f"{salvage.msgs_data}: the server record is lost with the file: give the cluster ID to rebuild the "
                "store for (--cluster_id)"
            )
        if not salvage.channels and not meta:
            salvage.notes.append("every channel and message is lost with the message file")
        by_name: dict[str, ChannelInfo] = {}

        def write_msgs(txn: lmdb.Transaction) -> None:
            dbs = self.msgs.dbs
            txn.put(b"cluster_id", cluster_id, db=dbs["meta"])
            txn.put(b"created_unix_ns", created or U64.pack(0), db=dbs["meta"])
            txn.put(b"schema_version", U32.pack(SCHEMA_VERSION), db=dbs["meta"])
            txn.put(b"journal_key", secrets.token_bytes(16), db=dbs["meta"])
            txn.put(b"journal_keyed_from", U64.pack(0), db=dbs["meta"])
            highest = max(salvage.channels, default=0)
            stored_next = meta.get(b"next_channel_id")
            next_id = max(highest + 1, U32.unpack(stored_next)[0] if stored_next else 1)
            txn.put(b"next_channel_id", U32.pack(next_id), db=dbs["meta"])
            for cid, channel in salvage.channels.items():
                old = channel.info
                lost = merge_spans([*channel.lost_before, *channel.lost()])
                info = attrs.evolve(
                    old,
                    first_seq=channel.first_present(),
                    msgs=channel.count,
                    bytes=channel.size,
                    last_timestamp_unix_ns=max(old.last_timestamp_unix_ns, channel.last_ts),
                )
                by_name[info.name] = info
                txn.put(info.name.lower().encode(), encode_channel(info), db=dbs["channels"])
                kept = [(max(first, info.first_seq), last) for first, last in lost if last >= info.first_seq]
                if kept:
                    txn.put(lost_key(cid), encode_lost(kept), db=dbs["meta"])

        self.msgs.write(write_msgs)

        def write_state(txn: lmdb.Transaction) -> None:
            dbs = self.state.dbs
            txn.put(b"schema_version", U32.pack(SCHEMA_VERSION), db=dbs["meta"])
            next_sub = salvage.state_meta.get(b"next_sub_id")
            highest = max(salvage.subs, default=0)
            txn.put(
                b"next_sub_id", U64.pack(max(highest + 1, U64.unpack(next_sub)[0] if next_sub else 1)), db=dbs["meta"]
            )
            for sub_id, record in salvage.subs.items():
                channel = by_name.get(record.channel)
                if channel is None:
                    continue  # reported: its channel is gone
                key = U64.pack(sub_id)
                position = min(salvage.last_sent.get(sub_id, record.last_sent), channel.last_seq)
                txn.put(key, encode_record(attrs.evolve(record, last_sent=position)), db=dbs["subs"])
                txn.put(key, U64.pack(position), db=dbs["lastsent"])
                for seq, attempt in salvage.pending.get(sub_id, {}).items():
                    if seq <= channel.last_seq:
                        txn.put(PENDING_KEY.pack(sub_id, seq), U32.pack(attempt), db=dbs["pending"])
            for client in salvage.clients.values():
                txn.put(client.client_id.encode(), encode_record(client), db=dbs["clients"])

        self.state.write(write_state)
        self.state.sync()
        for name in JOURNAL_NAMES:
            fd = os.open(self.staging / "msgs" / name, os.O_RDWR | os.O_CREAT, 0o644)
            os.fsync(fd)
            os.close(fd)
        fsync_directory(self.staging / "msgs")
        fsync_directory(self.staging)
        salvage.notes.append(
            f"kept {sum(c.count for c in salvage.channels.values())} messages on {len(salvage.channels)} channels, "
            f"{len([s for s in salvage.subs.values() if s.channel in by_name])} subscriptions, "
            f"{len(salvage.clients)} clients"
        )

    def close(self) -> None:
        self.msgs.close()
        self.state.close()
