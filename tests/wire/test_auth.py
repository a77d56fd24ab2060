"""Authentication on the NATS port, as nats-server does it: a token, or users whose passwords are
given plain or as bcrypt hashes. Real clients authenticate (nats-py with a token, node-nats-streaming
with a user and password, ours with both); bad or missing credentials get `Authorization Violation`
and a close, a silent connection `Authentication Timeout`, and nobody else notices."""

from __future__ import annotations

import asyncio
from pathlib import Path

import bcrypt
import httpx
import nats
import psutil
import pytest
import trio

from streaming.client import NatsError, StartPosition, connect
from streaming.config import ConfigError, ServerConfig, load
from streaming.stan.auth import Authenticator, User
from streaming.wire import nats as p
from tests.wire.servers import RawClient, config, running, server_process
from tests.wire.test_peers import node, run_node

CLUSTER = "test-cluster"
HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()  # cheap rounds: a test, not a vault


def test_credentials_are_checked_as_nats_server_checks_them() -> None:
    token = Authenticator(token="t0ken")
    assert token.required and token.check({"auth_token": "t0ken"}) == ""
    assert token.check({"auth_token": "t0ke"}) is None and token.check({}) is None
    users = Authenticator(users=[User("alice", "plain"), User("bob", HASH)])
    assert users.check({"user": "alice", "pass": "plain"}) == "alice"
    assert users.check({"user": "alice", "pass": "s3cret"}) is None
    assert users.needs_thread({"user": "bob", "pass": "s3cret"}), "a bcrypt check is slow: off the loop"
    assert users.check({"user": "bob", "pass": "s3cret"}) == "bob"
    assert not users.needs_thread({"user": "bob", "pass": "s3cret"}), "a password found right is remembered"
    assert users.needs_thread({"user": "bob", "pass": "wrong"})
    assert users.check({"user": "bob", "pass": "wrong"}) is None
    assert users.check({"user": "carol", "pass": "plain"}) is None
    assert users.check({"user": "alice", "pass": 1}) is None
    assert not Authenticator().required and Authenticator().check({}) == ""
    with pytest.raises(ValueError, match="cannot both"):
        Authenticator(token="t", users=[User("a", "b")])
    with pytest.raises(ValueError, match="twice"):
        Authenticator(users=[User("a", "b"), User("a", "c")])


def test_the_config_file_takes_users_and_refuses_what_cannot_work(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text(f'[[users]]\nuser = "alice"\npassword = "plain"\n\n[[users]]\nuser = "bob"\npassword = "{HASH}"\n')
    cfg = load(path)
    assert cfg.authenticator().check({"user": "bob", "pass": "s3cret"}) == "bob"
    with pytest.raises(ConfigError, match="user and password go together"):
        ServerConfig(user="alice")
    with pytest.raises(ConfigError, match="cannot both"):
        ServerConfig(auth_token="t", user="a", password="b")


async def test_bad_or_missing_credentials_are_refused_and_nobody_else_notices() -> None:
    async with running(config(user="alice", password=HASH, connect_timeout=0.5)) as server:
        async with connect(CLUSTER, "good", port=server.port, user="alice", password="s3cret") as good:
            bad_bytes = [
                b'CONNECT {"user":"alice","pass":"wrong"}\r\nPING\r\n',
                b"CONNECT {}\r\nPING\r\n",
                b"PUB orders 1\r\nx\r\n",  # anything before CONNECT
                b"SUB > 1\r\n",
            ]
            for attempt in bad_bytes:
                raw = await RawClient.open(server.port, connect=b"")
                assert raw.info["auth_required"] is True
                await raw.send(attempt)
                with trio.fail_after(5):
                    seen = await raw.until_closed()
                assert seen == [p.Err(p.AUTHORIZATION_VIOLATION)], (attempt, seen)
            silent = await RawClient.open(server.port, connect=b"")
            with trio.fail_after(5):
                assert await silent.until_closed() == [p.Err(p.AUTHENTICATION_TIMEOUT)]
            with pytest.raises(NatsError, match="Authorization Violation"):
                async with connect(CLUSTER, "bad", port=server.port, user="alice", password="nope"):
                    pass
            async with good.subscribe("orders", start_at=StartPosition.FIRST) as sub:
                await good.publish("orders", b"still here")
                assert (await sub.next_msg()).data == b"still here"
        assert server.broker.protocol_errors["authorization"] == 5


async def test_a_bcrypt_check_does_not_hold_up_the_server() -> None:
    slow = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=12)).decode()  # ~0.2 s to check here
    async with running(config(user="alice", password=slow)) as server:
        async with connect(CLUSTER, "busy", port=server.port, user="alice", password="s3cret") as busy:
            stalls: list[float] = []

            async def measure() -> None:
                for _ in range(30):
                    start = trio.current_time()
                    await busy.publish("busy", b"x")
                    stalls.append(trio.current_time() - start)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(measure)
                raw = await RawClient.open(server.port, connect=b"")
                await raw.send(b'CONNECT {"user":"alice","pass":"wrong-but-slow"}\r\n')
                with trio.fail_after(10):
                    assert await raw.until_closed() == [p.Err(p.AUTHORIZATION_VIOLATION)]
            assert max(stalls) < 0.15, f"a publish waited {max(stalls):.3f}s behind a bcrypt check"


def test_nats_py_with_a_token() -> None:
    async def scenario(port: int) -> None:
        nc = await nats.connect(f"nats://127.0.0.1:{port}", token="t0ken", allow_reconnect=False)
        try:
            sub = await nc.subscribe("greet")
            await nc.publish("greet", b"hello")
            assert (await sub.next_msg(timeout=2)).data == b"hello"
        finally:
            await nc.close()
        with pytest.raises(Exception, match=r"(?i)authorization"):
            await nats.connect(
                f"nats://127.0.0.1:{port}", token="wrong", allow_reconnect=False, max_reconnect_attempts=0
            )

    with server_process("--store", "memory", "--auth", "t0ken") as server:
        asyncio.run(scenario(server.port))


@node
def test_node_nats_streaming_with_a_user_and_password() -> None:
    with server_process("--store", "memory", "--user", "alice", "--pass", HASH) as server:
        good = run_node("publish", server.port, "secure", {"NATS_USER": "alice", "NATS_PASS": "s3cret"})
        assert good["published"] == 20
        bad = run_node("publish", server.port, "secure", {"NATS_USER": "alice", "NATS_PASS": "x"}, expect_ok=False)
        assert "Authorization Violation" in str(bad["error"])


async def test_the_monitoring_page_shows_no_inboxes_when_credentials_are_asked_for() -> None:
    async with (
        running(config(auth_token="t0ken", http_port=-1)) as server,
        connect(CLUSTER, "watched", port=server.port, token="t0ken") as client,
        client.subscribe("orders"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http,
    ):
        for page in ("/streaming/clientsz?subs=1", "/streaming/channelsz?subs=1"):
            text = (await http.get(page)).text
            assert "watched" in text or "orders" in text
            for field in ("inbox", "ack_inbox", "hb_inbox"):
                assert f'"{field}"' not in text, (page, field)


def listening_on(port: int) -> set[str]:
    """The addresses a TCP socket listens on at `port`."""
    return {
        c.laddr.ip
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    }


async def test_the_monitoring_port_can_listen_on_loopback_only() -> None:
    async with running(config(host="0.0.0.0", http_port=-1, http_host="127.0.0.1")) as server:
        assert listening_on(server.http_port) == {"127.0.0.1"}
        assert listening_on(server.port) and listening_on(server.port) <= {"0.0.0.0", "::"}
