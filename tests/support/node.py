"""Running the STAN client nobody on the team wrote (node-nats-streaming, installed by
`npm ci --prefix tests/node`) in a scenario of tests/node/driver.js."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).parent.parent / "node"


def _node_ready() -> bool:
    return shutil.which("node") is not None and (NODE_DIR / "node_modules" / "node-nats-streaming").is_dir()


def run_node(
    scenario: str, port: int, channel: str, env: dict[str, str] | None = None, *, expect_ok: bool = True
) -> dict[str, object]:
    """One driver.js scenario; `env`: NATS_USER and NATS_PASS, or NATS_TOKEN, for a secured server."""
    done = subprocess.run(
        ["node", str(NODE_DIR / "driver.js"), scenario, str(port), channel],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"node printed nothing useful:\nstdout:{done.stdout}\nstderr:{done.stderr}"
    result: dict[str, object] = json.loads(lines[-1])
    assert result["ok"] is expect_ok, result
    return result


node = pytest.mark.skipif(not _node_ready(), reason="run `npm ci --prefix tests/node` (CI does)")
