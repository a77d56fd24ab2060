"""What importing a package loads (the client library and the engine must not need LMDB), and that the
layers contract names every module of the server."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
    assert not [m for m in loaded if m.startswith(("storage", "streaming.core", "streaming.stan", "streaming.server"))]


def test_the_client_command_loads_nothing_of_the_server() -> None:
    """`streaming pub` / `streaming sub` start without paying for the server's imports."""
    loaded = loaded_by("from streaming.cli import client_main\nimport streaming.cli.client")
    server = ("storage", "streaming.core", "streaming.stan.", "streaming.server", "streaming.config", "streaming.pull")
    assert not [m for m in loaded if m.startswith(server)]
    assert not {"lmdb", "hypercorn", "starlette", "prometheus_client", "cattrs"} & {m.split(".")[0] for m in loaded}


def test_the_server_loads_its_http_stacks_only_for_the_ports_that_use_them() -> None:
    """A server without a monitoring or HTTP client port starts without hypercorn, Starlette and
    prometheus_client (a fifth of a second of imports)."""
    loaded = {m.split(".")[0] for m in loaded_by("import streaming.cli.server, streaming.server")}
    assert not {"hypercorn", "starlette", "prometheus_client"} & loaded


def test_the_server_command_reads_its_configuration_before_loading_the_server() -> None:
    """A bad flag or file is answered without loading Trio, the engine or the doors; a server without
    users starts without bcrypt and cryptography, one without the HTTP client port without its doors."""
    loaded = loaded_by("import streaming.cli.server")
    assert not [m for m in loaded if m.startswith(("trio", "streaming.core", "streaming.stan.", "streaming.server"))]
    serving = loaded_by("import streaming.cli.run, streaming.server")
    assert not [m for m in serving if m.startswith(("bcrypt", "cryptography", "streaming.bayeux", "streaming.pull"))]


def test_a_server_without_a_configuration_file_loads_no_toml_parser() -> None:
    """The TOML parser is loaded only to read a file: before the state walk forks, and by the server."""
    loaded = loaded_by("import streaming.cli.early_walk, streaming.cli.server, streaming.cli.run, streaming.server")
    assert "tomllib" not in loaded


def test_lmdb_store_is_there_when_named() -> None:
    loaded = loaded_by("from storage import LmdbStore")
    assert "lmdb" in loaded


def test_the_client_library_needs_none_of_the_servers_packages() -> None:
    """What a service that installs only the client (docs/client.md) must not need at import."""
    loaded = {m.split(".")[0] for m in loaded_by("import streaming.client")}
    assert not {"trio", "hypercorn", "starlette", "prometheus_client", "bcrypt", "lmdb", "cryptography"} & loaded


def test_every_module_of_the_server_sits_in_a_layer() -> None:
    """A module outside the layers contract could import anything: every one is named, or under a
    package that is (the generated protobuf code is under `streaming.wire`); the packages whose modules
    sit in different layers are named module by module."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (layers,) = [c["layers"] for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    unplaced = []
    for path in sorted((ROOT / "streaming").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        parts = module.split(".")
        packages = ("streaming", "streaming.core", "streaming.observability", "streaming.ft", "streaming.stan_import")
        if module not in packages and not any(".".join(parts[:n]) in named for n in range(1, len(parts) + 1)):
            unplaced.append(module)
    assert unplaced == []


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No circles, type-checking imports included (grimp, import-linter's graph)."""
    import grimp

    graph = grimp.build_graph("streaming", "storage", exclude_type_checking_imports=False)
    ours = ("streaming", "storage")
    circles = sorted(
        {
            tuple(sorted((module, imported)))
            for module in graph.modules
            if module.startswith(ours)
            for imported in graph.find_modules_directly_imported_by(module)
            if imported.startswith(ours) and graph.chain_exists(importer=imported, imported=module)
        }
    )
    assert circles == []


def test_every_name_of_the_store_package_loads_from_its_module() -> None:
    """`storage` loads its names on first use: each one it exports resolves to its module's object, and
    the names it loads are exactly those it imports for type checkers."""
    import ast

    import storage

    lazy = storage._WHERE
    for name in storage.__all__:
        value = getattr(storage, name)
        if name in lazy:
            assert value is getattr(sys.modules[lazy[name]], name)
    tree = ast.parse((ROOT / "storage" / "__init__.py").read_text())
    checked = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    typed = {alias.name for node in checked.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert typed == set(lazy)
    assert set(lazy) <= set(storage.__all__)
