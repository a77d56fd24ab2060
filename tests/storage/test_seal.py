"""A clean stop seals the state file (walked, then its digest written beside it): the next start skips
the walk only for the very bytes that walk found clean. A crash, any change or damage since, or a
seal that cannot be read means a walk, and damage is refused as without a seal."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

import storage.state_walk
from storage import ClientRecord, DamagedStoreError, LmdbStore, NewMessage, walk_ahead
from storage.state_walk import SEAL_NAME
from tests.support.walks import walks_here


def _store(directory: Path) -> None:
    with LmdbStore(directory) as store:
        store.ensure_channel("c")
        store.append([NewMessage("c", b"m%d" % i) for i in range(50)])


def _flip_page_headers(data: Path) -> None:
    raw = bytearray(data.read_bytes())
    for page in range(2 * 4096, len(raw), 4096):  # every page header but the meta pages'
        raw[page : page + 16] = bytes(b ^ 0xA5 for b in raw[page : page + 16])
    data.write_bytes(bytes(raw))


def test_a_clean_stop_seals_and_the_next_start_does_not_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(tmp_path)
    assert (tmp_path / "state" / SEAL_NAME).is_file()
    walked = walks_here(monkeypatch)
    with LmdbStore(tmp_path, verify="quick") as store:
        assert walked == []
        assert not (tmp_path / "state" / SEAL_NAME).exists(), "an open store's state file is not sealed"
        assert [m.seq for m in store.read("c", 1, 100)] == list(range(1, 51))
    assert walked == [tmp_path / "state"], "the stop walks the file it seals"
    assert (tmp_path / "state" / SEAL_NAME).is_file()


def test_the_walk_begun_ahead_takes_the_seal_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(tmp_path)
    monkeypatch.setattr(storage.state_walk, "WALK_AHEAD_BYTES", 0)  # fork for this small file
    walk = walk_ahead(tmp_path)
    walked = walks_here(monkeypatch)
    assert walk.problems() == []
    assert walked == []


@pytest.mark.parametrize("ahead", [False, True])
def test_damage_after_a_clean_stop_is_refused_as_without_a_seal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: bool
) -> None:
    _store(tmp_path)
    _flip_page_headers(tmp_path / "state" / "data.mdb")
    assert (tmp_path / "state" / SEAL_NAME).is_file()
    monkeypatch.setattr(storage.state_walk, "WALK_AHEAD_BYTES", 0)
    walk = walk_ahead(tmp_path) if ahead else None
    with pytest.raises(DamagedStoreError, match=r"state/data\.mdb is damaged"):
        LmdbStore(tmp_path, verify="quick", state_walk=walk)


def test_a_sealed_file_of_another_store_is_walked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The seal names the bytes, not the place: a state file swapped for another one is walked (and,
    here, found whole)."""
    _store(tmp_path / "a")
    with LmdbStore(tmp_path / "b") as store:
        store.ensure_channel("c")
        store.register_client(ClientRecord("other", "_INBOX.other"))  # a state file of other bytes
    shutil.copy(tmp_path / "b" / "state" / SEAL_NAME, tmp_path / "a" / "state" / SEAL_NAME)
    walked = walks_here(monkeypatch)
    with LmdbStore(tmp_path / "a", verify="quick"):
        assert walked == [tmp_path / "a" / "state"]


@pytest.mark.parametrize("seal", [b"", b"not a digest", b"\xff\xfe\x00", b"4096 " + b"0" * 128])
def test_a_seal_that_does_not_match_means_a_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seal: bytes) -> None:
    _store(tmp_path)
    (tmp_path / "state" / SEAL_NAME).write_bytes(seal)
    walked = walks_here(monkeypatch)
    with LmdbStore(tmp_path, verify="quick") as store:
        assert walked == [tmp_path / "state"]
        assert store.channels()[0].msgs == 50


def test_a_copy_of_a_stopped_store_keeps_its_seal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    walked = walks_here(monkeypatch)
    with LmdbStore(tmp_path / "b", verify="quick") as store:
        assert walked == []
        assert store.channels()[0].msgs == 50


def test_a_file_the_stop_finds_damaged_is_left_unsealed_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = LmdbStore(tmp_path)
    store.ensure_channel("c")
    # What the walk at the stop reports, as it would for a file damaged while the server ran.
    monkeypatch.setattr(storage.state_walk, "structure_problems", lambda env_dir: ["page 3: bad"])
    with caplog.at_level(logging.ERROR):
        store.close()
    assert not (tmp_path / "state" / SEAL_NAME).exists()
    assert "the walk after a clean stop found problems" in caplog.text
