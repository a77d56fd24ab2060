"""Fixtures for end-to-end tests that run on either NATS side: the embedded broker, or an external
nats-server that the server attaches to (`nats_server`), as users run either."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import attrs
import pytest

from streaming.config import ServerConfig
from streaming.running import Running
from tests.cluster.harness import NatsNode, nats_cluster
from tests.wire.servers import running

Serve = Callable[[ServerConfig], AbstractAsyncContextManager[Running]]


@pytest.fixture(scope="session")
def external_nats() -> Iterator[NatsNode]:
    """One nats-server for the whole run (each test's server attaches to it and leaves)."""
    with nats_cluster(1) as (node,):
        yield node


@pytest.fixture(params=["embedded", "external"])
def stan_server(request: pytest.FixtureRequest) -> Serve:
    """Run a server for one test, on the embedded broker or attached to an external nats-server; the
    Running's `port` is where clients connect either way."""
    node: NatsNode | None = request.getfixturevalue("external_nats") if request.param == "external" else None

    @asynccontextmanager
    async def serve(cfg: ServerConfig) -> AsyncIterator[Running]:
        if node is not None:
            cfg = attrs.evolve(cfg, nats_server=node.url)
        async with running(cfg) as server:
            if node is not None:
                server.port = node.port
            yield server

    return serve
