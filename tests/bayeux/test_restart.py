"""Messages published through the Bayeux door are in the durable log after a SIGKILL: each publish
reply waited for its commit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.bayeux.harness import bayeux_config, raw_client
from tests.support.servers import ServerProcess, eventually, running

pytestmark = pytest.mark.slow


def http_api_port(server: ServerProcess) -> int:
    for line in server.log:
        match = re.search(r"Listening for HTTP clients .* on [^:]+:(\d+)", line)
        if match:
            return int(match.group(1))
    raise AssertionError("no HTTP client port in the log:\n" + "\n".join(server.log))


async def test_bayeux_publishes_survive_a_sigkill(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    server = ServerProcess(["-p", "0", "--dir", str(directory), "--http_api_port", "-1"]).start()
    try:
        await eventually(lambda: any("Listening for HTTP clients" in line for line in server.log), within=10)
        async with raw_client(http_api_port(server)) as raw:
            await raw.handshake()
            for n in range(50):
                assert (await raw.publish("/kill/test", {"n": n}))["successful"]
        server.kill()  # right after the last reply: nothing was flushed on the way out
    finally:
        server.stop()
    async with running(bayeux_config(directory)) as srv:
        stored = srv.store.read("kill.test", 1, 100)
        assert [json.loads(m.data) for m in stored] == [{"n": n} for n in range(50)]
