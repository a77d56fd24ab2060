"""The server on a secured nats-server: it logs in as the cluster asks (user and password, token,
nkey seed, TLS client certificate), a refused login stops its start with the cluster's words, and the
permissions docs/security.md gives keep clients off the server's subjects and each other's inboxes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import nats
import nkeys
import pytest
import trio

from bench.peers import NatsNode, nats_cluster
from streaming.client import StartPosition, connect
from streaming.wire.stan_pb import protocol_pb2 as pb
from tests.cluster.creds import operator_mode
from tests.support.certs import make_certs
from tests.support.servers import ATTACHED, ServerProcess

pytestmark = pytest.mark.slow
DOCS = Path(__file__).parents[2] / "docs" / "security.md"


def documented_authorization() -> str:
    return DOCS.read_text().split("## On an external NATS cluster", 1)[1].split("```\n", 2)[1]


def attached(*args: str) -> ServerProcess:
    return ServerProcess(["--store", "memory", *args], ready=ATTACHED)


async def round_trip(port: int, cluster_id: str, channel: str, **options: object) -> list[bytes]:
    """Publish two messages, read them back with manual acks."""
    async with connect(cluster_id, "app", port=port, **options) as sc:  # type: ignore[arg-type]
        await sc.publish(channel, b"one")
        await sc.publish(channel, b"two")
        async with sc.subscribe(channel, manual_ack=True, start_at=StartPosition.FIRST) as sub:
            with trio.fail_after(5):
                got = [await sub.next_msg() for _ in range(2)]
            for m in got:
                m.ack()
            return [m.data for m in got]


def test_the_documented_permissions_on_a_real_cluster() -> None:
    with nats_cluster(1, extra=documented_authorization()) as (node,):
        url = f"nats://streaming:streaming-secret@127.0.0.1:{node.port}"
        server = attached("-cid", "prod", "-ns", url).start()
        try:
            client = {"user": "orders", "password": "orders-secret", "inbox_prefix": "_INBOX_orders"}
            assert trio.run(lambda: round_trip(node.port, "prod", "orders.eu", **client)) == [b"one", b"two"]
            assert asyncio.run(refusals(node)) == [
                'permissions violation for subscription to "_stan.>"',
                'permissions violation for subscription to "_inbox.>"',
                'permissions violation for publish to "_stan.pub.prod.billing"',
            ]
        finally:
            server.stop()

        refused = attached("-cid", "prod", "-ns", f"nats://streaming:wrong@127.0.0.1:{node.port}")
        with pytest.raises(RuntimeError, match="did not start"):
            refused.start()
        assert refused.proc is not None and refused.proc.wait(10) == 1
        assert any("Authorization Violation" in line for line in refused.log), refused.log


async def refusals(node: NatsNode) -> list[str]:
    """What a client user is refused: the server's subjects, other clients' inboxes, other channels."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    nc = await nats.connect(node.url, user="orders", password="orders-secret", error_cb=on_error)
    try:
        await nc.subscribe("_STAN.>")
        await nc.subscribe("_INBOX.>")
        await nc.publish("_STAN.pub.prod.billing", b"forged")
        await nc.flush()
        for _ in range(100):
            if len(errors) >= 3:
                break
            await asyncio.sleep(0.02)
    finally:
        await nc.close()
    return [e.removeprefix("nats: ") for e in errors]


@pytest.mark.parametrize("how", ["token", "nkey seed", "credentials file", "tls client certificate"])
def test_the_server_logs_in_as_the_cluster_asks(how: str, tmp_path: Path) -> None:
    args: list[str] = []
    client: dict[str, object] = {}
    if how == "token":
        extra = 'authorization { token: "s3cret" }'
        url = "nats://s3cret@127.0.0.1:{port}"
        client = {"token": "s3cret"}
    elif how == "credentials file":  # operator mode: JWTs, as nsc makes them
        extra, creds = operator_mode(tmp_path)
        url = "nats://127.0.0.1:{port}"
        args = ["--nats_creds", str(creds)]
    elif how == "nkey seed":
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        public = nkeys.from_seed(bytearray(seed)).public_key.decode()
        (tmp_path / "user.nk").write_bytes(seed)
        extra = f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}'
        url = "nats://127.0.0.1:{port}"
        args = ["--nats_nkey_seed", str(tmp_path / "user.nk")]
        client = {}
    else:
        certs = make_certs(tmp_path)
        extra = (
            f'tls {{ cert_file: "{certs.server_cert}", key_file: "{certs.server_key}", '
            f'ca_file: "{certs.ca}", verify: true }}'
        )
        url = "nats://127.0.0.1:{port}"
        args = [
            "--tls_client_cert",
            str(certs.client_cert),
            "--tls_client_key",
            str(certs.client_key),
            "--tls_client_cacert",
            str(certs.ca),
        ]
        client = {"tls": certs.client_context()}
    with nats_cluster(1, extra=extra) as (node,):
        server = attached("-ns", url.format(port=node.port), *args).start()
        try:
            if how == "nkey seed":  # our client has no nkey login: nats-py connects as a STAN client would
                assert asyncio.run(stan_connect_round_trip(node, nkeys_seed_str=seed.decode())) == b"pong"
            elif how == "credentials file":
                assert asyncio.run(stan_connect_round_trip(node, user_credentials=str(creds))) == b"pong"
            else:
                assert trio.run(lambda: round_trip(node.port, "test-cluster", "foo", **client)) == [b"one", b"two"]
        finally:
            server.stop()
        if how == "tls client certificate":  # without its certificate it is refused
            bare = attached("-ns", url.format(port=node.port), "--tls_client_cacert", str(certs.ca))
            with pytest.raises(RuntimeError, match="did not start"):
                bare.start()
            assert any("cannot connect to the NATS server" in line for line in bare.log), bare.log


async def stan_connect_round_trip(node: NatsNode, **login: str) -> bytes:
    """The STAN server answers a connect request sent by a nats-py client logged in as given."""
    nc = await nats.connect(node.url, **login)
    try:
        request = pb.ConnectRequest(clientID="nk", heartbeatInbox="_INBOX.hb", protocol=1, connID=b"c1")
        reply = await nc.request("_STAN.discover.test-cluster", request.SerializeToString(), timeout=5)
        response = pb.ConnectResponse.FromString(reply.data)
        assert not response.error and response.pubPrefix == "_STAN.pub.test-cluster"
        return b"pong"
    finally:
        await nc.close()
