"""Real pages in a real browser (headless Chromium from Debian, driven by Playwright), served from a
second origin: the CometD client over WebSocket and long-polling with the ack extension, a publishing
page, a pull consumer written with fetch(), a page from an origin the server does not allow, and the
live example page."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.harness import (
    CHROMIUM,
    CHROMIUM_ARGS,
    NODE_DIR,
    ROOT,
    Server,
    browser_tests,
    node_publish,
    site,
    wait_until,
)

pytestmark = [browser_tests, pytest.mark.slow]


@pytest.fixture(scope="module")
def site_port() -> Iterator[int]:
    with site() as port:
        yield port


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def server(tmp_path: Path, site_port: int) -> Iterator[Server]:
    srv = Server(tmp_path / "data", f"http://127.0.0.1:{site_port}").start()
    try:
        yield srv
    finally:
        srv.stop()


def state(page: Any) -> dict[str, Any]:
    value: dict[str, Any] = page.evaluate("() => window.state ?? {}")
    return value


@pytest.mark.parametrize("transport", ["websocket", "long-polling"])
def test_a_cometd_page_gets_what_node_nats_streaming_publishes_in_order_across_a_restart(
    browser: Any, server: Server, site_port: int, transport: str
) -> None:
    page = browser.new_page()
    query = f"api={server.api}&transport={transport}&channel=/browser/feed&durable=page-{transport}"
    page.goto(f"http://127.0.0.1:{site_port}/subscriber.html?{query}")
    wait_until(lambda: state(page).get("subscribed", 0) >= 1, what="the page's subscription")
    node_publish(server, "browser.feed", 0, 10)
    wait_until(lambda: len(state(page)["received"]) >= 10, what="the first ten messages")
    time.sleep(0.5)  # the page's next connect acknowledges them (else they come again: at least once)

    server.stop()  # the page's connection breaks; the CometD client retries
    server.start()
    node_publish(server, "browser.feed", 10, 20)  # very likely before the page is back: its durable keeps them
    wait_until(lambda: len(state(page)["received"]) >= 20, within=30, what="all twenty messages")
    seen = state(page)
    assert seen["received"] == [{"n": n} for n in range(20)], "lost, duplicated or out of order"
    assert len(seen["handshakes"]) >= 2 and seen["subscribed"] >= 2, "a new session after the restart"
    assert seen["errors"] == []
    if transport == "websocket":
        assert set(seen["connects"]) == {"websocket"}, seen["connects"]
    else:
        assert set(seen["connects"]) == {"long-polling"}, seen["connects"]
    page.close()


def test_a_publishing_page_reaches_a_stan_subscriber(browser: Any, server: Server, site_port: int) -> None:
    env = {**os.environ, "COUNT": "10"}
    argv = ["node", str(NODE_DIR / "driver.js"), "collect_json", str(server.nats_port), "browser.out"]
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) as collector:
        assert collector.stdout is not None
        assert json.loads(collector.stdout.readline())["phase"] == "subscribed"
        page = browser.new_page()
        query = f"api={server.api}&transport=websocket&channel=/browser/out&count=10"
        page.goto(f"http://127.0.0.1:{site_port}/publisher.html?{query}")
        wait_until(lambda: state(page).get("done"), what="the page's publishes")
        assert state(page)["answers"] == [True] * 10 and state(page)["transport"] == "websocket"
        result = json.loads(collector.stdout.readline())
        collector.wait(10)
    assert result["ok"] and result["got"] == [{"n": n} for n in range(10)]
    page.close()


def test_a_fetch_pull_consumer_reads_the_headers_and_acks_with_its_etag(
    browser: Any, server: Server, site_port: int
) -> None:
    node_publish(server, "browserpull", 0, 1)
    page = browser.new_page()
    page.goto(f"http://127.0.0.1:{site_port}/pull.html?api={server.api}&channel=browserpull")
    wait_until(lambda: state(page).get("result") or state(page).get("error"), what="the pull page")
    assert state(page)["error"] is None, state(page)["error"]
    result = state(page)["result"]
    assert result["created"] == 201 and result["consumer"].startswith(server.api)
    assert result["pulled"] == 200 and json.loads(result["body"]) == {"n": 0}
    assert result["sequence"] == "1" and result["redelivered"] == "false"
    assert "acknowledgement" in result["links"] and "next" in result["links"]
    assert result["etag"], "the page can read ETag"
    assert (result["ack"], result["stale"]) == (204, 412)
    page.close()


def test_a_page_from_an_origin_not_allowed_is_refused_by_the_browser_and_its_socket_by_the_server(
    browser: Any, server: Server, site_port: int
) -> None:
    page = browser.new_page()
    page.goto(f"http://localhost:{site_port}/refused.html?api={server.api}")  # another origin: not allowed
    wait_until(lambda: state(page).get("fetch") and state(page).get("socket"), what="the refused page")
    assert state(page) == {"fetch": "refused", "socket": "refused"}
    wait_until(lambda: f"origin 'http://localhost:{site_port}' is not allowed" in server.log(), what="the log line")
    page.close()


def test_the_live_page_shows_messages_acks_them_and_shows_the_others_come_back(
    browser: Any, server: Server, site_port: int
) -> None:
    page = browser.new_page(viewport={"width": 1000, "height": 520})
    page.goto(f"http://127.0.0.1:{site_port}/example/index.html")
    page.fill("#api", server.api)
    page.fill("#channel", "orders")
    page.fill("#ackwait", "2")
    page.click("#go")
    page.wait_for_selector("#status:has-text('Open on orders')")
    node_publish(server, "orders", 0, 3)
    page.fill("#text", "from the page")
    page.click("#send")
    page.wait_for_function("document.querySelectorAll('#rows tr').length === 4")
    page.click("#rows tr[data-seq='1'] button")
    page.wait_for_selector("#rows tr[data-seq='1'].acked")
    # Seq 2, 3 and 4 are not acknowledged: they come back after AckWait, marked as redeliveries.
    page.wait_for_selector("#rows tr[data-seq='2'].redelivered", timeout=15000)
    page.wait_for_selector("#rows tr[data-seq='4'].redelivered", timeout=15000)
    assert page.inner_text("#rows tr[data-seq='4'] .data") == "from the page"
    assert "redelivered (#2)" in page.inner_text("#rows tr[data-seq='3'] .flag")
    assert "acked" in (page.get_attribute("#rows tr[data-seq='1']", "class") or "")
    shot = os.environ.get("LIVE_PAGE_SCREENSHOT")  # docs/images/live-page.png is taken this way
    page.screenshot(path=shot or str(server.directory.parent / "live-page.png"))
    page.close()


def test_the_screenshot_in_the_docs_is_of_this_page() -> None:
    assert (ROOT / "docs" / "images" / "live-page.png").is_file()
