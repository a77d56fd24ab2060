"""`streaming-server` begins its store's state file walk from the command line before its modules load
(streaming.cli.early_walk): which directory it reads there, that the walk it begins is the one the store
uses, and that one begun for a store the configuration does not run is stopped and reaped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import storage.state_walk
from storage import LmdbStore, NewMessage, state_directory
from streaming.cli.early_walk import DEFAULT_DIR, _store_directory, begin_state_walk, stop_unused
from streaming.config import ServerConfig
from tests.support.walks import walks_here


@pytest.fixture(autouse=True)
def _walk_ahead_any_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """These stores' state files are small: fork for them anyway (the server forks from 1 MiB)."""
    monkeypatch.setattr(storage.state_walk, "WALK_AHEAD_BYTES", 0)


def _store(directory: Path) -> None:
    with LmdbStore(directory) as store:
        store.ensure_channel("c")
        store.append([NewMessage("c", b"m")])


def test_the_default_directory_is_the_configurations() -> None:
    assert ServerConfig().dir == DEFAULT_DIR


@pytest.mark.parametrize(
    ("argv", "toml", "expected"),
    [
        ([], "", DEFAULT_DIR),
        (["--dir", "/data/s", "-p", "4222"], "", "/data/s"),
        (["-p", "4222", "--dir=/data/s"], "", "/data/s"),
        (["-c", "{file}"], 'dir = "/from/file"\n', "/from/file"),
        (["-c", "{file}", "--dir", "/flag"], 'dir = "/from/file"\n', "/flag"),  # a flag wins, as in the config
        (["-c", "{file}"], 'store = "memory"\n', None),
        (["-st", "memory"], "", None),
        (["-c", "{file}", "--store", "lmdb"], 'store = "memory"\n', DEFAULT_DIR),
        (["--ft_group", "g", "--dir", "/d"], "", None),
        (["-c", "{file}"], 'ft_group = "g"\n', None),
        (["--workers", "4", "--dir", "/d"], "", None),
        (["-c", "{file}"], "dir = [1\n", None),  # the real parser reports the file
        (["-c", "{missing}"], "", None),
        (["--dir"], "", None),  # likewise the flag without its value
    ],
)
def test_which_store_the_command_line_runs(tmp_path: Path, argv: list[str], toml: str, expected: str | None) -> None:
    file = tmp_path / "server.toml"
    file.write_text(toml)
    argv = [a.format(file=file, missing=tmp_path / "none.toml") for a in argv]
    assert _store_directory(argv) == expected


@pytest.mark.parametrize("command", ["check", "repair", "import-stan"])
def test_maintenance_commands_begin_no_walk(tmp_path: Path, command: str) -> None:
    _store(tmp_path)
    assert begin_state_walk([command, "--dir", str(tmp_path)]) is None


def test_the_walk_begun_is_of_the_store_the_server_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(tmp_path)
    walk = begin_state_walk(["--dir", str(tmp_path)])
    assert walk is not None and walk.env_dir == state_directory(tmp_path)
    walked = walks_here(monkeypatch)
    with LmdbStore(tmp_path, verify="quick", state_walk=walk) as store:
        assert walked == []  # the child's answer was used
        assert store.channels()[0].msgs == 1


def test_a_walk_the_store_does_not_use_is_stopped_and_reaped(tmp_path: Path) -> None:
    _store(tmp_path)
    walk = begin_state_walk(["--dir", str(tmp_path)])
    assert walk is not None
    child = walk._child
    assert child is not None
    stop_unused(walk, None)
    with pytest.raises(ChildProcessError):
        os.waitpid(child[0], os.WNOHANG)
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(child[1])
    stop_unused(walk, None)  # twice is harmless


def test_the_walk_the_store_uses_is_left_alone(tmp_path: Path) -> None:
    _store(tmp_path)
    walk = begin_state_walk(["--dir", str(tmp_path)])
    assert walk is not None
    stop_unused(walk, walk)
    assert walk.problems() == []
