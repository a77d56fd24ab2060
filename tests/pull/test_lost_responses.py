"""Responses lost on the wire, through a loopback proxy that swallows one response and closes its
connection: the server did the work, the client never heard. Retrying the step link returns the same
delivery; retrying the ack is answered as the first, and neither changes what the engine holds."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from streaming.running import Running
from tests.bayeux.harness import Proxy
from tests.pull.harness import create, link, pending, publish

pytestmark = pytest.mark.slow


@pytest.fixture
async def proxied(server: Running) -> AsyncIterator[tuple[Proxy, httpx.AsyncClient]]:
    proxy = Proxy(server.http_api_port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{proxy.port}", timeout=10) as client:
            yield proxy, client
        nursery.cancel_scope.cancel()


async def test_a_pull_whose_response_was_lost_is_repeated_by_its_step(
    proxied: tuple[Proxy, httpx.AsyncClient], server: Running
) -> None:
    proxy, http = proxied
    await publish(http, "lostpull", b"first-body", b"second-body")
    made = await create(http, "lostpull", start="first", max_inflight=2)
    step1 = link(made, "next")["url"]
    proxy.swallow(b"first-body")
    with pytest.raises(httpx.TransportError):
        await http.post(step1)
    assert proxy.swallowed, "the proxy did not see the response"
    assert pending(server, "lostpull") == 1, "the lost pull took one message"
    again = await http.post(step1)
    assert again.status_code == 200 and again.content == b"first-body"
    assert again.headers["msg-delivery-count"] == "1", "a repeated step is not a redelivery"
    tag = link(again, "acknowledgement")["etag"]
    # The lost response's head reached the first connection before its body was swallowed.
    assert tag in bytes(proxy.log[0]).decode(), "the repeat carries the lost response's tag"
    following = await http.post(link(again, "next")["url"])
    assert following.content == b"second-body"


async def test_an_ack_whose_response_was_lost_is_answered_again(
    proxied: tuple[Proxy, httpx.AsyncClient], server: Running
) -> None:
    proxy, http = proxied
    await publish(http, "lostack", b"m1")
    made = await create(http, "lostack", start="first", ack_wait=1)
    pulled = await http.post(link(made, "next")["url"])
    target = link(pulled, "acknowledgement")
    request = {"headers": {"If-Match": f'"{target["etag"]}"'}, "data": {"acknowledge": "true"}}
    proxy.swallow(b" 204 ")
    with pytest.raises(httpx.TransportError):
        await http.post(target["url"], **request)  # type: ignore[arg-type]
    assert proxy.swallowed
    assert pending(server, "lostack") == 0, "the ack was carried out before its response was lost"
    again = await http.post(target["url"], **request)  # type: ignore[arg-type]
    assert again.status_code == 204
    await trio.sleep(1.3)  # past the AckWait: nothing comes back
    nothing = await http.post(link(again, "next")["url"], headers={"Accept-Wait": "0.3"})
    assert nothing.status_code == 503
    assert pending(server, "lostack") == 0
