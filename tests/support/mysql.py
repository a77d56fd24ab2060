"""A real MySQL-compatible server for the tests that need one (Debian's `mariadb-server`, which
`.ci/run` installs): a data directory of its own in a temporary directory, on a free port of the
loopback, run as the `mysql` user, without grant tables (any user is let in)."""

from __future__ import annotations

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


def _available() -> bool:
    try:
        pwd.getpwnam("mysql")  # the Debian package makes this user
    except KeyError:
        return False
    return os.geteuid() == 0 and shutil.which("mariadbd") is not None and shutil.which("mariadb-install-db") is not None


needs_mysql = pytest.mark.skipif(not _available(), reason="MariaDB not installed (apt-get install mariadb-server)")


@contextmanager
def mysql_server(database: str, schema: str) -> Iterator[int]:
    """A running MariaDB with `database` made and `schema` run in it; yields its port (user `root`)."""
    import pymysql

    root = Path(tempfile.mkdtemp(prefix="mysql-"))
    shutil.chown(root, "mysql", "mysql")
    data, port = root / "data", free_port()
    as_mysql = ["runuser", "-u", "mysql", "--"]
    subprocess.run(
        [
            *as_mysql,
            "mariadb-install-db",
            f"--datadir={data}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ],
        check=True,
        capture_output=True,
    )
    server = subprocess.Popen(
        [
            *as_mysql,
            "mariadbd",
            f"--datadir={data}",
            f"--socket={root / 'sock'}",
            f"--port={port}",
            "--bind-address=127.0.0.1",
            "--skip-grant-tables",
            f"--pid-file={root / 'pid'}",
            "--skip-log-bin",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        connection = connect_when_up(
            lambda: pymysql.connect(host="127.0.0.1", port=port, user="root"), server, pymysql.err.OperationalError
        )
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE `{database}`")
            cursor.execute(f"USE `{database}`")
            text = "\n".join(line for line in schema.splitlines() if not line.lstrip().startswith("--"))
            for statement in (s for s in text.split(";") if s.strip()):  # one statement at a time
                cursor.execute(statement)
        connection.commit()
        connection.close()
        yield port
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(root, ignore_errors=True)
