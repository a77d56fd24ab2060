"""The publish journal on real files: what recovery replays after a torn write, after a file is reused
under a new epoch, and after a checkpoint that failed; and the LMDB store around it."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import struct
from pathlib import Path

import lmdb
import pytest

from storage import (
    SCHEMA_VERSION,
    ChannelLimits,
    DamagedStoreError,
    LmdbStore,
    NewMessage,
    StoreLimits,
    StoreWriteError,
)
from storage.codec import U32
from storage.journal import NAMES, Journal, Recovery, keyed

KEY = b"k" * 16


def _journal(tmp_path: Path, sync: bool = True, key: bytes = KEY) -> Journal:
    return Journal(tmp_path, sync=sync, seed=keyed(key))


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
    assert again.recover(0) == Recovery([b"record %d " % i * (i + 1) for i in range(4)], None)
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
    # Only file 0's first epoch was checkpointed; its stale records behind "new" are not replayed,
    # and file 1 is not active: it waits for a checkpoint to retire it.
    again = _journal(tmp_path)
    assert again.recover(first) == Recovery([b"middle", b"new"], second)
    again.close()
    # With both checkpointed, only the newest epoch is left.
    again = _journal(tmp_path)
    assert again.recover(second) == Recovery([b"new"], None)
    again.close()


def test_recovery_never_writes_over_records_it_has_not_seen_checkpointed(tmp_path: Path) -> None:
    """After a restart whose checkpoint fails (a full disk), appends go on after the last record of the
    newest file; the other file, if it holds records too, is not written until a checkpoint retires it."""
    journal = _journal(tmp_path)
    journal.recover(0)
    journal.append(b"a1")
    older = journal.switch()  # its checkpoint never lands
    journal.append(b"b1")
    journal.close()
    again = _journal(tmp_path)
    recovery = again.recover(0)
    assert recovery == Recovery([b"a1", b"b1"], older)
    again.append(b"b2")  # a publish after the restart, before any checkpoint
    again.close()
    third = _journal(tmp_path)
    assert third.recover(0) == Recovery([b"a1", b"b1", b"b2"], older)
    # A checkpoint that lands retires the older file (no switch: the active one still has records)...
    assert third.recover(older).bodies == [b"b1", b"b2"]
    third.close()


def test_a_damaged_record_with_intact_ones_after_it_is_refused_naming_the_file(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.recover(0)
    offsets = []
    for i in range(6):
        offsets.append(journal.active_bytes)
        journal.append(b"record %d " % i * 50)
    journal.close()
    path = tmp_path / NAMES[0]
    raw = bytearray(path.read_bytes())
    raw[offsets[2] + 40] ^= 0x01  # one bit in the middle record
    path.write_bytes(bytes(raw))
    with pytest.raises(DamagedStoreError) as err:
        _journal(tmp_path).recover(0)
    assert f"{path}: the record at offset {offsets[2]} is damaged" in str(err.value)
    assert f"written after it lies at offset {offsets[3]}" in str(err.value)


@pytest.mark.parametrize("where", ["header", "first"])
def test_damage_that_hides_a_record_boundary_is_found_too(tmp_path: Path, where: str) -> None:
    """A length turned to zeros (a lying disk returns zeroed blocks) or a damaged first record: the
    boundary of the next record is lost, and the intact records further on are still found."""
    journal = _journal(tmp_path)
    journal.recover(0)
    for i in range(4):
        journal.append(b"x%d" % i * 1000)
    journal.close()
    path = tmp_path / NAMES[0]
    raw = bytearray(path.read_bytes())
    at = 0 if where == "first" else 16 + 2000 + 2
    raw[at : at + 8] = bytes(8)
    path.write_bytes(bytes(raw))
    with pytest.raises(DamagedStoreError, match="is damaged"):
        _journal(tmp_path).recover(0)


def test_a_payload_cannot_pass_for_a_record(tmp_path: Path) -> None:
    """A client chooses payloads, and payloads lie in journal files, past the newest record of a reused
    file too. A record forged inside a payload, for an epoch the reader would accept, is not one: the
    checksum is keyed by the store. The same bytes made with the store's key are (the control)."""
    journal = _journal(tmp_path)
    journal.recover(0)
    journal.append(b"real")
    end = journal.active_bytes
    epoch = journal.epoch
    journal.close()

    def forged(key: bytes) -> bytes:
        other = tmp_path / "forge"
        other.mkdir(exist_ok=True)
        forger = Journal(other, sync=False, seed=keyed(key))
        forger.recover(0)
        forger.files[0].epoch = epoch
        forger.append(b"FORGED MESSAGE")
        forger.close()
        record = (other / NAMES[0]).read_bytes()[: 16 + 14]
        shutil.rmtree(other)
        return record

    path = tmp_path / NAMES[0]
    raw = bytearray(path.read_bytes())
    torn = b"\x00\x00\x10\x00" + b"garbage!" * 4  # a torn record whose payload carries the forgery
    raw[end : end + len(torn) + 30] = torn + forged(b"guessed key 1234")
    path.write_bytes(bytes(raw))
    assert _journal(tmp_path).recover(0) == Recovery([b"real"], None)  # the tear is dropped; nothing else

    raw[end + len(torn) : end + len(torn) + 30] = forged(KEY)
    path.write_bytes(bytes(raw))
    with pytest.raises(DamagedStoreError):
        _journal(tmp_path).recover(0)


