"""The Bayeux door over real HTTP with a hand-made client: what the CometD JS client never does on its
own (acks lower or higher than it was sent, two connects at once, bad input), batches on the wire,
session expiry, and the HTTP layer itself."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from streaming.bayeux import channels
from streaming.bayeux import protocol as bx
from streaming.client import connect
from streaming.core.door_api import Ticket
from streaming.core.outbound import Publish
from streaming.running import Running
from tests.bayeux.harness import MAX_INTERVAL_S, TIMEOUT_S, bayeux_config, raw_client
from tests.support.servers import running

pytestmark = pytest.mark.slow


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Running]:
    async with running(bayeux_config(tmp_path / "data")) as srv:
        yield srv


def datas(deliveries: list[dict[str, Any]]) -> list[object]:
    return [d["data"] for d in deliveries]


def pending(server: Running, channel: str) -> int:
    return sum(v.pending_count for v in server.core.engine.views() if v.record.channel == channels.to_engine(channel))


async def test_first_connect_is_answered_at_once_then_connects_are_held_for_the_timeout(server: Running) -> None:
    async with raw_client(server.http_api_port) as raw:
        await raw.handshake()
        start = trio.current_time()
        deliveries, reply = await raw.connect(0)  # no timeout:0 either: the first is never held
        assert trio.current_time() - start < 0.5
        assert reply["successful"] and reply["ext"] == {"ack": 1} and deliveries == []
        assert reply["advice"] == {"reconnect": "retry", "interval": 0, "timeout": int(TIMEOUT_S * 1000)}
        start = trio.current_time()
        deliveries, reply = await raw.connect(1)
        held = trio.current_time() - start
        assert 0.8 * TIMEOUT_S <= held <= 1.2 * TIMEOUT_S
        assert reply["ext"] == {"ack": 2} and deliveries == []


async def test_a_lower_ack_with_several_batches_out_resends_them_first_under_a_new_batch(server: Running) -> None:
    async with raw_client(server.http_api_port) as sub, raw_client(server.http_api_port) as pub:
        assert (await sub.subscriber("/chat/a"))["successful"]
        await pub.handshake()
        assert (await pub.publish("/chat/a", {"b": 2}))["successful"]
        deliveries, reply = await sub.connect(1)
        assert datas(deliveries) == [{"b": 2}] and reply["ext"] == {"ack": 2}
        assert (await pub.publish("/chat/a", {"b": 3}))["successful"]
        deliveries, reply = await sub.connect(2)
        assert datas(deliveries) == [{"b": 3}] and reply["ext"] == {"ack": 3}
        # The reply for batch 3 "never arrived": the client still acknowledges 2.
        assert (await pub.publish("/chat/a", {"b": 4}))["successful"]
        deliveries, reply = await sub.connect(2)
        assert datas(deliveries) == [{"b": 3}, {"b": 4}] and reply["ext"] == {"ack": 4}
        # Neither did the reply for batch 4.
        assert (await pub.publish("/chat/a", {"b": "new"}))["successful"]
        start = trio.current_time()
        deliveries, reply = await sub.connect(2)  # no timeout:0, yet answered at once
        assert trio.current_time() - start < 0.5
        assert datas(deliveries) == [{"b": 3}, {"b": 4}, {"b": "new"}]
        assert reply["ext"] == {"ack": 5}
        assert pending(server, "/chat/a") == 3
        deliveries, reply = await sub.connect(5, now=True)
        assert deliveries == [] and reply["ext"] == {"ack": 6}
        assert pending(server, "/chat/a") == 0


async def test_a_nak_on_a_connect_gives_messages_back_for_a_delay_and_the_ack_spares_them(server: Running) -> None:
    async with raw_client(server.http_api_port) as sub, raw_client(server.http_api_port) as pub:
        await sub.subscriber("/chat/n")
        await pub.handshake()
        for n in (1, 2, 3):
            await pub.publish("/chat/n", n)
        deliveries, reply = await sub.connect(1)
        assert datas(deliveries) == [1, 2, 3] and reply["ext"] == {"ack": 2}
        ids = [d["id"] for d in deliveries]
        message = sub.connect_message(2, now=True)
        message["ext"]["nak"] = [
            {"id": ids[0], "delay": 0.6},
            ids[1],
            {"id": "9x9", "delay": 1},
            {"id": ids[2], "delay": -1},
        ]
        start = trio.current_time()
        *deliveries, reply = await sub.post([message], "/connect")
        assert reply["ext"] == {"ack": 3, "nak": 2}, "two taken: a delivery of another session and a bad delay are not"
        assert datas(deliveries) == [2], "nak'd without a delay: back at once; 3 acked with its batch"
        assert deliveries[0]["ext"]["seq"] == 2
        assert pending(server, "/chat/n") == 2  # 1 waits for its delay, 2 is out again
        deliveries, reply = await sub.connect(3)  # held until 1 is back
        assert datas(deliveries) == [1] and trio.current_time() - start >= 0.6 - 0.05
        deliveries, reply = await sub.connect(reply["ext"]["ack"], now=True)
        assert deliveries == [] and pending(server, "/chat/n") == 0


async def test_an_ack_past_the_last_batch_removes_only_what_was_sent(server: Running) -> None:
    async with raw_client(server.http_api_port) as sub, raw_client(server.http_api_port) as pub:
        await sub.subscriber("/chat/b")
        await pub.handshake()
        await pub.publish("/chat/b", 1)
        deliveries, reply = await sub.connect(1)
        assert datas(deliveries) == [1] and reply["ext"] == {"ack": 2}
        await pub.publish("/chat/b", 2)  # queued, not sent yet
        deliveries, reply = await sub.connect(999)
        assert datas(deliveries) == [2], "a message never sent was dropped by a hostile ack"
        assert reply["ext"] == {"ack": 3}


async def test_a_second_connect_supersedes_the_held_one(server: Running) -> None:
    async with (
        raw_client(server.http_api_port) as sub,
        raw_client(server.http_api_port) as other,
        raw_client(server.http_api_port) as pub,
    ):
        await sub.subscriber("/chat/c")
        await pub.handshake()
        other.client_id = sub.client_id
        async with trio.open_nursery() as nursery:
            first: list[list[dict[str, Any]]] = []

            async def held() -> None:
                first.append(await sub.post([sub.connect_message(1)], "/connect"))

            nursery.start_soon(held)
            await trio.sleep(0.3)
            start = trio.current_time()
            async with trio.open_nursery() as inner:
                second: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

                async def held_second() -> None:
                    second.append(await other.connect(1))

                inner.start_soon(held_second)
                await trio.sleep(0.3)
                assert first, "the superseded connect was not answered at once"
                assert trio.current_time() - start < 0.5
                (answer,) = first[0]
                assert answer["successful"] and "ext" not in answer, "a superseded reply carries no batch"
                await pub.publish("/chat/c", "x")
            deliveries, reply = second[0]
            assert datas(deliveries) == ["x"]
            assert reply["ext"] == {"ack": 2}


async def test_disconnect_releases_the_held_connect_and_forgets_the_session(server: Running) -> None:
    async with raw_client(server.http_api_port) as raw, raw_client(server.http_api_port) as other:
        await raw.subscriber("/chat/d")
        other.client_id = raw.client_id
        async with trio.open_nursery() as nursery:
            got: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

            async def held() -> None:
                got.append(await raw.connect(1))

            nursery.start_soon(held)
            await trio.sleep(0.3)
            start = trio.current_time()
            (reply,) = await other.post([{"id": "99", "channel": "/meta/disconnect", "clientId": raw.client_id}])
            assert reply == {"id": "99", "channel": "/meta/disconnect", "successful": True}
        assert trio.current_time() - start < 0.5
        deliveries, connect_reply = got[0]
        assert deliveries == [] and connect_reply["advice"]["reconnect"] == "none"
        assert "ext" not in connect_reply
        (unknown,) = await raw.post([{"id": "5", "channel": "/chat/d", "data": 1, "clientId": raw.client_id}])
        assert unknown == {"id": "5", "channel": "/chat/d", "successful": False, "error": bx.SESSION_UNKNOWN}
        _, reply402 = await raw.connect(2)
        assert reply402["error"] == bx.SESSION_UNKNOWN
        assert reply402["advice"] == {"reconnect": "handshake", "interval": 0}
        assert pending(server, "/chat/d") == 0
        assert not [v for v in server.core.engine.views() if v.record.channel == "chat.d"]


async def test_a_session_that_stops_connecting_expires_and_its_messages_stay_unacknowledged(
    server: Running,
) -> None:
    async with raw_client(server.http_api_port) as sub, raw_client(server.http_api_port) as pub:
        await sub.subscriber("/chat/e")
        await pub.handshake()
        await pub.publish("/chat/e", "never acked")
        deliveries, _ = await sub.connect(1)
        assert datas(deliveries) == ["never acked"]
        views = [v for v in server.core.engine.views() if v.record.channel == "chat.e"]
        assert len(views) == 1 and views[0].pending_count == 1
        store_sub = views[0].record.sub_id
        assert server.bayeux is not None
        assert server.bayeux.statistics().sessions == 2
        # The publisher keeps its session alive with a publish; the subscriber never connects again.
        await trio.sleep(MAX_INTERVAL_S - 1)
        await pub.publish("/chat/e", "keeping alive")
        await trio.sleep(2.5)
        assert server.bayeux.statistics().sessions == 1
        assert server.bayeux.statistics().expired_sessions == 1
        assert not [v for v in server.core.engine.views() if v.record.sub_id == store_sub]
        acked = [u for u in server.store.recover().subscriptions if u.record.sub_id == store_sub]
        assert acked == [], "the subscription of an expired session is gone from the store too"
        _, reply = await sub.connect(2)
        assert reply["error"] == bx.SESSION_UNKNOWN


async def test_errors_are_answered_in_the_json_with_status_200(server: Running) -> None:
    async with raw_client(server.http_api_port) as raw:
        await raw.handshake()
        cid = raw.client_id
        answers = await raw.post(
            [
                {"id": "1", "channel": "/chat/x", "data": 1, "clientId": "bogus"},
                {"id": "2", "channel": "/meta/subscribe", "subscription": "/a", "clientId": "bogus"},
                {"id": "3", "channel": "/meta/subscribe", "clientId": cid},
                {"id": "4", "channel": "/meta/subscribe", "subscription": "/meta/foo", "clientId": cid},
                {"id": "5", "clientId": cid, "data": 1},
                {"id": "6", "channel": "no-slash", "clientId": cid},
                {"id": "7 !", "channel": "/chat/x", "clientId": cid},
                {"id": "8", "channel": "/meta/unsubscribe", "subscription": "/never", "clientId": cid},
                {"id": "9", "channel": "/meta/subscribe", "subscription": 5, "clientId": cid},
                {"id": "10", "channel": "/meta/subscribe", "subscription": "/chat//*", "clientId": cid},
                {"id": "11", "channel": "/meta/whatever", "clientId": cid},
                7,
            ]
        )
        errors = [a.get("error") for a in answers]
        assert errors == [
            bx.SESSION_UNKNOWN,
            bx.SESSION_UNKNOWN,
            bx.SUBSCRIPTION_MISSING,
            bx.SUBSCRIBE_FAILED,
            bx.CHANNEL_MISSING,
            bx.CHANNEL_INVALID,
            bx.MESSAGE_ID_INVALID,
            bx.CHANNEL_MISSING,
            bx.SUBSCRIPTION_INVALID,
            bx.SUBSCRIBE_FAILED,
            "400::channel_unknown",
            bx.MESSAGE_INVALID,
        ]
        assert all(a["successful"] is False for a in answers)
        assert "advice" not in answers[0], "no reconnect advice outside handshake and connect replies"
        # The session itself is unharmed.
        assert (await raw.subscribe("/chat/x"))["successful"]


async def test_bad_bodies_get_an_http_error_and_others_keep_working(server: Running) -> None:
    async with raw_client(server.http_api_port) as raw, raw_client(server.http_api_port) as good:
        await good.subscriber("/chat/y")
        bad = [(b"not json", 400), (b'"a string"', 400), (b"[]", 400), (b"{", 400)]
        publish = '{"channel":"/chat/y","clientId":"%s","data":%s}'
        bad += [(("[" + publish % (good.client_id, value) + "]").encode(), 400) for value in ("NaN", "[1e999]")]
        for body, status in bad:
            response = await raw.http.post("/cometd", content=body, headers={"content-type": "application/json"})
            assert response.status_code == status, body
            assert response.json()[0]["successful"] is False
        big = json.dumps([{"channel": "/chat/y", "data": "x" * (2 * 1024 * 1024)}]).encode()
        response = await raw.http.post("/cometd", content=big, headers={"content-type": "application/json"})
        assert response.status_code == 413
        assert (await good.publish("/chat/y", "still fine"))["successful"]
        deliveries, _ = await good.connect(1)
        assert datas(deliveries) == ["still fine"]


async def test_a_lone_surrogate_reaches_subscribers_as_it_was_sent_and_breaks_no_reply(server: Running) -> None:
    """JavaScript strings may hold half of a surrogate pair, which JSON escapes and UTF-8 cannot carry."""
    async with raw_client(server.http_api_port) as raw:
        await raw.subscriber("/chat/s")
        cid = raw.client_id
        messages = [
            {"id": "1", "channel": "/chat/s", "data": {"s": "\ud800é"}, "clientId": cid},
            {"id": "2", "channel": "/chat/\udc00", "data": 1, "clientId": cid},
            {"id": "3", "channel": "/chat/s", "data": "after", "clientId": cid},
        ]
        body = json.dumps(messages).encode()  # as JSON.stringify writes them: the halves escaped
        response = await raw.http.post("/cometd", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text
        answers = response.json()
        assert [a["successful"] for a in answers] == [True, False, True]
        assert answers[1]["channel"] == "/chat/\udc00"
        deliveries, _ = await raw.connect(1)
        assert datas(deliveries) == [{"s": "\ud800é"}, "after"]


async def test_a_request_of_small_publishes_is_committed_on_the_event_loop_and_a_large_one_on_the_store_thread(
    server: Running,
) -> None:
    """A request's publishes are one commit. A hundred small ones cost less on the event loop than the
    hop to the store thread and back; a few hundred KiB go to the thread, so the loop is not held."""
    async with raw_client(server.http_api_port) as raw:
        await raw.handshake()
        commits = server.core.group_commit
        before = commits.statistics()
        small = [{"channel": "/chat/s", "data": {"n": i}, "clientId": raw.client_id} for i in range(100)]
        assert all(a["successful"] for a in await raw.post(small))
        after = commits.statistics()
        assert (after.commits, after.thread_commits) == (before.commits + 1, before.thread_commits)
        large = [{"channel": "/chat/s", "data": "x" * 8192, "clientId": raw.client_id} for _ in range(20)]
        assert all(a["successful"] for a in await raw.post(large))
        last = commits.statistics()
        assert (last.commits, last.thread_commits) == (after.commits + 1, after.thread_commits + 1)


async def test_every_path_takes_posts_and_chunked_bodies_and_a_foreign_pages_websocket_is_refused(
    server: Running,
) -> None:
    async with raw_client(server.http_api_port) as raw:
        await raw.handshake()
        for suffix in ("", "/", "/handshake", "/connect", "/disconnect"):
            message = {"id": "1", "channel": "/chat/p", "data": suffix, "clientId": raw.client_id}
            (reply,) = await raw.post([message], suffix)
            assert reply["successful"], suffix

        async def chunks() -> AsyncIterator[bytes]:
            body = json.dumps([{"id": "2", "channel": "/chat/p", "data": "chunked", "clientId": raw.client_id}])
            for i in range(0, len(body), 7):
                yield body[i : i + 7].encode()

        response = await raw.http.post("/cometd/", content=chunks(), headers={"content-type": "application/json"})
        assert response.status_code == 200 and response.json()[0]["successful"]
        assert response.headers["content-type"] == "application/json;charset=UTF-8"
        upgrade = await raw.http.get(
            "/cometd",
            headers={
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Version": "13",
                "Origin": "https://elsewhere.example",  # no origin is allowed: only the listener's own
            },
        )
        assert upgrade.status_code == 403
        plain_get = await raw.http.get("/cometd")
        assert plain_get.status_code == 400 and "WebSocket" in plain_get.json()[0]["error"]


async def test_a_session_without_the_extension_gets_its_messages_with_no_batch_numbers(server: Running) -> None:
    async with raw_client(server.http_api_port) as sub, raw_client(server.http_api_port) as pub:
        reply = await sub.handshake(ack=False)
        assert "ext" not in reply
        _, first = await sub.connect(now=True)
        assert "ext" not in first
        await sub.subscribe("/chat/plain")
        await pub.handshake()
        await pub.publish("/chat/plain", 1)
        deliveries, reply = await sub.connect()
        assert datas(deliveries) == [1] and "ext" not in reply
        assert pending(server, "/chat/plain") == 0, "written into a reply: acknowledged to the engine at once"


async def test_a_message_that_is_not_json_reaches_bayeux_as_text_or_base64(server: Running) -> None:
    async with raw_client(server.http_api_port) as sub:
        await sub.subscriber("/raw/bytes")
        await server.api.publish_and_wait([Publish("raw.bytes", data) for data in (b"plain words", b"\xff\x00binary")])
        deliveries, _ = await sub.connect(1)
        assert [(d["data"], d["ext"].get("encoding")) for d in deliveries] == [
            ("plain words", "text"),
            ("/wBiaW5hcnk=", "base64"),
        ]


async def test_json_nested_past_the_parsers_limit_reaches_bayeux_as_text_and_its_publisher_is_acked(
    server: Running,
) -> None:
    """A STAN publisher's bytes are checked as JSON when they are delivered, inside a commit that is
    already stored: a check that raised there refused the stored publish and broke the batch."""
    deep = b"[" * 100_000 + b"]" * 100_000
    async with raw_client(server.http_api_port) as sub, connect("test-cluster", "deep", port=server.port) as pub:
        await sub.subscriber("/raw/deep")
        await pub.publish("raw.deep", deep)
        await pub.publish("raw.deep", b'{"after":1}')
        deliveries, _ = await sub.connect(1)
        assert [(d["data"], d["ext"].get("encoding")) for d in deliveries] == [
            (deep.decode(), "text"),
            ({"after": 1}, None),
        ]
        # As a body, the same nesting is refused as not JSON, and the session is unharmed.
        response = await sub.http.post("/cometd", content=deep, headers={"content-type": "application/json"})
        assert response.status_code == 400 and "not JSON" in response.json()[0]["error"]
        assert (await sub.publish("/raw/deep", "still fine"))["successful"]


async def test_publishes_around_a_subscribe_in_one_request_are_all_stored_before_the_answer(
    server: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The subscribe awaits (a new channel is created on the store thread), which lets the publishes
    before it be committed; those after it must still be committed before the request is answered."""
    door = server.bayeux
    assert door is not None
    unstored: list[Ticket] = []
    handle = door.handle
    submit = door._submit
    tickets: list[Ticket] = []

    async def submitting(staged: Any, source: object = None) -> Any:
        submitted = await submit(staged, source)
        tickets.append(submitted[0])
        return submitted

    async def handling(messages: list[Any], permissions: Any = None) -> list[dict[str, Any] | bytes]:
        answer = await handle(messages, permissions)
        unstored.extend(ticket for ticket in tickets if not ticket.done)
        tickets.clear()
        return answer

    monkeypatch.setattr(door, "_submit", submitting)
    monkeypatch.setattr(door, "handle", handling)
    async with raw_client(server.http_api_port) as raw:
        await raw.handshake()
        cid = raw.client_id
        await raw.publish("/chat/q", "first")
        for i in range(20):  # the order of Trio's ready tasks varies: a wrong answer showed in half
            answers = await raw.post(
                [
                    {"channel": "/chat/q", "data": f"a{i}", "clientId": cid},
                    {"channel": "/meta/subscribe", "subscription": f"/fresh/n{i}", "clientId": cid},
                    {"channel": "/chat/q", "data": f"b{i}", "clientId": cid},
                ]
            )
            assert all(a["successful"] for a in answers), answers
        assert unstored == []


