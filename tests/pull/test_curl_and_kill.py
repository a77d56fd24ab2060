"""The pull API driven by curl (a client no one here wrote), and a durable pull consumer resuming after
a SIGKILL with its unacknowledged message first."""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from streaming.running import Running
from tests.bayeux.test_restart import http_api_port
from tests.pull.harness import create, link, publish, pull_config
from tests.support.servers import ServerProcess, eventually, running

pytestmark = pytest.mark.slow
curl = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Running]:
    async with running(pull_config(tmp_path / "data")) as srv:
        yield srv


async def run_curl(*args: str) -> tuple[int, dict[str, str], list[str], bytes]:
    """curl with its response headers dumped: (status, headers, Link values, body)."""
    done = await trio.run_process(["curl", "-s", "-D", "-", *args], capture_stdout=True)
    head, _, body = done.stdout.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    links = re.findall(r"<([^>]+)>; rel=\"([a-z-]+)\"(?:; etag=\"([^\"]+)\")?", headers.get("link", ""))
    return status, headers, [f"{rel} {url} {etag}".strip() for url, rel, etag in links], body


def rel(links: list[str], name: str) -> list[str]:
    return next(entry.split(" ")[1:] for entry in links if entry.startswith(name + " "))


@curl
async def test_curl_publishes_pulls_and_acknowledges(server: Running) -> None:
    base = f"http://127.0.0.1:{server.http_api_port}"
    status, headers, _, _ = await run_curl("-X", "POST", "--data-binary", "hello", f"{base}/channels/shell/messages")
    assert status == 201 and headers["msg-sequence"] == "1"
    status, headers, links, _ = await run_curl(
        "-X", "POST", "-d", "start=first", f"{base}/channels/shell/pull-consumers"
    )
    assert status == 201
    (next_url,) = rel(links, "next")
    status, headers, links, body = await run_curl("-X", "POST", next_url)
    assert status == 200 and body == b"hello" and headers["msg-sequence"] == "1"
    ack_url, tag = rel(links, "acknowledgement")
    status, _, links, _ = await run_curl("-X", "POST", "-H", f'If-Match: "{tag}"', "-d", "acknowledge=true", ack_url)
    assert status == 204
    status, _, _, _ = await run_curl("-X", "POST", "-H", "Accept-Wait: 0.3", rel(links, "next")[0])
    assert status == 503


@curl
async def test_curl_nacks_with_a_delay_and_gets_the_message_back_after_it(server: Running) -> None:
    base = f"http://127.0.0.1:{server.http_api_port}"
    await run_curl("-X", "POST", "--data-binary", "retry me", f"{base}/channels/later/messages")
    _, _, links, _ = await run_curl("-X", "POST", "-d", "start=first", f"{base}/channels/later/pull-consumers")
    status, _, links, body = await run_curl("-X", "POST", rel(links, "next")[0])
    assert status == 200 and body == b"retry me"
    ack_url, tag = rel(links, "acknowledgement")
    status, _, links, _ = await run_curl(
        "-X", "POST", "-H", f'If-Match: "{tag}"', "-d", "acknowledge=false&delay=0.7", ack_url
    )
    assert status == 204
    started = trio.current_time()
    status, headers, links, body = await run_curl("-X", "POST", "-H", "Accept-Wait: 3", rel(links, "next")[0])
    assert status == 200 and body == b"retry me" and headers["msg-delivery-count"] == "2"
    assert trio.current_time() - started >= 0.7 - 0.05, "not back before its delay"
    ack_url, tag = rel(links, "acknowledgement")
    status, _, _, _ = await run_curl("-X", "POST", "-H", f'If-Match: "{tag}"', ack_url)
    assert status == 204


@curl
async def test_curl_sees_412_for_a_late_ack(server: Running) -> None:
    base = f"http://127.0.0.1:{server.http_api_port}"
    consumers = []
    for _ in range(2):
        _, _, links, _ = await run_curl(
            "-X", "POST", "-d", "group=G&ack_wait=1&start=first", f"{base}/channels/late/pull-consumers"
        )
        consumers.append(rel(links, "next")[0])
    await run_curl("-X", "POST", "--data-binary", "m1", f"{base}/channels/late/messages")
    first = None
    for url in consumers:
        status, _, links, body = await run_curl("-X", "POST", "-H", "Accept-Wait: 1", url)
        if status == 200:
            first = rel(links, "acknowledgement")
            break
    assert first is not None
    await trio.sleep(1.3)
    status, _, _, body = await run_curl("-X", "POST", "-H", f'If-Match: "{first[1]}"', first[0])
    assert status == 412 and b"stale-delivery" in body


async def test_a_durable_pull_consumer_resumes_after_sigkill_with_its_unacked_message_first(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    args = ["-p", "0", "--dir", str(directory), "--http_api_port", "-1"]
    server = ServerProcess(args).start()
    try:
        await eventually(lambda: any("Listening for HTTP clients" in line for line in server.log), within=10)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_api_port(server)}") as http:
            await publish(http, "kill", b"m1", b"m2", b"m3")
            made = await create(http, "kill", durable="D", start="first", max_inflight=2)
            one = await http.post(link(made, "next")["url"])
            two = await http.post(link(one, "next")["url"])
            assert (one.content, two.content) == (b"m1", b"m2")
            target = link(one, "acknowledgement")
            acked = await http.post(target["url"], headers={"If-Match": f'"{target["etag"]}"'})
            assert acked.status_code == 204  # stored before this answer
        server.kill()
    finally:
        server.stop()
    server = ServerProcess(args).start()
    try:
        await eventually(lambda: any("Listening for HTTP clients" in line for line in server.log), within=10)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_api_port(server)}") as http:
            again = await create(http, "kill", durable="D", max_inflight=2)
            first = await http.post(link(again, "next")["url"], headers={"Accept-Wait": "3"})
            assert first.content == b"m2" and first.headers["msg-redelivered"] == "true"
            second = await http.post(link(first, "next")["url"], headers={"Accept-Wait": "3"})
            assert second.content == b"m3"
    finally:
        server.stop()


@curl
async def test_curl_members_of_an_ordered_group_get_a_channels_next_message_only_after_an_ack(
    server: Running,
) -> None:
    base = f"http://127.0.0.1:{server.http_api_port}"
    for text in ("one", "two"):
        await run_curl("-X", "POST", "--data-binary", text, f"{base}/channels/seq/messages")
    nexts = []
    for _ in range(2):
        status, _, links, _ = await run_curl(
            "-X", "POST", "-d", "group=G&ordered=true&start=first&max_inflight=5", f"{base}/channels/seq/pull-consumers"
        )
        assert status == 201
        nexts.append(rel(links, "next")[0])
    status, _, links, body = await run_curl("-X", "POST", nexts[0])
    assert status == 200 and body == b"one"
    status, _, _, _ = await run_curl("-X", "POST", "-H", "Accept-Wait: 0.3", nexts[1])
    assert status == 503, "two waits until one is acknowledged"
    ack_url, tag = rel(links, "acknowledgement")
    status, _, _, _ = await run_curl("-X", "POST", "-H", f'If-Match: "{tag}"', ack_url)
    assert status == 204
    status, _, _, body = await run_curl("-X", "POST", "-H", "Accept-Wait: 2", nexts[1])
    assert status == 200 and body == b"two"
