"""Counting the structure walks a test's own process makes of a store's files (`storage.state_walk`)."""

from __future__ import annotations

from pathlib import Path

import pytest

import storage.state_walk


def walks_here(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The environments this process walks from now on (a child forked before this is not counted)."""
    walked: list[Path] = []
    real = storage.state_walk.structure_problems

    def counting(env_dir: Path) -> list[str]:
        walked.append(env_dir)
        return real(env_dir)

    monkeypatch.setattr(storage.state_walk, "structure_problems", counting)
    return walked
