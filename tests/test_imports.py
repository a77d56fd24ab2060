"""What importing a package loads: the client library and the engine must not need LMDB."""

from __future__ import annotations

import subprocess
import sys

import pytest


def loaded_by(statement: str) -> set[str]:
    """The modules a fresh interpreter has loaded after `statement`."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


@pytest.mark.parametrize("statement", ["import storage", "import streaming.core.engine", "import streaming.client"])
def test_no_store_implementation_is_loaded(statement: str) -> None:
    loaded = loaded_by(statement)
    assert not {"lmdb", "storage.lmdb_store", "storage.journal"} & loaded


def test_the_client_library_loads_nothing_of_the_server() -> None:
    loaded = loaded_by("import streaming.client")
    assert not [m for m in loaded if m.startswith(("streaming.core", "streaming.stan", "streaming.server"))]


def test_lmdb_store_is_there_when_named() -> None:
    loaded = loaded_by("from storage import LmdbStore")
    assert "lmdb" in loaded


def test_the_client_library_needs_none_of_the_servers_packages() -> None:
    """What a service that installs only the client (docs/client.md) must not need at import."""
    loaded = {m.split(".")[0] for m in loaded_by("import streaming.client")}
    assert not {"trio", "hypercorn", "starlette", "prometheus_client", "bcrypt", "lmdb", "cryptography"} & loaded
