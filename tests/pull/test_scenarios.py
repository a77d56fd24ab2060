"""HTTP pull consumers over real TCP with httpx: creating and finding consumers, pulling with step links
and long polls, acknowledging with If-Match (stale tags, repeats, nacks), MaxInflight, AckWait,
idle expiry and tombstones, durables across a restart, queue groups, auto-ack, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio

from streaming.bayeux import protocol as bx
from streaming.client import connect
from streaming.running import Running
from tests.bayeux.harness import raw_client
from tests.pull.harness import ack, create, link, pending, publish, pull_config
from tests.support.servers import running

pytestmark = pytest.mark.slow


async def test_create_and_discover(http: httpx.AsyncClient) -> None:
    made = await create(http, "orders.a")
    consumer = made.headers["location"]
    assert consumer.startswith("http://127.0.0.1:")
    assert link(made, "next")["url"] == consumer + "/next/1"
    assert link(made, "consumer")["url"] == consumer
    body = made.json()
    assert body["ack"] == "manual" and body["max_inflight"] == 1 and body["ack_wait"] == 30 and body["step"] == 0
    state = await http.get(consumer)
    assert state.status_code == 200 and state.json()["step"] == 0 and state.json()["in_flight"] == []
    channel = await http.get("/channels/orders.a")
    assert channel.status_code == 200 and channel.json()["msgs"] == 0
    assert link(channel, "pull-consumers")["url"].endswith("/channels/orders.a/pull-consumers")
    assert link(channel, "create")["url"].endswith("/channels/orders.a/messages")


async def test_happy_path(http: httpx.AsyncClient, server: Running) -> None:
    await publish(http, "happy", b"m1", b"m2", b"m3")
    made = await create(http, "happy", start="first", ack_wait=1)
    pulled = await http.post(link(made, "next")["url"])
    assert pulled.status_code == 200 and pulled.content == b"m1"
    assert pulled.headers["msg-sequence"] == "1" and pulled.headers["msg-redelivered"] == "false"
    assert link(pulled, "acknowledgement")["etag"]
    assert (await ack(http, pulled)).status_code == 204
    assert pending(server, "happy") == 0, "m2 was sent before anyone pulled it"
    await trio.sleep(1.3)
    second = await http.post(link(pulled, "next")["url"])
    assert second.status_code == 200 and second.content == b"m2", "m1 came back after its ack"


async def test_an_empty_channel_answers_503_after_the_wait_and_a_publish_completes_a_blocked_pull(
    http: httpx.AsyncClient,
) -> None:
    made = await create(http, "empty")
    next_url = link(made, "next")["url"]
    start = trio.current_time()
    nothing = await http.post(next_url, headers={"Accept-Wait": "1"})
    assert nothing.status_code == 503 and nothing.headers["retry-after"]
    assert 0.9 <= trio.current_time() - start <= 2.0
    assert link(nothing, "next")["url"] == next_url, "a 503 consumed nothing"
    got: list[httpx.Response] = []
    async with trio.open_nursery() as nursery:

        async def blocked() -> None:
            got.append(await http.post(next_url, headers={"Prefer": "wait=5"}))

        nursery.start_soon(blocked)
        await trio.sleep(0.3)
        start = trio.current_time()
        await publish(http, "empty", b"late")
    assert got[0].status_code == 200 and got[0].content == b"late"
    assert trio.current_time() - start < 0.5


async def test_ackwait_redelivers_before_newer_messages_under_a_new_tag(http: httpx.AsyncClient) -> None:
    await publish(http, "redeliver", b"m1", b"m2")
    made = await create(http, "redeliver", start="first", ack_wait=1)
    first = await http.post(link(made, "next")["url"])
    assert first.content == b"m1"
    await trio.sleep(1.3)
    again = await http.post(link(first, "next")["url"], headers={"Accept-Wait": "2"})
    assert again.status_code == 200 and again.content == b"m1", "a newer message overtook the redelivery"
    assert again.headers["msg-redelivered"] == "true" and again.headers["msg-delivery-count"] == "2"
    assert link(again, "acknowledgement")["etag"] != link(first, "acknowledgement")["etag"]
    assert (await ack(http, first)).status_code == 412, "the first delivery's tag is void"
    assert (await ack(http, again)).status_code == 204


async def test_an_old_members_late_ack_is_refused_and_the_new_holder_settles_it(
    http: httpx.AsyncClient, server: Running
) -> None:
    a = await create(http, "race", group="G", ack_wait=1, start="first")
    b = await create(http, "race", group="G", ack_wait=1, start="first")
    await publish(http, "race", b"m1")
    from_a = await http.post(link(a, "next")["url"], headers={"Accept-Wait": "2"})
    if from_a.status_code != 200:  # the engine gave m1 to the other member: swap names
        a, b = b, a
        from_a = await http.post(link(a, "next")["url"], headers={"Accept-Wait": "2"})
    assert from_a.status_code == 200 and from_a.content == b"m1"
    await trio.sleep(1.2)
    # A acks after its AckWait, before anyone pulled m1 again: too late.
    late = await ack(http, from_a)
    assert late.status_code == 412 and late.json()["error"] == "stale-delivery"
    got: httpx.Response | None = None
    for member in (b, a):  # whoever the engine gave m1 to now
        response = await http.post(link(member, "next")["url"], headers={"Accept-Wait": "2"})
        if response.status_code == 200:
            got = response
            break
    assert got is not None and got.content == b"m1" and got.headers["msg-redelivered"] == "true"
    assert (await ack(http, from_a)).status_code == 412
    assert (await ack(http, got)).status_code == 204
    await trio.sleep(1.3)
    for member in (a, b):
        none = await http.post(str(link(member, "consumer")["url"]) + "/next", headers={"Accept-Wait": "0.5"})
        assert none.status_code == 503, "m1 was delivered again after its ack"
    assert pending(server, "race") == 0


async def test_a_repeated_ack_is_answered_as_the_first(tmp_path: Path) -> None:
    for mode, repeat_status in (("204", 204), ("405", 405)):
        cfg = pull_config(tmp_path / mode, pull_ack_replay=mode, pull_ack_replay_window=1.5)
        async with running(cfg) as srv, httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.http_api_port}") as http:
            await publish(http, "repeat", b"m1")
            made = await create(http, "repeat", start="first")
            pulled = await http.post(link(made, "next")["url"])
            assert (await ack(http, pulled)).status_code == 204
            again = await ack(http, pulled)  # its response was lost: the client sends it again
            assert again.status_code == repeat_status
            if mode == "405":
                assert again.headers["allow"] == "GET, HEAD"
            assert pending(srv, "repeat") == 0
            await trio.sleep(1.7)
            assert (await ack(http, pulled)).status_code == 412, "a repeat past the replay window"


async def test_preconditions(http: httpx.AsyncClient) -> None:
    await publish(http, "pre", b"m1")
    made = await create(http, "pre", start="first")
    pulled = await http.post(link(made, "next")["url"])
    url = link(pulled, "acknowledgement")["url"]
    assert (await http.post(url, data={"acknowledge": "true"})).status_code == 428
    assert (await http.post(url, headers={"If-Match": '"garbage"'})).status_code == 412
    weak = f'W/"{link(pulled, "acknowledgement")["etag"]}"'
    assert (await http.post(url, headers={"If-Match": weak})).status_code == 412
    never = url.rsplit("/", 1)[0] + "/7"
    assert (await http.post(never, headers={"If-Match": '"x"'})).status_code == 404
    put = await http.put(url)
    assert put.status_code == 405 and put.headers["allow"] == "GET, HEAD, POST"
    bad = await http.post(url, headers={"If-Match": "*"}, data={"acknowledge": "maybe"})
    assert bad.status_code == 400 and bad.json()["parameter"] == "acknowledge"
    state = await http.get(url)
    assert state.status_code == 200 and state.json()["state"] == "in-flight"
    assert state.headers["etag"] == f'"{link(pulled, "acknowledgement")["etag"]}"'
    assert (await http.post(url, headers={"If-Match": "*"})).status_code == 204  # unquoted and star forms work
    assert (await http.get(url)).json()["state"] == "acked"


async def test_nack(http: httpx.AsyncClient) -> None:
    await publish(http, "nack", b"m1", b"m2")
    made = await create(http, "nack", start="first")
    pulled = await http.post(link(made, "next")["url"])
    assert (await ack(http, pulled, acknowledge=False)).status_code == 204
    again = await http.post(link(pulled, "next")["url"], headers={"Accept-Wait": "1"})
    assert again.status_code == 200 and again.content == b"m1", "a nacked message comes back first"
    assert again.headers["msg-redelivered"] == "true"
    assert link(again, "acknowledgement")["etag"] != link(pulled, "acknowledgement")["etag"]
    assert (await ack(http, pulled)).status_code == 409, "ack with the nacked tag"
    assert (await ack(http, again)).status_code == 204
    assert (await ack(http, again, acknowledge=False)).status_code == 409, "nack after its ack"


async def test_a_nack_with_a_delay_holds_the_message_back_that_long(http: httpx.AsyncClient) -> None:
    await publish(http, "later", b"m1", b"m2")
    made = await create(http, "later", start="first", max_inflight=2)
    pulled = await http.post(link(made, "next")["url"])
    target = link(pulled, "acknowledgement")
    nacked = await http.post(
        target["url"], headers={"If-Match": f'"{target["etag"]}"'}, json={"acknowledge": False, "delay": 0.8}
    )
    assert nacked.status_code == 204
    started = trio.current_time()
    second = await http.post(link(pulled, "next")["url"], headers={"Accept-Wait": "1"})
    assert second.content == b"m2", "newer messages do not wait for the nacked one"
    again = await http.post(link(second, "next")["url"], headers={"Accept-Wait": "3"})
    assert again.status_code == 200 and again.content == b"m1"
    assert trio.current_time() - started >= 0.8 - 0.05, "not before its delay"
    assert (again.headers["msg-redelivered"], again.headers["msg-delivery-count"]) == ("true", "2")
    assert (await ack(http, again)).status_code == 204
    assert (await ack(http, second)).status_code == 204


async def test_a_nack_counts_against_max_deliver_and_a_bad_delay_is_refused(
    http: httpx.AsyncClient, server: Running
) -> None:
    await publish(http, "tries", b"poison")
    made = await create(http, "tries", start="first")
    pulled = await http.post(link(made, "next")["url"])
    target = link(pulled, "acknowledgement")
    for body, why in [({"acknowledge": True, "delay": 1}, "an ack"), ({"acknowledge": False, "delay": "soon"}, "x")]:
        refused = await http.post(target["url"], headers={"If-Match": f'"{target["etag"]}"'}, json=body)
        assert refused.status_code == 400 and refused.json()["parameter"] == "delay", why
    refused = await http.post(
        target["url"], headers={"If-Match": f'"{target["etag"]}"'}, json={"acknowledge": False, "delay": -1}
    )
    assert refused.status_code == 400
    assert (await ack(http, pulled, acknowledge=False)).status_code == 204
    again = await http.post(link(pulled, "next")["url"], headers={"Accept-Wait": "2"})
    assert again.headers["msg-delivery-count"] == "2", "a nack is an attempt the engine counts"
    assert pending(server, "tries") == 1


async def test_max_inflight(http: httpx.AsyncClient) -> None:
    await publish(http, "inflight", b"m1", b"m2", b"m3")
    made = await create(http, "inflight", start="first", max_inflight=2)
    one = await http.post(link(made, "next")["url"])
    two = await http.post(link(one, "next")["url"])
    assert (one.status_code, two.status_code) == (200, 200)
    start = trio.current_time()
    three = await http.post(link(two, "next")["url"], headers={"Accept-Wait": "3"})
    assert three.status_code == 409 and trio.current_time() - start < 0.5, "answered at once, no waiting"
    acks = [part for part in three.headers["link"].split(", ") if 'rel="acknowledgement"' in part]
    assert len(acks) == 2
    assert (await ack(http, one)).status_code == 204
    four = await http.post(link(two, "next")["url"], headers={"Accept-Wait": "2"})
    assert four.status_code == 200 and four.content == b"m3"


async def test_a_lost_pull_response_is_replayed_by_its_step(http: httpx.AsyncClient) -> None:
    await publish(http, "steps", b"m1", b"m2")
    made = await create(http, "steps", start="first", ack_wait=1, max_inflight=2)
    step1 = link(made, "next")["url"]
    first = await http.post(step1)
    step2 = link(first, "next")["url"]
    second = await http.post(step2)  # "lost"
    replay = await http.post(step2)
    assert replay.status_code == 200 and replay.content == second.content
    for header in ("msg-sequence", "msg-delivery-count"):
        assert replay.headers[header] == second.headers[header]
    assert link(replay, "acknowledgement")["etag"] == link(second, "acknowledgement")["etag"]
    old = await http.post(step1)
    assert old.status_code == 412 and link(old, "next")["url"] == link(second, "next")["url"]
    await trio.sleep(1.3)
    voided = await http.post(step2)
    assert voided.status_code == 412, "a replay of a voided delivery"


async def test_idle_expiry_hands_the_message_to_another_member_and_leaves_a_tombstone(
    http: httpx.AsyncClient,
) -> None:
    # The member that goes silent (a short idle timeout) is the group's only one when m1 comes: it
    # holds m1, whichever member the engine would pick among several.
    a = await create(http, "idle", group="G", idle_timeout=2, ack_wait=30, start="first")
    await publish(http, "idle", b"m1")
    pulled = await http.post(link(a, "next")["url"], headers={"Accept-Wait": "1"})
    assert pulled.status_code == 200 and pulled.content == b"m1"
    b = await create(http, "idle", group="G", idle_timeout=30, ack_wait=30, start="first")
    got = await http.post(link(b, "next")["url"], headers={"Accept-Wait": "5"})  # A goes silent meanwhile
    assert got.status_code == 200 and got.content == b"m1" and got.headers["msg-redelivered"] == "true"
    gone = await http.post(link(pulled, "next")["url"])
    assert gone.status_code == 404 and gone.json()["error"] == "consumer-expired"
    assert link(gone, "pull-consumers")["url"].endswith("/channels/idle/pull-consumers")
    assert (await ack(http, pulled)).status_code == 412
    await trio.sleep(4.5)  # the tombstone is gone (the sweep runs every second)
    assert (await http.post(link(pulled, "next")["url"])).status_code == 404
    assert (await http.post(link(pulled, "next")["url"])).json()["error"] == "unknown-consumer"
    assert (await ack(http, pulled)).status_code == 404


async def test_a_durable_survives_close_and_restart(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    async with (
        running(pull_config(directory)) as srv,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.http_api_port}") as http,
    ):
        await publish(http, "durable", b"m1", b"m2")
        made = await create(http, "durable", durable="D", start="first", max_inflight=2)
        one = await http.post(link(made, "next")["url"])
        two = await http.post(link(one, "next")["url"])
        assert (one.content, two.content) == (b"m1", b"m2")
        assert (await ack(http, one)).status_code == 204
        assert (await http.delete(made.headers["location"])).status_code == 204
        await publish(http, "durable", b"m3")
    async with (
        running(pull_config(directory)) as srv,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.http_api_port}") as http,
    ):
        again = await create(http, "durable", durable="D", max_inflight=2)
        first = await http.post(link(again, "next")["url"], headers={"Accept-Wait": "3"})
        assert first.content == b"m2" and first.headers["msg-redelivered"] == "true"
        second = await http.post(link(first, "next")["url"], headers={"Accept-Wait": "3"})
        assert second.content == b"m3" and second.headers["msg-redelivered"] == "false"
        for pulled in (first, second):
            assert (await ack(http, pulled)).status_code == 204
        nothing = await http.post(link(second, "next")["url"], headers={"Accept-Wait": "0.5"})
        assert nothing.status_code == 503, "m1 came back"


async def test_a_durable_cannot_be_attached_twice_and_unsubscribe_forgets_it(http: httpx.AsyncClient) -> None:
    made = await create(http, "dup", durable="D")
    second = await http.post("/channels/dup/pull-consumers", data={"durable": "D"})
    assert second.status_code == 409
    await publish(http, "dup", b"before")
    assert (await http.delete(made.headers["location"] + "?unsubscribe=true")).status_code == 204
    again = await create(http, "dup", durable="D", start="new")
    nothing = await http.post(link(again, "next")["url"], headers={"Accept-Wait": "0.5"})
    assert nothing.status_code == 503, "an unsubscribed durable kept its position"


async def test_a_queue_group_shares_the_messages(http: httpx.AsyncClient, server: Running) -> None:
    members = [await create(http, "share", group="G", start="first") for _ in range(2)]
    await publish(http, "share", *[f"m{i}".encode() for i in range(1, 11)])
    seen: dict[int, list[int]] = {0: [], 1: []}
    nexts = [link(m, "next")["url"] for m in members]
    with trio.fail_after(20):
        while len(seen[0]) + len(seen[1]) < 10:
            for i in (0, 1):
                pulled = await http.post(nexts[i], headers={"Accept-Wait": "0.2"})
                if pulled.status_code == 200:
                    seen[i].append(int(pulled.headers["msg-sequence"]))
                    assert (await ack(http, pulled)).status_code == 204
                    nexts[i] = link(pulled, "next")["url"]
    assert sorted(seen[0] + seen[1]) == list(range(1, 11)), "a message went to both, or to none"
    assert all(s == sorted(s) for s in seen.values())
    assert pending(server, "share") == 0


async def test_auto_ack(http: httpx.AsyncClient, server: Running) -> None:
    await publish(http, "auto", b"m1", b"m2")
    made = await create(http, "auto", ack="auto", start="first", ack_wait=1)
    pulled = await http.post(link(made, "next")["url"])
    assert pulled.status_code == 200 and pulled.content == b"m1"
    assert "acknowledgement" not in pulled.links
    replay = await http.post(link(made, "next")["url"])  # the same step: the cached message
    assert replay.status_code == 200 and replay.content == b"m1"
    plain = await http.post(made.headers["location"] + "/next")
    assert plain.status_code == 200 and plain.content == b"m2"
    await trio.sleep(1.3)
    nothing = await http.post(made.headers["location"] + "/next", headers={"Accept-Wait": "0.3"})
    assert nothing.status_code == 503, "an auto-acked message was redelivered"
    assert pending(server, "auto") == 0


async def test_bad_input_gets_a_clear_answer(http: httpx.AsyncClient, server: Running) -> None:
    assert (await http.get("/channels/never.made")).status_code == 404
    unknown = await http.post("/channels/x/pull-consumers/nope/next")
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown-consumer"
    for params, name in ((b"max_inflight=zero", "max_inflight"), (b"start=sometime", "start"), (b"ack=maybe", "ack")):
        bad = await http.post(
            "/channels/x/pull-consumers", content=params, headers={"content-type": "application/x-www-form-urlencoded"}
        )
        assert bad.status_code == 400 and bad.json()["parameter"] == name, bad.text
    for body in (b"{not json", b"[1]", b"[" * 5000 + b"]" * 5000):  # the last nested past the parser
        bad = await http.post("/channels/x/pull-consumers", content=body, headers={"content-type": "application/json"})
        assert bad.status_code == 400 and bad.json()["parameter"] == "body", bad.text
    too_big = await http.post("/channels/x/messages", content=b"x" * (2 * 1024 * 1024))
    assert too_big.status_code == 413
    wrong = await http.get("/channels/x/messages")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    bad_channel = await http.post("/channels/a..b/messages", content=b"x")
    assert bad_channel.status_code == 400 and bad_channel.json()["parameter"] == "channel"
    made = await create(http, "x")
    bad_wait = await http.post(link(made, "next")["url"], headers={"Accept-Wait": "soon"})
    assert bad_wait.status_code == 400 and bad_wait.json()["parameter"] == "Accept-Wait"
    assert (await http.post("/channels/x/messages", content=b"fine")).status_code == 201


async def test_messages_cross_doors(http: httpx.AsyncClient, server: Running) -> None:
    """STAN and Bayeux publishes can be pulled over HTTP; an HTTP publish reaches a Bayeux subscriber."""
    made = await create(http, "cross.doors", start="first", max_inflight=8)
    async with connect("test-cluster", "cross-stan", port=server.port) as stan:
        await stan.publish("cross.doors", b"from stan")
    async with raw_client(server.http_api_port) as bayeux:
        await bayeux.handshake()
        await bayeux.connect(0, now=True)
        assert (await bayeux.subscribe("/cross/doors"))["successful"]
        assert (await bayeux.publish("/cross/doors", {"from": "bayeux"}))["successful"]
        await publish(http, "cross.doors", b"from http")
        deliveries, _ = await bayeux.connect(1)
        assert [d["data"] for d in deliveries] == [{"from": "bayeux"}, "from http"]
        assert deliveries[1]["ext"]["encoding"] == "text"
    bodies = []
    url = link(made, "next")["url"]
    for _ in range(3):
        pulled = await http.post(url, headers={"Accept-Wait": "2"})
        assert pulled.status_code == 200
        bodies.append(pulled.content)
        url = link(pulled, "next")["url"]
    assert bodies == [b"from stan", bx.encode_data({"from": "bayeux"}), b"from http"]
    assert json.loads(bodies[1]) == {"from": "bayeux"}


async def test_pull_traffic_is_measured_and_logged(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.observability.test_event_log import read_events

    log_dir = tmp_path / "events"
    cfg = pull_config(tmp_path / "data", http_port=-1, event_log=str(log_dir))
    async with running(cfg) as srv, httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.http_api_port}") as http:
        await publish(http, "seen", b"m1", b"m2")
        made = await create(http, "seen", start="first")
        first = await http.post(link(made, "next")["url"])
        assert (await ack(http, first)).status_code == 204
        assert (await ack(http, first, tag='"stale"')).status_code == 412
        second = await http.post(link(first, "next")["url"], headers={"Accept-Wait": "2"})
        assert (await ack(http, second, acknowledge=False)).status_code == 204
        text = (await http.get(f"http://127.0.0.1:{srv.http_port}/metrics")).text
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
    assert values["streaming_pull_consumers"] == 1
    assert values["streaming_pull_consumers_created_total"] == 1
    assert values["streaming_pull_handed_out_messages_total"] == 2
    assert values["streaming_pull_acks_total"] == 1 and values["streaming_pull_nacks_total"] == 1
    assert values["streaming_pull_stale_acks_total"] == 1
    assert values["streaming_pull_published_messages_total"] == 2
    events = [e for e in read_events(log_dir) if e["channel"] == "seen"]
    delivered = [e for e in events if e["event"] == "deliver"]
    assert [e["seq"] for e in delivered][:2] == [1, 2] and all(e["member"].startswith("pull:") for e in delivered)
    assert [e["seq"] for e in events if e["event"] == "ack"] == [1]
