"""The publish journal on real files: what recovery replays after a torn write, after a file is reused
under a new epoch, and after a checkpoint that failed; and the LMDB store around it."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import lmdb
import pytest

from storage import SCHEMA_VERSION, ChannelLimits, LmdbStore, NewMessage, StoreLimits, StoreWriteError
from storage.codec import U32
from storage.journal import NAMES, Journal


def _journal(tmp_path: Path, sync: bool = True) -> Journal:
    return Journal(tmp_path, sync=sync)


def test_records_come_back_in_order_and_a_torn_last_one_is_dropped(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.recover(0)
    for i in range(5):
        journal.append(b"record %d " % i * (i + 1))
    end = journal.active_bytes
    journal.close()
    path = tmp_path / NAMES[0]
    raw = bytearray(path.read_bytes())
    raw[end - 3] ^= 0xFF  # the last record's body, as a crash in the middle of its write leaves it
    path.write_bytes(bytes(raw))
    again = _journal(tmp_path)
    assert again.recover(0) == [b"record %d " % i * (i + 1) for i in range(4)]
    again.close()


def test_a_reused_file_does_not_replay_what_an_earlier_epoch_left_behind(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.recover(0)
    for i in range(10):
        journal.append(b"old %d" % i)
    first = journal.switch()  # a checkpoint copies file 0 ...
    journal.append(b"middle")
    second = journal.switch()  # ... and file 1; file 0 is written again from its start
    journal.append(b"new")
    journal.close()
    assert second == first + 1
    # Only file 0's first epoch was checkpointed; its stale records behind "new" are not replayed.
    again = _journal(tmp_path)
    assert again.recover(first) == [b"middle", b"new"]
    assert again.epoch > second + 1
    again.close()
    # With both checkpointed, only the newest epoch is left.
    again = _journal(tmp_path)
    assert again.recover(second) == [b"new"]
    again.close()


def test_a_killed_process_loses_nothing_the_journal_took(tmp_path: Path) -> None:
    """The store's files copied while it is open are what SIGKILL leaves (the page cache has them)."""
    store = LmdbStore(tmp_path / "live", checkpoint_bytes=1 << 30, checkpoint_interval=3600)
    store.ensure_channel("a")
    store.append([NewMessage("a", b"one"), NewMessage("a", b"two")])
    store.checkpoint()
    store.append([NewMessage("a", b"three", reply="_INBOX.r")])  # only in the journal
    shutil.copytree(tmp_path / "live", tmp_path / "crashed", ignore=shutil.ignore_patterns("LOCK"))
    store.close()
    with LmdbStore(tmp_path / "crashed") as recovered:
        got = recovered.read("a", 1, 10)
        assert [(m.seq, m.data, m.reply) for m in got] == [(1, b"one", ""), (2, b"two", ""), (3, b"three", "_INBOX.r")]
        info = recovered.channel_info("a")
        assert info is not None
        assert (info.msgs, info.last_seq) == (3, 3)
        assert got[2].timestamp_unix_ns >= got[1].timestamp_unix_ns
    # The replay was checkpointed: the journal is empty and LMDB has all three.
    env = lmdb.open(str(tmp_path / "crashed" / "msgs"), max_dbs=4, readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.stat(env.open_db(b"messages", txn=txn))["entries"] == 3
    env.close()


def test_a_failed_checkpoint_keeps_everything_and_the_next_one_copies_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = LmdbStore(tmp_path, map_size=64 * 1024, max_map_size=256 * 1024, checkpoint_interval=3600)
    store.ensure_channel("a")
    for _ in range(12):
        store.append([NewMessage("a", b"x" * 30_000)])
    with pytest.raises(Exception, match="maximum size"):
        store.checkpoint()
    store.append([NewMessage("a", b"after")])
    assert [m.seq for m in store.read("a", 1, 100)] == list(range(1, 14))
    with caplog.at_level(logging.ERROR):
        store.close()  # the last checkpoint fails as well: logged, and the journal keeps it all
    assert "checkpoint failed" in caplog.text
    with LmdbStore(tmp_path) as again:  # the default maximum: the replay fits
        assert [m.data[:5] for m in again.read("a", 1, 100)][-2:] == [b"xxxxx", b"after"]
        again.checkpoint()
    with LmdbStore(tmp_path) as again:
        assert again.channel_info("a") is not None
        assert len(again.read("a", 1, 100)) == 13


def test_limits_evict_across_the_journal_and_lmdb(tmp_path: Path) -> None:
    limits = StoreLimits(channel=ChannelLimits(max_msgs=5))
    store = LmdbStore(tmp_path, limits=limits, checkpoint_interval=3600)
    store.ensure_channel("a")
    store.append([NewMessage("a", b"%d" % i) for i in range(1, 4)])
    store.checkpoint()  # 1..3 in LMDB
    result = store.append([NewMessage("a", b"%d" % i) for i in range(4, 8)])  # 4..7 in the journal
    assert result.dropped == {"a": range(1, 3)}
    assert store.get("a", 2) is None
    assert [m.data for m in store.read("a", 1, 10)] == [b"3", b"4", b"5", b"6", b"7"]
    store.checkpoint()
    store.close()
    with LmdbStore(tmp_path, limits=limits) as again:
        assert [m.data for m in again.read("a", 1, 10)] == [b"3", b"4", b"5", b"6", b"7"]
        info = again.channel_info("a")
        assert info is not None
        assert (info.first_seq, info.msgs) == (3, 5)


def _schema_version(directory: Path) -> int:
    env = lmdb.open(str(directory / "msgs"), max_dbs=4, readonly=True, lock=False)
    with env.begin() as txn:
        stored = txn.get(b"schema_version", db=env.open_db(b"meta", txn=txn))
    env.close()
    assert stored is not None
    return int(U32.unpack(stored)[0])


def test_a_version_1_store_is_marked_version_2_before_its_journal_holds_anything(tmp_path: Path) -> None:
    LmdbStore(tmp_path).close()
    env = lmdb.open(str(tmp_path / "msgs"), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"schema_version", U32.pack(1), db=env.open_db(b"meta", txn=txn))
    env.close()
    with LmdbStore(tmp_path) as store:
        store.ensure_channel("a")
    assert _schema_version(tmp_path) == 1  # opening (and making a channel) writes no version
    with LmdbStore(tmp_path) as store:
        store.append([NewMessage("a", b"x")])
    assert _schema_version(tmp_path) == SCHEMA_VERSION == 2


def test_a_failed_flush_is_a_store_error(tmp_path: Path) -> None:
    """The server's periodic flush (`file_sync = false`) logs store errors and carries on: an OSError
    from fdatasync must reach it as one, not end the task."""
    journal = _journal(tmp_path, sync=False)
    journal.recover(0)
    journal.append(b"record")
    active = journal.files[journal.active]
    os.close(active.fd)  # EBADF, as a stand-in for EIO
    with pytest.raises(StoreWriteError, match="the write failed"):
        journal.flush()
    active.fd = -1  # already closed
    journal.close()