async def test_a_publish_is_answered_only_after_it_is_stored(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    async with running(bayeux_config(directory)) as srv, raw_client(srv.http_api_port) as raw:
        await raw.handshake()
        for n in range(5):
            assert (await raw.publish("/stored/here", {"n": n}))["successful"]
        info = srv.store.channel_info("stored.here")
        assert info is not None and info.last_seq == 5
    async with running(bayeux_config(directory)) as srv:
        messages = srv.store.read("stored.here", 1, 10)
        assert [json.loads(m.data) for m in messages] == [{"n": n} for n in range(5)]


async def test_a_connect_sharing_its_request_is_answered_at_once(server: Running) -> None:
    async with raw_client(server.http_api_port) as raw:
        await raw.subscriber("/chat/shared")
        start = trio.current_time()
        publish = {"id": "70", "channel": "/chat/shared", "data": "with it", "clientId": raw.client_id}
        answer = await raw.post([raw.connect_message(1), publish])
        assert trio.current_time() - start < 0.5, "a connect with company was held"
        assert [m["channel"] for m in answer] == ["/meta/connect", "/chat/shared"]
        assert answer[0]["ext"] == {"ack": 2} and answer[1]["successful"]
        deliveries, reply = await raw.connect(2)
        assert datas(deliveries) == ["with it"] and reply["ext"] == {"ack": 3}


async def test_a_handshake_offering_no_common_transport_is_refused(server: Running) -> None:
    async with raw_client(server.http_api_port) as raw:
        offered = ["callback-polling"]
        message = {"id": "1", "channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": offered}
        (reply,) = await raw.post([message], "/handshake")
        assert reply["successful"] is False and reply["error"] == bx.CONNECTION_TYPE_UNSUPPORTED
        assert reply["supportedConnectionTypes"] == ["websocket", "long-polling"]
        assert server.bayeux is not None and server.bayeux.statistics().sessions == 0
