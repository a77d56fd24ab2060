"""A standby's monitoring port: `/streaming/serverz` (where it stands in its group) and `/metrics`
(the group's gauges). The active serves the full monitoring pages instead (streaming.observability)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from streaming.ft.status import FtStatus
from streaming.observability.metrics import ft_metrics


class _FtCollector(Collector):
    def __init__(self, status: FtStatus) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        return ft_metrics(self.status)


def standby_app(cluster_id: str, server_name: str, status: FtStatus) -> Starlette:
    registry = CollectorRegistry()
    registry.register(_FtCollector(status))

    async def serverz(request: Request) -> Response:
        page = {"cluster_id": cluster_id, "server_id": status.member, "server_name": server_name, "state": status.state}
        return JSONResponse({**page, **status.as_json()})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/streaming/serverz", serverz), Route("/metrics", metrics)])
