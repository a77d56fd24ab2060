"""What the HTTP pull tests share: a server config with short timers, and the client's steps (publish,
make a consumer, follow a link, ack) over httpx."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from streaming.running import Running
from tests.support.servers import config

FAST: dict[str, Any] = {"http_api_port": -1, "pull_tombstone_ttl": 4.0, "pull_max_wait": 5.0}


def pull_config(directory: Path, **overrides: Any) -> Any:
    return config(directory, **{**FAST, **overrides})


def link(response: httpx.Response, rel: str) -> dict[str, str]:
    found = response.links.get(rel)
    assert found is not None, (rel, response.headers.get("link"))
    return found


async def publish(http: httpx.AsyncClient, channel: str, *bodies: bytes) -> list[int]:
    seqs = []
    for body in bodies:
        response = await http.post(f"/channels/{channel}/messages", content=body)
        assert response.status_code == 201, response.text
        seqs.append(int(response.headers["msg-sequence"]))
    return seqs


async def create(http: httpx.AsyncClient, channel: str, **params: Any) -> httpx.Response:
    response = await http.post(f"/channels/{channel}/pull-consumers", data={k: str(v) for k, v in params.items()})
    assert response.status_code == 201, response.text
    return response


async def ack(
    http: httpx.AsyncClient, pulled: httpx.Response, *, acknowledge: bool = True, tag: str | None = None
) -> httpx.Response:
    target = link(pulled, "acknowledgement")
    etag = tag if tag is not None else f'"{target["etag"]}"'
    return await http.post(
        target["url"], headers={"If-Match": etag}, data={"acknowledge": "true" if acknowledge else "false"}
    )


def pending(server: Running, channel: str) -> int:
    return sum(v.pending_count for v in server.core.engine.views() if v.record.channel == channel)
