"""`verify = "background"`: the LMDB store opens with the quick check, and the full check (every page
of the message file, every message's checksum) runs in a process of its own while the store serves,
with checkpoints going on; until it has passed, nothing past a damaged message is read."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import storage.full_check
from storage import ChannelLimits, LmdbStore, NewMessage, StoreLimits
from tests.storage.test_lmdb_store import _flip_marker, _store_with_markers


@pytest.mark.parametrize("in_process_bytes", [0, storage.full_check.IN_PROCESS_BYTES])
def test_the_full_check_finds_a_damaged_message_the_quick_open_let_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_process_bytes: int
) -> None:
    """In a process of its own (a large file), or in the store's (this small one)."""
    monkeypatch.setattr(storage.full_check, "IN_PROCESS_BYTES", in_process_bytes)
    _store_with_markers(tmp_path / "orig")
    copy = _flip_marker(tmp_path / "orig", b"MARKER-0007-")
    with LmdbStore(copy, verify="background") as store:
        assert store.unchecked
        found = store.check_fully()
        assert found is not None
        assert found.startswith(f"{copy / 'msgs' / 'data.mdb'}: ")
        assert "channel 'c': 1 message fails its checksum: 7" in found
        assert store.unchecked, "a check that found damage is not passed"


def test_an_intact_store_passes_and_then_reads_as_with_the_quick_check(tmp_path: Path) -> None:
    _store_with_markers(tmp_path / "orig")
    with LmdbStore(tmp_path / "orig", verify="background") as store:
        assert store.check_fully() is None
        assert not store.unchecked
        assert store.check_fully() is None  # owed once
        assert [m.seq for m in store.read("c", 1, 100)] == list(range(1, 21))


def test_a_read_stops_before_damage_while_the_check_is_owed_and_ends_the_check(tmp_path: Path) -> None:
    _store_with_markers(tmp_path / "orig")
    copy = _flip_marker(tmp_path / "orig", b"MARKER-0007-")
    with LmdbStore(copy, verify="background") as store:
        assert [m.seq for m in store.read("c", 1, 20)] == [1, 2, 3, 4, 5, 6]
        assert store.read("c", 7, 5) == [], "nothing past the damaged message"
        assert [m.seq if m else None for m in store.get_many("c", [6, 7])] == [6, None]
        started = time.monotonic()
        found = store.check_fully()
        assert found is not None and "'c' message 7: stored value is corrupt" in found
        assert "found by a read before the full check ended" in found
        assert time.monotonic() - started < 1.0, "the read's damage ends the check at once"


def test_the_check_reads_one_committed_state_while_checkpoints_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No false alarm from pages the store rewrites meanwhile: appends to many channels with a
    checkpoint every 10 ms, and retention limits deleting old messages, all through the check."""
    monkeypatch.setattr(storage.full_check, "IN_PROCESS_BYTES", 0)  # in its own process, whatever the size
    limits = StoreLimits(channel=ChannelLimits(max_msgs=6_000))
    with LmdbStore(tmp_path, limits=limits) as store:
        for c in range(20):
            store.ensure_channel(f"c{c}")
            store.append([NewMessage(f"c{c}", b"%06d" % i * 20) for i in range(5_000)])
    store = LmdbStore(
        tmp_path, limits=limits, checkpoint_interval=0.01, checkpoint_bytes=64 * 1024, verify="background"
    )
    stop = threading.Event()
    appended = 0

    def write() -> None:
        nonlocal appended
        while not stop.is_set():
            channel = f"c{appended // 200 % 20}"
            store.append([NewMessage(channel, b"y" * 120) for _ in range(200)])
            appended += 200

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert store.check_fully() is None
    finally:
        stop.set()
        writer.join()
        store.close()
    assert appended > 2_000, "the store was written all through the check"


def test_closing_the_store_stops_a_running_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage.full_check, "IN_PROCESS_BYTES", 0)  # in its own process, whatever the size
    with LmdbStore(tmp_path) as store:
        store.ensure_channel("c")
        store.append([NewMessage("c", b"z" * 100) for _ in range(50_000)])
    store = LmdbStore(tmp_path, verify="background")
    result: list[str | None] = []
    checking = threading.Thread(target=lambda: result.append(store.check_fully()))
    checking.start()
    time.sleep(0.2)
    store.close()
    checking.join(timeout=10)
    assert not checking.is_alive()
    assert result == [None]


def test_the_check_process_runs_nicer_than_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a machine whose cores are busy serving, the check waits for them."""
    monkeypatch.setattr(storage.full_check, "IN_PROCESS_BYTES", 0)
    with LmdbStore(tmp_path) as store:
        store.ensure_channel("c")
        store.append([NewMessage("c", b"z" * 100) for _ in range(50_000)])
    ours = psutil.Process().nice()
    seen: list[int] = []
    with LmdbStore(tmp_path, verify="background") as store:
        checking = threading.Thread(target=store.check_fully)
        checking.start()
        deadline = time.monotonic() + 10
        while checking.is_alive() and not seen and time.monotonic() < deadline:
            for child in psutil.Process().children():
                with contextlib.suppress(psutil.Error):
                    if "storage.full_check" in child.cmdline() and child.nice() != ours:
                        seen.append(child.nice())
            time.sleep(0.001)
        checking.join()
    assert seen == [min(ours + storage.full_check.NICER_BY, 19)]


def test_a_check_process_that_gives_no_answer_is_no_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """It could not start (or was killed): the store checks here instead, and finds what it would."""
    monkeypatch.setattr(storage.full_check, "IN_PROCESS_BYTES", 0)  # a process even for this small file
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the check's process cannot start
    _store_with_markers(tmp_path / "orig")
    with LmdbStore(tmp_path / "orig", verify="background") as store:
        assert store.check_fully() is None, "not taken for damage"
    assert "the full check's process ended with status 1" in caplog.text
    copy = _flip_marker(tmp_path / "orig", b"MARKER-0007-")
    with LmdbStore(copy, verify="background") as store:
        found = store.check_fully()
    assert found is not None and "channel 'c': 1 message fails its checksum: 7" in found
