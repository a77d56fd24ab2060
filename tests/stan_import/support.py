"""The stores nats-streaming-server wrote (tests/stan_import/stores, each with the manifest of what it
holds), and running the importer as users do."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.support.servers import command

STORES = Path(__file__).parent / "stores"
NAMES = [
    "basic",
    "slices_limits",
    "encrypted_aes",
    "encrypted_chacha",
    "crc_poly",
    "truncated_tail",
    "large",
    "clustered_node",
]


def manifest(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((STORES / f"{name}.manifest.json").read_text())
    return found


def copy(name: str, where: Path) -> Path:
    """A writable copy of a store (for tests that damage one)."""
    target = where / name
    shutil.copytree(STORES / name, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def import_stan(source: Path, target: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return command("server_main", "import-stan", str(source), "--dir", str(target), *flags)


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
