"""A real PostgreSQL server for the tests that need one (Debian's `postgresql`, which `.ci/run`
installs): a cluster of its own in a temporary directory, on a free port of the loopback, run as the
`postgres` user when the tests run as root (it refuses root), with trust authentication."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.servers import connect_when_up, free_port


def _binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _as_postgres() -> list[str]:
    if os.geteuid() != 0:
        return []
    pwd.getpwnam("postgres")  # the Debian package makes this user
    return ["runuser", "-u", "postgres", "--"]


def _available() -> bool:
    try:
        _as_postgres()
    except KeyError:
        return False
    return _binaries() is not None


needs_postgres = pytest.mark.skipif(not _available(), reason="PostgreSQL not installed (apt-get install postgresql)")


@contextmanager
def postgres_server(database: str, schema: str) -> Iterator[int]:
    """A running PostgreSQL with `database` made and `schema` run in it; yields its port (user `stan`)."""
    bin_dir = _binaries()
    assert bin_dir is not None
    run_as = _as_postgres()
    root = Path(tempfile.mkdtemp(prefix="pg-"))
    if run_as:
        shutil.chown(root, "postgres", "postgres")
    data, port = root / "data", free_port()
    subprocess.run(
        [*run_as, str(bin_dir / "initdb"), "-D", str(data), "-U", "stan", "--auth=trust", "--no-sync"],
        check=True,
        capture_output=True,
    )
    server = subprocess.Popen(
        [
            *run_as,
            str(bin_dir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-k",
            str(root),
            "-h",
            "127.0.0.1",
            "-c",
            "fsync=off",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import psycopg

        url = f"postgresql://stan@127.0.0.1:{port}/postgres"
        with connect_when_up(lambda: psycopg.connect(url, autocommit=True), server, psycopg.OperationalError) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        with psycopg.connect(f"postgresql://stan@127.0.0.1:{port}/{database}", autocommit=True) as conn:
            conn.execute(schema.encode())
        yield port
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(root, ignore_errors=True)
