"""The Grafana dashboard: well-formed, regular, generated from grafana/make_dashboard.py, and naming
only metrics a real server exposes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from grafana import make_dashboard
from streaming.ft.status import FtStatus
from streaming.observability.metrics import ft_metrics
from tests.observability.dashboard import expressions, load, metric_names, panels
from tests.observability.traffic import scripted_run
from tests.support.servers import config, running


class _Ft(Collector):
    def collect(self) -> Iterator[Metric]:
        return ft_metrics(FtStatus("main", "m1-0000"))


def test_the_committed_json_is_what_the_generator_writes() -> None:
    assert load() == json.loads(json.dumps(make_dashboard.dashboard()))


def test_panels_are_regular() -> None:
    dashboard = load()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == [
        "Overview",
        "Throughput",
        "Redelivery",
        "Ack latency vs AckWait",
        "Queue groups",
        "Storage",
        "Bayeux (HTTP clients)",
        "FT group",
        "Process",
    ]
    for panel in panels(dashboard):
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "channel", "group"} <= names


def test_every_rate_and_increase_uses_the_rate_interval() -> None:
    for title, expr in expressions(load()):
        for call in re.finditer(r"\b(rate|increase|irate)\(", expr):
            rest = expr[call.end() :]
            window = re.search(r"\[([^\]]*)\]", rest)
            assert window is not None and window.group(1) == "$__rate_interval", (title, expr)
        assert "irate(" not in expr, (title, expr)


async def test_every_metric_in_an_expression_exists_in_a_real_scrape(tmp_path: Path) -> None:
    async with running(config(tmp_path, http_port=-1, http_api_port=-1)) as server:
        async with scripted_run(server.port), httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{server.http_port}/metrics")).text
    exposed = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    # A server outside an FT group has no FT metrics: those are what every group member exposes.
    registry = CollectorRegistry()
    registry.register(_Ft())
    exposed |= {line.split("{")[0] for line in generate_latest(registry).decode().splitlines() if line[:1] != "#"}
    for title, expr in expressions(load()):
        for name in metric_names(expr):
            assert name in exposed, f"{title}: {name} is not in a scrape"
