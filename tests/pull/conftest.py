"""A running server with the HTTP API on a free port, and an httpx client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from streaming.running import Running
from tests.pull.harness import pull_config
from tests.support.servers import running


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Running]:
    async with running(pull_config(tmp_path / "data")) as srv:
        yield srv


@pytest.fixture
async def http(server: Running) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_api_port}", timeout=30) as client:
        yield client
