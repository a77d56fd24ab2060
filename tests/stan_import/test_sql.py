"""A SQL store (`-st SQL`) written by the server we replace into a real PostgreSQL and a real MariaDB,
imported with `--sql_driver postgres|mysql`: the messages, clients and subscriptions with their
positions and pending messages as that server last reported them, in its default (cached) mode, where
pending messages are rows of JSON arrays, and with `--sql_no_caching`, where each is a row of its own;
then a durable resumes on our server with its pending messages first. Rows put in by hand check the
rules of each table where the server is absent."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
import trio

from storage import LmdbStore
from streaming.client import StartPosition, connect
from tests.support.mysql import mysql_server, needs_mysql
from tests.support.postgres import needs_postgres, postgres_server
from tests.support.servers import ServerProcess, command, free_port
from tests.support.stan_peer import needs_stan, stan_peer

HERE = Path(__file__).parent
ACKED = {1, 2, 3, 5, 8, 13, 21}  # of 1..25, by the durable on sql.a


@attrs.frozen
class Database:
    driver: str
    port: int

    @property
    def stan_source(self) -> str:
        """The data source as nats-streaming-server is given it (the Go drivers' forms)."""
        if self.driver == "postgres":
            return f"host=127.0.0.1 port={self.port} user=stan dbname=stan sslmode=disable"
        return f"root@tcp(127.0.0.1:{self.port})/stan"

    @property
    def our_source(self) -> str:
        if self.driver == "postgres":
            return f"postgresql://stan@127.0.0.1:{self.port}/stan"
        return self.stan_source  # the importer reads the Go MySQL driver's form

    def connect(self) -> Any:
        if self.driver == "postgres":
            import psycopg

            return psycopg.connect(self.our_source)
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", database="stan")


@contextmanager
def database(driver: str) -> Iterator[Database]:
    start = postgres_server if driver == "postgres" else mysql_server
    with start("stan", (HERE / f"{driver}.sql").read_text()) as port:
        yield Database(driver, port)


DRIVERS = [pytest.param("postgres", marks=needs_postgres), pytest.param("mysql", marks=needs_mysql)]


def import_stan_sql(db: Database, target: Path) -> subprocess.CompletedProcess[str]:
    return command(
        "server_main", "import-stan", "--dir", str(target), "--sql_driver", db.driver, "--sql_source", db.our_source
    )


async def _play(port: int) -> None:
    async with connect("test-cluster", "sql-client", port=port, request_timeout_s=10) as client:
        for i in range(25):
            await client.publish("sql.a", f"a{i}".encode())
            await client.publish("sql.b", bytes([i]) * i)
        durable = await client.open_subscription(
            "sql.a", durable="keeper", manual_ack=True, start_at=StartPosition.FIRST, ack_wait=60, max_inflight=100
        )
        for _ in range(25):
            with anyio.fail_after(10):
                msg = await durable.next_msg()
            if msg.seq in ACKED:
                msg.ack()
        closed = await client.open_subscription(
            "sql.b",
            durable="closer",
            manual_ack=True,
            start_at=StartPosition.SEQUENCE_START,
            start_sequence=20,
            ack_wait=60,
        )
        for _ in range(6):
            with anyio.fail_after(10):
                await closed.next_msg()  # 20..25, none acked
        await closed.close()
        await trio.sleep(0.5)  # the acks reach the server, and it writes them, before it stops


@pytest.mark.slow
@needs_stan
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("caching", [True, False], ids=["cached", "no_caching"])
def test_a_sql_store_imports_and_resumes(tmp_path: Path, driver: str, caching: bool) -> None:
    with database(driver) as db:
        flags = ["-st", "SQL", "--sql_driver", driver, "--sql_source", db.stan_source]
        with stan_peer(tmp_path / "unused", *flags, f"--sql_no_caching={str(not caching).lower()}") as peer:
            trio.run(_play, peer.port)
            reported = {c["name"]: c for c in peer.page("channelsz?subs=1")["channels"]}
            peer.stop()
        done = import_stan_sql(db, tmp_path / "data")
        assert done.returncode == 0, done.stderr
    with LmdbStore(tmp_path / "data") as store:
        for name in ("sql.a", "sql.b"):
            info = store.channel_info(name)
            assert info is not None
            assert (info.first_seq, info.last_seq, info.msgs) == (1, 25, reported[name]["msgs"])
        assert [m.data for m in store.read("sql.a", 1, 30)] == [f"a{i}".encode() for i in range(25)]
        assert [m.data for m in store.read("sql.b", 1, 30)] == [bytes([i]) * i for i in range(25)]
        state = store.recover()
    assert state.clients == []  # the client closed its connection: its durables wait for it offline
    subs = {s.record.durable_name: s for s in state.subscriptions}
    assert set(subs) == {"keeper", "closer"}
    assert subs["keeper"].record.last_sent == 25 and set(subs["keeper"].pending) == set(range(1, 26)) - ACKED
    assert subs["closer"].record.last_sent == 25 and set(subs["closer"].pending) == set(range(20, 26))
    assert subs["closer"].record.is_closed and subs["keeper"].record.is_closed
    for sub in reported["sql.a"]["subscriptions"] + reported["sql.b"]["subscriptions"]:
        assert sub["pending_count"] == len(subs[sub["durable_name"]].pending)
    server = ServerProcess(["-p", "0", "--dir", str(tmp_path / "data"), "--http_port=-1"]).start()
    try:
        got = trio.run(_resume, server.port)
    finally:
        server.stop()
    pending = sorted(set(range(1, 26)) - ACKED)
    assert got == [(seq, True) for seq in pending], got


async def _resume(port: int) -> list[tuple[int, bool]]:
    async with connect("test-cluster", "sql-client", port=port) as client:
        sub = await client.open_subscription("sql.a", durable="keeper", manual_ack=True, ack_wait=60)
        got = []
        with anyio.move_on_after(2):
            while True:
                msg = await sub.next_msg()
                got.append((msg.seq, msg.redelivered))
                msg.ack()
        return got


def test_the_mysql_data_source_is_read_as_the_go_driver_writes_it() -> None:
    from streaming.stan_import.sqlstore import _MYSQL_DSN

    found = _MYSQL_DSN.match("stan:secret@tcp(db.example:3307)/nss_db?charset=utf8")
    assert found is not None
    assert found.group("user", "password", "address", "db") == ("stan", "secret", "db.example:3307", "nss_db")
    found = _MYSQL_DSN.match("root@/stan")
    assert found is not None and found.group("user", "address", "db") == ("root", None, "stan")


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--sql_driver", "postgres"], "give STAN_DIR, or --sql_driver and --sql_source"),
        (["somewhere", "--sql_driver", "postgres", "--sql_source", "x"], "give STAN_DIR, or --sql_driver"),
    ],
)
def test_the_sources_are_one_or_the_other(tmp_path: Path, flags: list[str], why: str) -> None:
    done = command("server_main", "import-stan", "--dir", str(tmp_path / "data"), *flags)
    assert done.returncode == 2 and why in done.stderr


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    dsn = f"postgresql://stan@127.0.0.1:{free_port()}/stan?connect_timeout=2"
    done = command(
        "server_main", "import-stan", "--dir", str(tmp_path / "data"), "--sql_driver", "postgres", "--sql_source", dsn
    )
    assert done.returncode == 1 and "cannot connect to the postgres store" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "data").exists()


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_rules_of_the_tables(tmp_path: Path, driver: str) -> None:
    """Rows as the server writes them, put in by hand: a client without its protobuf, a deleted channel
    and subscription, pending rows of both modes with an ack cancelling an earlier row's pending, a
    last-sent position only in a pending row, and a channel whose messages are all gone."""
    from streaming.stan_import.spb.store_pb2 import ClientInfo, ServerInfo, SubState
    from streaming.wire.stan_pb.protocol_pb2 import MsgProto

    row = "`row`" if driver == "mysql" else "row"
    with database(driver) as where, closing(where.connect()) as connection, closing(connection.cursor()) as db:
        info = ServerInfo(ClusterID="rows", Publish="_STAN.pub.rows").SerializeToString()
        db.execute("INSERT INTO ServerInfo (id, proto, version) VALUES ('rows', %s, 1)", (info,))
        client = ClientInfo(ID="with-proto", HbInbox="_INBOX.a").SerializeToString()
        db.execute("INSERT INTO Clients VALUES ('with-proto', '_INBOX.a', %s), ('old', '_INBOX.b', NULL)", (client,))
        db.execute("INSERT INTO Channels (id, name, maxseq) VALUES (1, 'kept', 5), (2, 'gone', 9), (3, 'expired', 40)")
        db.execute("UPDATE Channels SET deleted = TRUE WHERE id = 2")
        for seq in range(1, 6):
            body = MsgProto(sequence=seq, subject="kept", data=b"m%d" % seq, timestamp=1000 + seq).SerializeToString()
            db.execute("INSERT INTO Messages VALUES (1, %s, %s, %s, %s)", (seq, 1000 + seq, len(body), body))
        for subid, channel, name in ((7, 1, "cached"), (8, 1, "rows"), (9, 1, "deleted")):
            sub = SubState(ID=subid, clientID="with-proto", durableName=name, isDurable=True, lastSent=1)
            sub.ackInbox, sub.maxInFlight, sub.ackWaitInSecs = "_INBOX.ack", 10, 30
            db.execute(
                "INSERT INTO Subscriptions VALUES (%s, %s, 2, %s, %s)",
                (channel, subid, sub.SerializeToString(), name == "deleted"),
            )
        db.execute(
            f"INSERT INTO SubsPending (subid, {row}, lastsent, pending, acks) VALUES "
            "(7, 1, 3, '[1,2,3]', '[]'), (7, 2, 4, '[4]', '[1,3]')"
        )
        db.execute(f"INSERT INTO SubsPending (subid, {row}, seq) VALUES (8, 1, 2), (8, 2, 5)")
        connection.commit()
        done = import_stan_sql(where, tmp_path / "data")
    assert done.returncode == 0, done.stderr
    with LmdbStore(tmp_path / "data", "rows") as store:
        state = store.recover()
        held = {c.name: (c.first_seq, c.last_seq, c.msgs) for c in state.channels}
    assert held == {"kept": (1, 5, 5), "expired": (41, 40, 0)}
    assert sorted((c.client_id, c.hb_inbox) for c in state.clients) == [("old", "_INBOX.b"), ("with-proto", "_INBOX.a")]
    subs = {s.record.durable_name: s for s in state.subscriptions}
    assert set(subs) == {"cached", "rows"}
    assert set(subs["cached"].pending) == {2, 4} and subs["cached"].record.last_sent == 4
    assert set(subs["rows"].pending) == {2, 5} and subs["rows"].record.last_sent == 5
