"""The state file's structure walk begun ahead (`storage.walk_ahead`, a forked child) while the server
loads: its answer is used only when it found nothing and the file has not changed since; anything else
is walked again before the store trusts the file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import storage.state_walk
from storage import ClientRecord, DamagedStoreError, LmdbStore, NewMessage, walk_ahead
from storage.state_walk import SEAL_NAME
from tests.support.walks import walks_here


def _store(directory: Path, *, sealed: bool = False) -> None:
    """A store with 50 messages, stopped cleanly; `sealed=False`: as after a crash, no seal beside the
    state file (what these tests are about is the walk)."""
    with LmdbStore(directory) as store:
        store.ensure_channel("c")
        store.append([NewMessage("c", b"m%d" % i) for i in range(50)])
    if not sealed:
        (directory / "state" / SEAL_NAME).unlink()


@pytest.fixture(autouse=True)
def _walk_ahead_any_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """These stores' state files are small: fork for them anyway (the server forks from 1 MiB)."""
    monkeypatch.setattr(storage.state_walk, "WALK_AHEAD_BYTES", 0)


def test_an_unchanged_intact_file_is_not_walked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(tmp_path)
    walk = walk_ahead(tmp_path)
    walked = walks_here(monkeypatch)
    with LmdbStore(tmp_path, verify="quick", state_walk=walk) as store:
        assert walked == []
        assert [m.seq for m in store.read("c", 1, 100)] == list(range(1, 51))


def test_a_file_written_after_the_walk_began_is_walked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(tmp_path)
    walk = walk_ahead(tmp_path)
    time.sleep(0.01)  # a later modification time, whatever the file system's granularity
    with LmdbStore(tmp_path) as store:  # as another server that held the directory until now
        store.register_client(ClientRecord("late", "_INBOX.late"))
    (tmp_path / "state" / SEAL_NAME).unlink()  # and stopped without a seal (a crash)
    walked = walks_here(monkeypatch)
    assert walk.problems() == []
    assert walked == [tmp_path / "state"]


def test_damage_the_walk_finds_is_refused_naming_the_file(tmp_path: Path) -> None:
    _store(tmp_path)
    data = tmp_path / "state" / "data.mdb"
    raw = bytearray(data.read_bytes())
    for page in range(2 * 4096, len(raw), 4096):  # every page header but the meta pages'
        raw[page : page + 16] = bytes(b ^ 0xA5 for b in raw[page : page + 16])
    data.write_bytes(bytes(raw))
    walk = walk_ahead(tmp_path)
    with pytest.raises(DamagedStoreError, match=r"state/data\.mdb is damaged"):
        LmdbStore(tmp_path, verify="quick", state_walk=walk)


def test_no_state_file_yet_needs_no_walk(tmp_path: Path) -> None:
    walk = walk_ahead(tmp_path / "new")
    with LmdbStore(tmp_path / "new", state_walk=walk) as store:
        assert store.channels() == []


def test_a_small_file_is_walked_here_without_a_fork(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(tmp_path)
    monkeypatch.setattr(storage.state_walk, "WALK_AHEAD_BYTES", 1 << 20)
    walk = walk_ahead(tmp_path)
    walked = walks_here(monkeypatch)
    assert walk.problems() == []
    assert walked == [tmp_path / "state"]
