"""Pull consumers take messages on demand: nothing waits in a consumer that is not pulling (its AckWait
does not run, an idle queue member holds nothing), a nack goes back to the whole group at once, a
durable name keeps the queue group it was made with, the publisher's Content-Type comes back with the
message, and the Artemis `msg-*` link headers are there when asked for. Real TCP, httpx."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from streaming.client import connect
from streaming.running import Running
from tests.pull.harness import ack, create, link, pending, publish, pull_config
from tests.support.servers import running

pytestmark = pytest.mark.slow


async def test_a_message_waits_in_the_channel_until_it_is_pulled(http: httpx.AsyncClient, server: Running) -> None:
    await publish(http, "lazy", b"m1", b"m2")
    made = await create(http, "lazy", start="first", ack_wait=1, max_inflight=2)
    assert pending(server, "lazy") == 0, "the engine sent messages nobody asked for"
    await trio.sleep(1.3)  # longer than the AckWait: it must not have started
    pulled = await http.post(link(made, "next")["url"])
    assert pulled.status_code == 200 and pulled.content == b"m1"
    assert pulled.headers["msg-delivery-count"] == "1" and pulled.headers["msg-redelivered"] == "false"
    assert pending(server, "lazy") == 1, "one pull, one message taken from the channel"
    assert (await ack(http, pulled)).status_code == 204
    assert pending(server, "lazy") == 0, "an ack refilled a consumer that is not pulling"
    second = await http.post(link(pulled, "next")["url"])
    assert second.content == b"m2" and second.headers["msg-delivery-count"] == "1"


async def test_an_idle_member_holds_nothing_its_group_could_use(http: httpx.AsyncClient, server: Running) -> None:
    idle = await create(http, "idle", group="G", start="first", max_inflight=5)
    busy = await create(http, "idle", group="G", start="first", max_inflight=5)
    await publish(http, "idle", b"m1", b"m2", b"m3")
    next_url = link(busy, "next")["url"]
    got = []
    for _ in range(3):
        pulled = await http.post(next_url, headers={"Accept-Wait": "1"})
        assert pulled.status_code == 200, "the idle member holds a message"
        got.append(pulled.content)
        assert (await ack(http, pulled)).status_code == 204
        next_url = link(pulled, "next")["url"]
    assert got == [b"m1", b"m2", b"m3"]
    nothing = await http.post(link(idle, "next")["url"], headers={"Accept-Wait": "0.3"})
    assert nothing.status_code == 503
    assert pending(server, "idle") == 0


async def test_a_nack_in_a_queue_group_goes_to_the_next_member_that_pulls(
    http: httpx.AsyncClient, server: Running
) -> None:
    a = await create(http, "nackg", group="G", start="first")  # AckWait 30 s: only the nack can move it
    b = await create(http, "nackg", group="G", start="first")
    await publish(http, "nackg", b"m1")
    from_a = await http.post(link(a, "next")["url"], headers={"Accept-Wait": "1"})
    assert from_a.status_code == 200 and from_a.content == b"m1"
    assert (await ack(http, from_a, acknowledge=False)).status_code == 204
    with trio.fail_after(2):  # at once, not after an AckWait
        from_b = await http.post(link(b, "next")["url"], headers={"Accept-Wait": "1"})
    assert from_b.status_code == 200 and from_b.content == b"m1"
    assert from_b.headers["msg-redelivered"] == "true" and from_b.headers["msg-delivery-count"] == "2"
    assert (await ack(http, from_a)).status_code == 409, "acking the nacked delivery"
    assert (await ack(http, from_b)).status_code == 204
    assert pending(server, "nackg") == 0
    for member in (a, b):
        nothing = await http.post(link(member, "consumer")["url"] + "/next", headers={"Accept-Wait": "0.3"})
        assert nothing.status_code == 503, "m1 came back after its ack"


async def test_a_member_waiting_for_a_message_is_woken_by_another_members_nack(http: httpx.AsyncClient) -> None:
    a = await create(http, "wake", group="G", start="first")
    b = await create(http, "wake", group="G", start="first")
    await publish(http, "wake", b"m1")
    from_a = await http.post(link(a, "next")["url"], headers={"Accept-Wait": "1"})
    assert from_a.content == b"m1"
    got: list[httpx.Response] = []
    async with trio.open_nursery() as nursery:

        async def wait_on_b() -> None:
            got.append(await http.post(link(b, "next")["url"], headers={"Accept-Wait": "5"}))

        nursery.start_soon(wait_on_b)
        await trio.sleep(0.3)
        with trio.fail_after(2):
            assert (await ack(http, from_a, acknowledge=False)).status_code == 204
    assert got[0].status_code == 200 and got[0].content == b"m1"


async def test_a_durable_name_keeps_its_queue_group(http: httpx.AsyncClient) -> None:
    await create(http, "names", durable="D", group="G")
    for params in ({"durable": "D"}, {"durable": "D", "group": "H"}):
        refused = await http.post("/channels/names/pull-consumers", data=params)
        assert refused.status_code == 409, params
        assert "queue group 'G'" in refused.json()["detail"]
    await create(http, "names", durable="D", group="G")  # a second member of the same group is fine
    await create(http, "names", durable="E")
    refused = await http.post("/channels/names/pull-consumers", data={"durable": "E", "group": "G"})
    assert refused.status_code == 409 and "no queue group" in refused.json()["detail"]


async def test_the_publishers_content_type_comes_back_with_the_message(
    http: httpx.AsyncClient, server: Running
) -> None:
    made = await create(http, "typed")
    url = link(made, "next")["url"]
    sent = await http.post("/channels/typed/messages", content=b'{"a":1}', headers={"Content-Type": "application/json"})
    assert sent.status_code == 201
    pulled = await http.post(url)
    assert pulled.headers["content-type"] == "application/json" and pulled.json() == {"a": 1}
    assert (await ack(http, pulled)).status_code == 204
    async with connect("test-cluster", "typer", port=server.port) as stan:
        await stan.publish("typed", b"\x00\x01")  # STAN has no content type
    bare = await http.post(link(pulled, "next")["url"], headers={"Accept-Wait": "2"})
    assert bare.headers["content-type"] == "application/octet-stream" and bare.content == b"\x00\x01"
    latin = "text/plain; \u00e9=1".encode("latin-1")  # HTTP allows it; the store keeps ASCII only
    refused = await http.post("/channels/typed/messages", content=b"x", headers={b"Content-Type": latin})
    assert refused.status_code == 400 and refused.json()["parameter"] == "Content-Type"


async def test_artemis_link_headers_when_asked_for(tmp_path: Path) -> None:
    async with (
        running(pull_config(tmp_path / "data", pull_msg_headers=True)) as srv,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.http_api_port}", timeout=30) as http,
    ):
        await publish(http, "artemis", b"m1", b"m2")
        channel = await http.get("/channels/artemis")
        assert channel.headers["msg-create"] == link(channel, "create")["url"]
        assert channel.headers["msg-pull-consumers"] == link(channel, "pull-consumers")["url"]
        made = await create(http, "artemis", start="first")
        assert made.headers["msg-consumer"] == made.headers["location"]
        assert made.headers["msg-acknowledge-next"] == link(made, "next")["url"]
        pulled = await http.post(made.headers["msg-acknowledge-next"])
        assert pulled.headers["msg-acknowledgement"] == link(pulled, "acknowledgement")["url"]
        auto = await create(http, "artemis", start="first", ack="auto")
        assert auto.headers["msg-consume-next"] == link(auto, "next")["url"]
        assert "msg-acknowledge-next" not in auto.headers


async def test_an_ordered_group_hands_out_one_message_of_the_channel_at_a_time(
    http: httpx.AsyncClient, server: Running
) -> None:
    a = await create(http, "ordered", group="O", ordered="true", start="first", max_inflight=5)
    b = await create(http, "ordered", group="O", ordered="true", start="first", max_inflight=5)
    await publish(http, "ordered", b"m1", b"m2")
    first = await http.post(link(a, "next")["url"], headers={"Accept-Wait": "1"})
    assert first.status_code == 200 and first.content == b"m1"
    held = await http.post(link(b, "next")["url"], headers={"Accept-Wait": "0.3"})
    assert held.status_code == 503, "m2 waits until m1 is acked, whoever asks"
    assert (await ack(http, first)).status_code == 204
    second = await http.post(link(b, "next")["url"], headers={"Accept-Wait": "1"})
    assert second.status_code == 200 and second.content == b"m2"
    refused = await http.post("/channels/ordered/pull-consumers", data={"ordered": "true"})
    assert refused.status_code == 400 and "group" in refused.text
    mixed = await http.post("/channels/ordered/pull-consumers", data={"group": "O"})
    assert mixed.status_code == 409 and "order" in mixed.text, "a member that would not keep the order"


async def test_a_nacked_message_evicted_while_it_waits_stops_counting_against_the_window(tmp_path: Path) -> None:
    """A message nacked with a long delay and then evicted by the channel's limit never comes back:
    the consumer must not keep room for it (the engine would otherwise send it a message no pull
    asked for)."""
    from streaming.config import ChannelConfig

    limits = {"channels": {"tight": ChannelConfig(max_msgs=2)}}
    async with (
        running(pull_config(tmp_path / "data", **limits)) as server,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_api_port}") as http,
    ):
        await publish(http, "tight", b"m1")
        made = await create(http, "tight", start="first", max_inflight=5)
        first = await http.post(link(made, "next")["url"], headers={"Accept-Wait": "1"})
        assert first.content == b"m1"
        nacked = await http.post(
            link(first, "acknowledgement")["url"],
            headers={"If-Match": f'"{link(first, "acknowledgement")["etag"]}"'},
            data={"acknowledge": "false", "delay": "600"},
        )
        assert nacked.status_code == 204
        await publish(http, "tight", b"m2", b"m3")  # m1 leaves the channel: max_msgs is 2
        second = await http.post(link(first, "next")["url"], headers={"Accept-Wait": "1"})
        assert second.content == b"m2"
        assert (await ack(http, second)).status_code == 204
        assert pending(server, "tight") == 0, "m3 was sent to a consumer that is not pulling"
