"""What only the LMDB store has: files, a lock, a memory map, checksums, a full disk."""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from storage import (
    ClusterIdMismatchError,
    DamagedStoreError,
    LmdbStore,
    NewMessage,
    SchemaVersionError,
    StoreFullError,
    StoreLockedError,
    StoreWriteError,
)
from storage.codec import MSG_KEY, U32
from storage.records import SaveSubscription, SetPendingRun, SubscriptionRecord
from storage.repair import check, repair
from tests.faults.sandbox import can_mount_private_tmpfs

ROOT = Path(__file__).resolve().parents[2]


def child(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "tests.storage.writer_child", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_another_cluster_id_is_refused_naming_both(tmp_path: Path) -> None:
    LmdbStore(tmp_path, "alpha").close()
    with pytest.raises(ClusterIdMismatchError) as err:
        LmdbStore(tmp_path, "beta")
    assert 'cluster ID "beta" does not match recovered value of "alpha"' in str(err.value)
    assert str(tmp_path) in str(err.value)
    LmdbStore(tmp_path, "alpha").close()  # the failed open released the lock


def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    LmdbStore(tmp_path).close()
    env = lmdb.open(str(tmp_path / "msgs"), max_dbs=4)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        txn.put(b"schema_version", U32.pack(99))
    env.close()
    with pytest.raises(SchemaVersionError, match="schema version 99, newer than the 3 this server supports"):
        LmdbStore(tmp_path)


def test_a_second_process_on_the_directory_fails_at_once(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path)
    store.ensure_channel("foo")
    store.append([NewMessage("foo", b"before")])
    code = "import sys; from storage import LmdbStore; LmdbStore(sys.argv[1])"
    started = time.monotonic()
    other = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert other.returncode != 0
    assert time.monotonic() - started < 30, "the second process must not wait for the lock"
    assert "StoreLockedError" in other.stderr
    assert f"data directory {tmp_path} is in use by another process (pid {os.getpid()})" in other.stderr
    store.append([NewMessage("foo", b"after")])  # the first is unaffected
    assert [m.data for m in store.read("foo", 1, 5)] == [b"before", b"after"]
    store.close()


def test_the_lock_is_exclusive_within_one_process_too(tmp_path: Path) -> None:
    with LmdbStore(tmp_path), pytest.raises(StoreLockedError):
        LmdbStore(tmp_path)


def test_the_map_grows_when_full(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path, map_size=64 * 1024)
    store.ensure_channel("a")
    for _ in range(20):
        store.append([NewMessage("a", b"x" * 4000) for _ in range(50)])
    store.checkpoint()  # LMDB is written by checkpoints; appends go to the journal
    stats = store.statistics()
    assert stats.messages_map_size_bytes > 64 * 1024
    assert stats.messages_used_bytes <= stats.messages_map_size_bytes
    info = store.channel_info("a")
    assert info is not None
    assert info.msgs == 1000
    assert len(store.read("a", 1, 2000)) == 1000


def test_reaching_the_maximum_map_size_fails_cleanly(tmp_path: Path) -> None:
    """Appends are journaled, so the maximum shows at the checkpoint that copies them into LMDB: it
    fails with a clear error, and every acknowledged message stays readable and survives a restart."""
    store = LmdbStore(tmp_path, map_size=256 * 1024, max_map_size=1024 * 1024)
    store.ensure_channel("a")
    for _ in range(60):
        store.append([NewMessage("a", b"x" * 30_000)])
    with pytest.raises(StoreFullError, match="maximum size of 1048576 bytes"):
        store.checkpoint()
    assert len(store.read("a", 1, 1000)) == 60
    store.append([NewMessage("a", b"after the failure")])  # the journal still takes publishes
    store.close()  # its checkpoint fails too, and is logged: the journal keeps everything
    with LmdbStore(tmp_path, map_size=256 * 1024) as again:  # a larger maximum (the default)
        assert [m.seq for m in again.read("a", 1, 1000)] == list(range(1, 62))
        again.checkpoint()
    with LmdbStore(tmp_path) as again:
        assert again.statistics().messages_map_size_bytes > 1024 * 1024
        assert len(again.read("a", 1, 1000)) == 61


def _store_with_markers(directory: Path) -> None:
    with LmdbStore(directory) as store:
        store.ensure_channel("c")
        store.append([NewMessage("c", b"MARKER-%04d-" % i * 8) for i in range(1, 21)])


def _flip_marker(directory: Path, marker: bytes) -> Path:
    """A copy of the store with one byte flipped inside the payload that starts with `marker`."""
    copy = directory.parent / "copy"
    shutil.copytree(directory, copy)
    data_file = copy / "msgs" / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    at = raw.find(marker)
    assert at > 0
    raw[at + 3] ^= 0xFF
    data_file.write_bytes(bytes(raw))
    (copy / "LOCK").unlink()
    return copy


def test_a_corrupt_value_is_refused_at_open_naming_the_message(tmp_path: Path) -> None:
    _store_with_markers(tmp_path / "orig")
    copy = _flip_marker(tmp_path / "orig", b"MARKER-0007-")
    with pytest.raises(DamagedStoreError) as err:
        LmdbStore(copy)
    assert str(copy / "msgs" / "data.mdb") in str(err.value)
    assert "channel 'c': 1 message fails its checksum: 7" in str(err.value)


def test_a_corrupt_value_found_on_read_is_skipped_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With the quick check at open, damage inside a channel is found when it is read: that message
    is left out (and logged, and counted), every other one is still read."""
    _store_with_markers(tmp_path / "orig")
    copy = _flip_marker(tmp_path / "orig", b"MARKER-0007-")
    with LmdbStore(copy, verify="quick") as store, caplog.at_level(logging.ERROR):
        assert store.get("c", 7) is None
        assert [m.seq for m in store.read("c", 1, 20)] == [*range(1, 7), *range(8, 21)]
        assert [m.seq for m in store.read("c", 7, 3)] == [8, 9, 10]  # past it, as many as asked
        assert [m.seq if m else None for m in store.get_many("c", [6, 7, 8])] == [6, None, 8]
        good = store.get("c", 6)
        assert good is not None
        assert good.data == b"MARKER-0006-" * 8
        assert store.statistics().damaged_messages == 1
    assert caplog.text.count("'c' message 7: stored value is corrupt (checksum mismatch)") == 1  # logged once
    assert str(copy / "msgs" / "data.mdb") in caplog.text


def test_the_quick_check_finds_a_damaged_last_message(tmp_path: Path) -> None:
    _store_with_markers(tmp_path / "orig")
    copy = _flip_marker(tmp_path / "orig", b"MARKER-0020-")
    with pytest.raises(DamagedStoreError, match="channel 'c': 1 message fails its checksum: 20"):
        LmdbStore(copy, verify="quick")


def test_a_damaged_file_is_refused_at_open(tmp_path: Path) -> None:
    _store_with_markers(tmp_path)
    data_file = tmp_path / "msgs" / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    page = 4096
    for offset in range(0, 2 * page, 7):  # both meta pages
        raw[offset] ^= 0x5A
    data_file.write_bytes(bytes(raw))
    with pytest.raises(
        DamagedStoreError, match=r"data\.mdb is not an LMDB data file, or its first meta page is damaged"
    ):
        LmdbStore(tmp_path)


@pytest.mark.skipif(not can_mount_private_tmpfs(), reason="no private mount namespace (unshare -rm) on this machine")
def test_a_full_disk_fails_the_append_and_loses_nothing(tmp_path: Path) -> None:
    """A real ENOSPC: a 4 MiB tmpfs mounted in a private mount namespace for the child alone."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    script = f'mount -t tmpfs -o size=4m tmpfs "{mount_point}" && exec "$@"'
    result = child("fill", str(mount_point), prefix=("unshare", "-rm", "sh", "-c", script, "sh"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["error_type"] == "StoreFullError"
    assert "disk full" in report["error"]
    assert "everything committed before is intact" in report["error"]
    assert report["committed"] > 10
    assert report["readable_before_reopen"] == report["committed"]
    assert report["second_append"] == "StoreFullError"
    assert report["intact_after_reopen"] == report["committed"]
    assert report["last_seq_after_reopen"] == report["committed"]


def _limit_file_size() -> Callable[[], None]:
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3 * 1024 * 1024, resource.RLIM_INFINITY))

    return limit


def test_a_failed_write_is_clear_and_writing_resumes_when_space_returns(tmp_path: Path) -> None:
    """The same failure through a file-size limit, which needs no privileges, then space comes back."""
    code = f"""
import resource, signal
from storage import LmdbStore, NewMessage, StoreWriteError
store = LmdbStore({str(tmp_path)!r}, map_size=1 << 20)
store.ensure_channel("a")
n = 0
try:
    while True:
        store.append([NewMessage("a", bytes(100_000))])
        n += 1
except StoreWriteError as exc:
    print(type(exc).__name__, "|", exc)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
store.append([NewMessage("a", b"after")])
print(n, store.channel_info("a").last_seq, len(store.read("a", 1, 10**6)))
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_file_size(),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    error_line, counts = result.stdout.strip().splitlines()
    assert error_line.startswith(("StoreWriteError |", "StoreFullError |"))
    assert "the write failed" in error_line
    assert "everything committed before is intact" in error_line
    committed, last_seq, readable = map(int, counts.split())
    assert committed > 0
    assert last_seq == committed + 1 == readable
    with LmdbStore(tmp_path) as store:
        assert [m.seq for m in store.read("a", 1, 10**6)] == list(range(1, committed + 2))


def test_store_write_errors_are_store_errors() -> None:
    assert issubclass(StoreFullError, StoreWriteError)


def test_reads_run_beside_appends_that_grow_the_map(tmp_path: Path) -> None:
    """The server reads (deliveries) on one thread while checkpoints copy appends into LMDB and grow its
    map on another."""
    store = LmdbStore(tmp_path, map_size=64 * 1024, checkpoint_bytes=64 * 1024)
    store.ensure_channel("a")
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                info = store.channel_info("a")
                assert info is not None
                got = store.read("a", 1, 10**6)
                assert [m.seq for m in got[: info.last_seq]] == list(range(1, info.last_seq + 1))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(60):
            store.append([NewMessage("a", b"x" * 2000) for _ in range(20)])
    finally:
        done.set()
        thread.join()
    assert errors == []
    assert store.statistics().messages_map_size_bytes >= 2 * 1024 * 1024
    store.close()


def test_concurrent_creation_of_one_channel_makes_one_channel(tmp_path: Path) -> None:
    with LmdbStore(tmp_path) as store:
        barrier = threading.Barrier(4)
        made: list[int] = []

        def create() -> None:
            barrier.wait()
            made.append(store.ensure_channel("new").channel_id)

        threads = [threading.Thread(target=create) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(made)) == 1
        assert [c.name for c in store.channels()] == ["new"]


def test_a_pending_entry_of_a_length_no_writer_makes_is_refused_as_damage(tmp_path: Path) -> None:
    """A pending value is 4 bytes (the attempt count) or 12 (a nak's wait too): anything else is damage,
    never read as some attempt count."""
    from storage import SaveSubscription, SetPending, SubscriptionRecord
    from storage.codec import PENDING_KEY

    record = SubscriptionRecord(1, "c", "me", "_INBOX.a", "_INBOX.ack", ack_wait_ms=30_000, max_inflight=8)
    with LmdbStore(tmp_path) as store:
        store.ensure_channel("c")
        store.apply([SaveSubscription(record), SetPending(1, 1, 2, not_before_ns=7)])
    env = lmdb.open(str(tmp_path / "state"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(PENDING_KEY.pack(1, 2), b"\x00\x00\x01", db=env.open_db(b"pending", txn=txn))
    env.close()
    with LmdbStore(tmp_path) as store, pytest.raises(DamagedStoreError, match="pending entry 1/2: value of 3 bytes"):
        store.recover()
    from storage.repair import check, repair

    assert any("pending entry of message 2 is damaged (3 bytes)" in p for p in check(tmp_path).problems)
    repair(tmp_path)
    with LmdbStore(tmp_path) as store:
        (sub,) = store.recover().subscriptions
        assert dict(sub.pending) == {1: 2, 2: 1}, "both still unacknowledged: sent again, nothing lost"


@pytest.mark.parametrize(
    ("db", "key", "value", "refused", "reported"),
    [
        ("pending", b"\x00" * 15, b"\x00\x00\x00\x01", "pending entry with a key of 15 bytes", "pending entry's key"),
        ("lastsent", b"\x00" * 7, b"\x00" * 8, "position record of 7/8 bytes", "position record is damaged (7/8"),
        ("lastsent", b"\x00" * 8, b"\x00" * 3, "position record of 8/3 bytes", "position record is damaged (8/3"),
    ],
    ids=["pending key", "position key", "position value"],
)
def test_a_state_key_of_a_length_no_writer_makes_is_refused_and_repaired(
    tmp_path: Path, db: str, key: bytes, value: bytes, refused: str, reported: str
) -> None:
    """A pending entry's key is 16 bytes and a position record 8 and 8: anything else is damage, refused
    by name at start (not a crash of the decoding), reported by `check`, and left out by `repair`."""
    from storage import SaveSubscription, SetPending, SubscriptionRecord
    from storage.repair import check, repair

    record = SubscriptionRecord(1, "c", "me", "_INBOX.a", "_INBOX.ack", ack_wait_ms=30_000, max_inflight=8)
    with LmdbStore(tmp_path) as store:
        store.ensure_channel("c")
        store.append([NewMessage("c", b"m%d" % i) for i in range(3)])
        store.apply([SaveSubscription(record), SetPending(1, 1, 2), SetPending(1, 2, 1)])
    env = lmdb.open(str(tmp_path / "state"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(key, value, db=env.open_db(db.encode(), txn=txn))
    env.close()
    with LmdbStore(tmp_path) as store, pytest.raises(DamagedStoreError, match=refused):
        store.recover()
    assert any(reported in p for p in check(tmp_path).problems)
    repair(tmp_path)
    with LmdbStore(tmp_path) as store:
        (sub,) = store.recover().subscriptions
    assert dict(sub.pending) == {1: 2, 2: 1}


def test_a_read_skips_a_gap_and_stops_at_its_channels_end(tmp_path: Path) -> None:
    """A message missing from LMDB (as a repair leaves it) is skipped, and a read that crosses the gap
    takes none of the next channel's messages, which follow it in the file."""
    with LmdbStore(tmp_path) as store:
        for channel in ("a", "b"):
            store.ensure_channel(channel)
            store.append([NewMessage(channel, f"{channel}{i}".encode()) for i in range(1, 11)])
    env = lmdb.open(str(tmp_path / "msgs"), max_dbs=4)
    with env.begin(write=True, db=env.open_db(b"messages")) as txn:
        cursor = txn.cursor()
        assert cursor.first()
        channel_id = MSG_KEY.unpack(cursor.key())[0]  # channel "a": the first key of the file
        assert txn.delete(MSG_KEY.pack(channel_id, 5))
    env.close()
    with LmdbStore(tmp_path, verify="quick") as store:
        read = store.read("a", 1, 100)
        assert [m.seq for m in read] == [1, 2, 3, 4, 6, 7, 8, 9, 10]
        assert [m.data for m in read] == [f"a{i}".encode() for i in (1, 2, 3, 4, 6, 7, 8, 9, 10)]
        assert [m.seq for m in store.read("a", 3, 3)] == [3, 4, 6]
        assert [m.seq for m in store.read("a", 4, 7)] == [4, 6, 7, 8, 9, 10]
        assert [m.data for m in store.read("b", 1, 100)] == [f"b{i}".encode() for i in range(1, 11)]


def test_a_damaged_database_name_is_refused_not_made_anew(tmp_path: Path) -> None:
    """A flipped bit in a database's name ("pendinf") leaves every page sound, and LMDB would open the
    store with that database made anew, empty: its entries (here the unacknowledged messages) silently
    gone.
    The open refuses it by name; `check` says so and reads the file page by page; `repair` keeps the
    entries."""
    with LmdbStore(tmp_path) as store:
        store.ensure_channel("c")
        store.append([NewMessage("c", b"m%d" % i) for i in range(10)])
        record = SubscriptionRecord(1, "c", "me", "_INBOX.a", "_INBOX.ack", ack_wait_ms=30_000, max_inflight=1024)
        store.apply([SaveSubscription(record), SetPendingRun(1, [3, 4, 5])])
    data = tmp_path / "state" / "data.mdb"
    raw = bytearray(data.read_bytes())
    assert raw.count(b"pending") >= 1
    raw = bytearray(raw.replace(b"pending", b"pendinf"))  # every copy (freed pages keep old ones)
    data.write_bytes(bytes(raw))
    with pytest.raises(DamagedStoreError, match=r"state/data\.mdb is damaged: it holds a database named b'pendinf'"):
        LmdbStore(tmp_path)
    report = check(tmp_path)
    assert any("LMDB cannot read it" in p and "read page by page" in p for p in report.problems), report.problems
    repair(tmp_path, None)
    with LmdbStore(tmp_path) as store:
        (recovered,) = store.recover().subscriptions
        assert dict(recovered.pending) == {3: 1, 4: 1, 5: 1}
