"""A real Prometheus (Debian's `prometheus`) scrapes a real server on loopback while it carries traffic
with redeliveries, a queue member leaving and a dead letter; then every panel expression of the Grafana
dashboard (variables substituted as Grafana would with everything selected) must return data. And
`promtool check metrics` must find nothing to say about a real scrape."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from streaming.client import StartPosition, connect
from streaming.ft.status import ACTIVE, FtStatus
from tests.observability.dashboard import expressions, load, substitute
from tests.observability.traffic import scripted_run
from tests.support.servers import config, free_port, running

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None, reason="Debian package prometheus not installed (.ci/run installs it)"
)


async def query(http: httpx.AsyncClient, expr: str) -> list[Any]:
    response = await http.get("/api/v1/query", params={"query": expr})
    body = response.json()
    assert body["status"] == "success", (expr, body)
    result: list[Any] = body["data"]["result"]
    return result


async def wait_ready(http: httpx.AsyncClient, proc: trio.Process) -> None:
    for _ in range(150):
        assert proc.poll() is None, "prometheus exited"
        try:
            if (await http.get("/-/ready")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await trio.sleep(0.2)
    raise AssertionError("Prometheus did not become ready in 30 s")


async def keep_busy(port: int, seconds: float) -> None:
    """Steady publishing and consuming, so rates over the scrapes are not zero."""
    async with connect("test-cluster", "mon-load", port=port) as sc:
        async with sc.subscribe("load", queue="loaders", start_at=StartPosition.NEW_ONLY, manual_ack=True) as sub:
            with trio.move_on_after(seconds):
                while True:
                    await sc.publish("load", b"load")
                    (await sub.next_msg()).ack()
                    await trio.sleep(0.02)


@needs_prometheus
async def test_every_dashboard_expression_returns_data_from_a_real_prometheus(tmp_path: Path) -> None:
    assert PROMETHEUS is not None
    prom_port = free_port()
    async with running(config(tmp_path / "data", http_port=-1, http_api_port=-1)) as server:
        # The FT group row's metrics come from a group member's status (streaming.ft.group fills it in
        # on the active it runs): this server shows one, so that the row's queries are checked too.
        server.ft = FtStatus("main", "m1-0000", state=ACTIVE, epoch=1, takeovers=1)
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: streaming\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{server.http_port}']\n"
        )
        proc = await trio.lowlevel.open_process(
            [
                PROMETHEUS,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{prom_port}") as http:
                await wait_ready(http, proc)
                await keep_busy(server.port, 2.5)
                async with scripted_run(server.port):
                    await keep_busy(server.port, 3.0)
                    # Three more scrapes after the last event, so every counter has moved within 30s.
                    for _ in range(60):  # Prometheus is polled: it has nothing to wait on
                        if await query(http, 'count_over_time(up{job="streaming"}[30s]) > 8'):
                            break
                        await trio.sleep(0.5)
                    else:
                        raise AssertionError("Prometheus did not scrape the server")
                    await trio.sleep(3)
                    assert (await query(http, 'up{job="streaming"}'))[0]["value"][1] == "1"
                    empty = []
                    for title, expr in expressions(load()):
                        if not await query(http, substitute(expr)):
                            empty.append((title, expr))
                    assert not empty, empty
        finally:
            proc.terminate()
            with trio.fail_after(10):
                await proc.wait()


@needs_prometheus
async def test_promtool_finds_nothing_wrong_with_a_real_scrape(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    async with running(config(tmp_path, http_port=-1)) as server:
        async with scripted_run(server.port), httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{server.http_port}/metrics")).text
    with trio.fail_after(30):
        result = await trio.run_process(
            [PROMTOOL, "check", "metrics"], stdin=text.encode(), capture_stdout=True, capture_stderr=True, check=False
        )
    assert result.returncode == 0 and not result.stdout and not result.stderr, (result.stdout, result.stderr)
