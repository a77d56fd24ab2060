"""Fixtures for end-to-end tests that run on either NATS side: the embedded broker, or an external
nats-server that the server attaches to (`nats_server`), as users run either."""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import pytest

from bench.peers import NatsNode, nats_cluster
from tests.wire.backends import ServerThread, server_thread
from tests.wire.servers import config


@pytest.fixture(scope="session")
def external_nats() -> Iterator[NatsNode]:
    """One nats-server for the whole run (each test's server attaches to it and leaves)."""
    with nats_cluster(1) as (node,):
        yield node


@pytest.fixture(params=["embedded", "external"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    """A server for one test (in a thread of its own, so that the client may run under either
    backend), on the embedded broker or attached to an external nats-server; `port` is where clients
    connect either way."""
    cfg = config()
    node: NatsNode | None = request.getfixturevalue("external_nats") if request.param == "external" else None
    if node is not None:
        cfg = attrs.evolve(cfg, nats_server=node.url)
    with server_thread(cfg) as running:
        if node is not None:
            assert running.running is not None
            running.running.port = node.port
        yield running