def test_nothing_after_the_close_marker_is_read(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.recover(0)
    journal.append(b"before")
    journal.mark_closed()
    scan = journal.files[0].scan(0, journal.seed)
    assert (scan.bodies, scan.closed) == ([b"before"], True)
    journal.append(b"after a reopen")  # takes the marker's place
    journal.close()
    assert _journal(tmp_path).recover(0).bodies == [b"before", b"after a reopen"]


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


def _meta(directory: Path, key: bytes) -> bytes | None:
    env = lmdb.open(str(directory / "msgs"), max_dbs=4, readonly=True, lock=False)
    with env.begin() as txn:
        stored = txn.get(key, db=env.open_db(b"meta", txn=txn))
    env.close()
    return None if stored is None else bytes(stored)


def _schema_version(directory: Path) -> int:
    stored = _meta(directory, b"schema_version")
    assert stored is not None
    return int(U32.unpack(stored)[0])


@pytest.mark.parametrize("old_version", [1, 2])
def test_an_older_store_is_upgraded_before_its_journal_takes_a_keyed_record(tmp_path: Path, old_version: int) -> None:
    data = tmp_path / "data"
    LmdbStore(data).close()
    env = lmdb.open(str(data / "msgs"), max_dbs=4)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        txn.put(b"schema_version", U32.pack(old_version), db=meta)
        txn.delete(b"journal_key", db=meta)
        txn.delete(b"journal_keyed_from", db=meta)
    env.close()
    with LmdbStore(data) as store:
        store.ensure_channel("a")
    assert _schema_version(data) == old_version  # opening (and making a channel) writes no version
    assert _meta(data, b"journal_key") is None
    crashed = tmp_path / "crashed"
    with LmdbStore(data, checkpoint_interval=3600) as store:
        store.append([NewMessage("a", b"x")])
        shutil.copytree(data, crashed, ignore=shutil.ignore_patterns("LOCK"))
    assert _schema_version(crashed) == SCHEMA_VERSION == 3
    assert _meta(crashed, b"journal_key") is not None
    with LmdbStore(crashed) as store:  # the keyed record is replayed
        assert [m.data for m in store.read("a", 1, 10)] == [b"x"]


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


_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_FLAG_SYNC = 0x1
_FIEMAP_EXTENT_UNWRITTEN = 0x800
_EXTENT = struct.Struct("=QQQ16xI12x")  # logical, physical, length, flags


def _unwritten(path: Path) -> list[tuple[int, int]]:
    """The (offset, length) stretches of `path` that the filesystem allocated but holds no data for
    (FIEMAP's unwritten extents); skips the test where the filesystem cannot say."""
    count = 256
    request = bytearray(
        struct.pack("=QQIIII", 0, 2**64 - 1, _FIEMAP_FLAG_SYNC, 0, count, 0) + bytes(_EXTENT.size * count)
    )
    with path.open("rb") as f:
        try:
            fcntl.ioctl(f.fileno(), _FS_IOC_FIEMAP, request)
        except OSError as exc:
            pytest.skip(f"the filesystem does not map extents ({exc})")
    mapped = struct.unpack_from("=I", request, 20)[0]
    extents = [_EXTENT.unpack_from(request, 32 + i * _EXTENT.size) for i in range(mapped)]
    return [(logical, length) for logical, _, length, flags in extents if flags & _FIEMAP_EXTENT_UNWRITTEN]


def test_a_retired_file_is_prefilled_with_written_space_for_its_next_use(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.recover(0)
    journal.append(b"a" * 100)  # the first record preallocates the file: space with no data yet
    retired = journal.files[0]
    if not _unwritten(retired.path):
        pytest.skip("this filesystem writes preallocated space at once")
    journal.switch()
    journal.append(b"b" * 100)
    record_end = retired.end
    assert journal.prefill_inactive(2 << 20) == (2 << 20) - record_end
    assert _unwritten(retired.path) == [], "a commit into the prefilled file would still convert extents"
    data = retired.path.read_bytes()
    assert len(data) == 2 << 20 and data[record_end:] == bytes(len(data) - record_end)
    assert journal.prefill_inactive(2 << 20) == 0  # once is enough
    journal.close()
    again = _journal(tmp_path)
    assert again.recover(0) == Recovery([b"a" * 100, b"b" * 100], journal.files[0].epoch)
    again.close()


def test_a_prefill_writes_over_nothing_this_process_did_not_allocate(tmp_path: Path) -> None:
    """Past a file's newest records may lie older ones, a second copy of checkpointed messages that
    repair reads: after a restart nothing of the file is overwritten, it is only extended."""
    journal = _journal(tmp_path)
    journal.recover(0)
    for i in range(20):
        journal.append(b"old %d" % i)
    first = journal.switch()
    journal.append(b"middle")
    journal.switch()
    journal.append(b"new")  # file 0 again, from its start: "old" records lie behind it
    journal.close()
    again = _journal(tmp_path)
    again.recover(first)
    assert again.active == 0  # file 0 holds the newest epoch; file 1 is the inactive one
    inactive = again.files[1]
    before = inactive.path.read_bytes()
    assert again.prefill_inactive(len(before)) == 0
    assert again.prefill_inactive(len(before) + 4096) == 4096
    after = inactive.path.read_bytes()
    assert after[: len(before)] == before and after[len(before) :] == bytes(4096)
    again.close()


def test_a_store_prefills_the_retired_journal_file_at_each_checkpoint(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "store", checkpoint_bytes=1 << 30, checkpoint_interval=3600)
    store.ensure_channel("c")
    files = [tmp_path / "store" / "msgs" / name for name in NAMES]
    store.append([NewMessage("c", b"x" * 1000) for _ in range(100)])
    store.checkpoint()  # file 0 retired, file 1 takes appends
    store.append([NewMessage("c", b"y" * 1000) for _ in range(10)])
    if not _unwritten(files[1]):
        pytest.skip("this filesystem writes preallocated space at once")
    store.checkpoint()  # file 1 retired, file 0 takes appends again
    assert _unwritten(files[0]) == _unwritten(files[1]) == []
    assert files[1].stat().st_size >= files[0].stat().st_size
    store.append([NewMessage("c", b"z" * 1000) for _ in range(10)])
    store.close()
    with LmdbStore(tmp_path / "store") as again:
        info = again.channel_info("c")
        assert info is not None and info.msgs == 120
        assert [m.data[:1] for m in again.read("c", 100, 3)] == [b"x", b"y", b"y"]
