"""Runs the disk-full state machine (diskfull_machine.py) in a private mount namespace with two small
tmpfs mounts of its own; its examples follow the Hypothesis profile (more under CI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from tests.faults.sandbox import can_mount_private_tmpfs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not can_mount_private_tmpfs(), reason="no private mount namespace (unshare -rm) here")
def test_appends_checkpoints_crashes_and_a_full_disk_in_any_order_lose_nothing_acknowledged(tmp_path: Path) -> None:
    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir()
    big.mkdir()
    examples = 150 if settings().max_examples >= 300 else 40  # the CI profile runs more (tests/conftest.py)
    script = f'mount -t tmpfs -o size=3m tmpfs "{small}" && mount -t tmpfs -o size=32m tmpfs "{big}" && exec "$@"'
    machine = [sys.executable, "-m", "tests.storage.diskfull_machine", str(small), str(big), str(examples)]
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", *machine],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-10000:]
    assert f"ok: {examples} examples" in result.stdout
