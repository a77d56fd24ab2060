"""CORS on the client-facing HTTP listener, over real HTTP: preflights answered for allowed origins,
the pull API's headers exposed to pages, credentials only for listed origins, nothing for others, and
the configuration refusing what is not an origin."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest

from streaming.config import ConfigError
from tests.pull.harness import create, pull_config
from tests.support.servers import running

APP = "https://app.example"
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, if-match"}


async def test_a_listed_origin_is_answered_with_credentials_and_the_pull_headers_exposed(tmp_path: Path) -> None:
    async with running(pull_config(tmp_path / "d", http_api_allow_origins=[APP, "http://localhost:8000"])) as server:
        base = f"http://127.0.0.1:{server.http_api_port}"
        async with httpx.AsyncClient(base_url=base) as http:
            pre = await http.options("/channels/c/pull-consumers", headers={"Origin": APP, **PREFLIGHT})
            assert pre.status_code == 200
            assert pre.headers["access-control-allow-origin"] == APP
            assert pre.headers["access-control-allow-credentials"] == "true"
            assert "POST" in pre.headers["access-control-allow-methods"]
            allowed = pre.headers["access-control-allow-headers"].lower()
            assert "authorization" in allowed and "if-match" in allowed
            cometd = await http.options("/cometd", headers={"Origin": APP, **PREFLIGHT})
            assert cometd.status_code == 200 and cometd.headers["access-control-allow-origin"] == APP

            await http.post("/channels/c/messages", content=b"hello", headers={"Origin": APP})
            made = await http.post("/channels/c/pull-consumers", headers={"Origin": APP})
            assert made.status_code == 201
            assert made.headers["access-control-allow-origin"] == APP
            exposed = {h.strip().lower() for h in made.headers["access-control-expose-headers"].split(",")}
            assert {"etag", "link", "location", "msg-sequence", "msg-redelivered"} <= exposed
            assert "origin" in made.headers.get("vary", "").lower()


async def test_an_origin_not_listed_gets_no_cors_headers_and_its_preflight_is_refused(tmp_path: Path) -> None:
    async with running(pull_config(tmp_path / "d", http_api_allow_origins=[APP])) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_api_port}") as http:
            headers = {"Origin": "https://evil.example"}
            pre = await http.options("/channels/c/pull-consumers", headers={**headers, **PREFLIGHT})
            assert pre.status_code == 400 and "access-control-allow-origin" not in pre.headers
            made = await create(http, "c")  # the request itself is served: the browser keeps the page from it
            assert "access-control-allow-origin" not in made.headers
            foreign = await http.post("/channels/c/pull-consumers", headers=headers)
            assert "access-control-allow-origin" not in foreign.headers


async def test_any_origin_means_no_credentials(tmp_path: Path) -> None:
    async with running(pull_config(tmp_path / "d", http_api_allow_origins=["*"])) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_api_port}") as http:
            pre = await http.options("/channels/c/pull-consumers", headers={"Origin": APP, **PREFLIGHT})
            assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "*"
            assert "access-control-allow-credentials" not in pre.headers
            made = await http.post("/channels/c/pull-consumers", headers={"Origin": APP})
            assert made.headers["access-control-allow-origin"] == "*"


async def test_without_allowed_origins_there_is_no_cors(tmp_path: Path) -> None:
    async with running(pull_config(tmp_path / "d")) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_api_port}") as http:
            pre = await http.options("/channels/c/pull-consumers", headers={"Origin": APP, **PREFLIGHT})
            assert "access-control-allow-origin" not in pre.headers
            made = await http.post("/channels/c/pull-consumers", headers={"Origin": APP})
            assert "access-control-allow-origin" not in made.headers


async def test_a_refusal_for_missing_credentials_is_readable_by_the_page_and_preflights_need_none(
    tmp_path: Path,
) -> None:
    cfg = pull_config(tmp_path / "d", http_api_allow_origins=[APP], user="alice", password="s3cret")
    async with running(cfg) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_api_port}") as http:
            pre = await http.options("/channels/c/pull-consumers", headers={"Origin": APP, **PREFLIGHT})
            assert pre.status_code == 200, "a preflight carries no credentials and is answered"
            refused = await http.post("/channels/c/pull-consumers", headers={"Origin": APP})
            assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == APP
            basic = "Basic " + base64.b64encode(b"alice:s3cret").decode()
            made = await http.post("/channels/c/pull-consumers", headers={"Origin": APP, "Authorization": basic})
            assert made.status_code == 201 and made.headers["access-control-allow-credentials"] == "true"


@pytest.mark.parametrize(
    "origins",
    [["*", APP], ["https://app.example/path"], ["app.example"], ["ftp://app.example"], ["https://u:p@app.example"]],
)
def test_what_is_not_an_origin_is_refused_by_the_configuration(tmp_path: Path, origins: list[str]) -> None:
    with pytest.raises(ConfigError, match="http_api_allow_origins"):
        pull_config(tmp_path / "d", http_api_allow_origins=origins)
