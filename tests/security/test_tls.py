"""TLS on the NATS port as NATS does it (a plain INFO that says `tls_required`, then the handshake), and
on the HTTP listeners: our client, nats-py with a client certificate and node-nats-streaming talk to
it; a plain client against it and a TLS client against a plain server get clear errors, and
everyone else keeps working."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import trio

from streaming.client import NatsError, StartPosition, connect
from streaming.config import ConfigError, ServerConfig
from tests.support.certs import Certs, make_certs
from tests.support.node import node, run_node
from tests.support.servers import RawClient, command, config, eventually, nats_py_round_trip, running, server_process

CLUSTER = "test-cluster"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_config(certs: Certs, **overrides: Any) -> ServerConfig:
    return config(tls=True, tls_cert=str(certs.server_cert), tls_key=str(certs.server_key), **overrides)


async def test_our_client_over_tls_and_the_clear_errors_around_it(certs: Certs) -> None:
    async with running(tls_config(certs, http_port=-1)) as server:
        secure = certs.client_context(with_cert=False)
        async with connect(CLUSTER, "secure", port=server.port, tls=secure) as client:
            async with client.subscribe("orders", start_at=StartPosition.FIRST, manual_ack=True) as sub:
                await client.publish("orders", b"over tls")
                msg = await sub.next_msg()
                assert msg.data == b"over tls"
                msg.ack()
                with pytest.raises(NatsError, match="the server requires TLS"):
                    async with connect(CLUSTER, "plain", port=server.port):
                        pass
                raw = await RawClient.open(server.port, connect=b"")  # a client that speaks in the clear
                assert raw.info["tls_required"] is True
                await raw.send(b"CONNECT {}\r\nPING\r\n")
                with trio.fail_after(5):
                    assert await raw.until_closed() == []
                # Our plain client's attempt and this one; the server sees the first end on its own time.
                await eventually(lambda: server.broker.protocol_errors["tls"] == 2)
                await client.publish("orders", b"still fine")
                assert (await sub.next_msg()).data == b"still fine"
        async with httpx.AsyncClient(verify=secure) as http:
            page = await http.get(f"https://127.0.0.1:{server.http_port}/streaming/serverz")
            assert page.status_code == 200 and page.json()["cluster_id"] == CLUSTER
    async with running(config()) as plain:
        with pytest.raises(NatsError, match="does not offer it"):
            async with connect(CLUSTER, "wants-tls", port=plain.port, tls=certs.client_context()):
                pass


def test_nats_py_with_a_client_certificate(certs: Certs) -> None:
    async def scenario(port: int) -> None:
        nc = await nats.connect(f"tls://127.0.0.1:{port}", tls=certs.client_context(), allow_reconnect=False)
        await nats_py_round_trip(nc, "greet", b"hello")
        with pytest.raises((ssl.SSLError, OSError, nats.errors.Error)):
            await connect_and_use_without_a_certificate(port)

    async def connect_and_use_without_a_certificate(port: int) -> None:
        uncertified = await nats.connect(
            f"tls://127.0.0.1:{port}",
            tls=certs.client_context(with_cert=False),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=2,
        )
        # Under TLS 1.3 the client's side of the handshake may finish before the server has refused
        # the missing certificate: then connect returns, and the first round trip fails.
        await uncertified.flush(timeout=2)

    args = ["--tlsverify", "--tlscert", str(certs.server_cert), "--tlskey", str(certs.server_key)]
    with server_process("--store", "memory", *args, "--tlscacert", str(certs.ca)) as server:
        asyncio.run(scenario(server.port))


@node
def test_node_nats_streaming_over_tls(certs: Certs) -> None:
    args = ["--tls", "--tlscert", str(certs.server_cert), "--tlskey", str(certs.server_key)]
    with server_process("--store", "memory", *args) as server:
        result = run_node("publish", server.port, "secure", {"NATS_CA": str(certs.ca)})
        assert result["published"] == 20


def test_tls_settings_that_cannot_work_are_refused(certs: Certs, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tls_cert and tls_key"):
        ServerConfig(tls=True)
    with pytest.raises(ConfigError, match="tls_ca_cert"):
        ServerConfig(tls_verify=True, tls_cert=str(certs.server_cert), tls_key=str(certs.server_key))
    missing = str(tmp_path / "missing.pem")
    done = command("server_main", "--store", "memory", "-p", "0", "--tls", "--tlscert", missing, "--tlskey", missing)
    assert done.returncode == 2 and "cannot load the TLS certificate files" in done.stderr
