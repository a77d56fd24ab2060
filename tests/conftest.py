"""Test-wide settings and fixtures: Hypothesis profiles (CI runs more examples than a local run), and a
server on either NATS side for end-to-end tests: the embedded broker, or an external nats-server
that the server attaches to (`nats_server`), as users run either."""

from __future__ import annotations

import os
from collections.abc import Iterator

import attrs
import pytest
from hypothesis import HealthCheck, settings

from bench.peers import NatsNode, nats_cluster
from tests.support.backends import ServerThread, server_thread
from tests.support.servers import config

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


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
