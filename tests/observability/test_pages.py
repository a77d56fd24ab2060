"""The monitoring pages and /metrics over real HTTP (hypercorn on loopback) after a scripted run: what
they say matches what the server holds; bad parameters get a 400, unknown names a 404."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.observability.traffic import AUDIT, DLQ_CHANNEL, ORDERS, RETRY, scripted_run
from tests.support.servers import config, running


async def get(client: httpx.AsyncClient, path: str, status: int = 200) -> Any:
    response = await client.get(path)
    assert response.status_code == status, response.text
    return response.json()


async def test_pages_match_the_server_after_a_scripted_run(tmp_path: Path) -> None:
    async with running(config(tmp_path, http_port=-1)) as server:
        assert server.http_port > 0
        async with (
            scripted_run(server.port),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http,
        ):
            serverz = await get(http, "/streaming/serverz")
            assert serverz["cluster_id"] == "test-cluster"
            assert serverz["clients"] == 2  # mon-pub and mon-watch; the queue members have closed
            assert serverz["subscriptions"] == 2  # d1 and the audit subscription
            assert serverz["channels"] == 5
            total = ORDERS + AUDIT + 1 + 1 + 1  # the poison message, its dead letter, the nak'd one
            assert serverz["total_msgs"] == total
            assert serverz["state"] == "STANDALONE"

            storez = await get(http, "/streaming/storez")
            assert storez["type"] == "LMDB" and storez["file_sync"] is True
            assert storez["total_msgs"] == total
            assert storez["limits"]["max_channels"] == 100
            assert storez["total_bytes"] == sum(c.bytes for c in server.store.channels())
            assert (storez["writable"], storez["write_error"], storez["damaged_messages"]) == (True, None, 0)

            channelsz = await get(http, "/streaming/channelsz")
            assert channelsz["names"] == sorted(["orders", "audit", "jobs", DLQ_CHANNEL, RETRY])
            assert (channelsz["count"], channelsz["total"]) == (5, 5)

            orders = await get(http, "/streaming/channelsz?channel=orders&subs=1")
            assert (orders["msgs"], orders["first_seq"], orders["last_seq"]) == (ORDERS, 1, ORDERS)
            subs = {s["durable_name"] or s["queue_name"]: s for s in orders["subscriptions"]}
            d1 = subs["d1"]
            assert d1["client_id"] == "mon-watch"
            assert d1["is_durable"] and not d1["is_offline"]
            assert (d1["last_sent"], d1["pending_count"]) == (ORDERS, 0)
            # The queue group "workers" has no members left and was removed.
            assert "workers" not in subs

            page = await get(http, "/streaming/channelsz?offset=1&limit=2&subs=1")
            assert (page["offset"], page["limit"], page["count"], page["total"]) == (1, 2, 2, 5)
            assert [c["name"] for c in page["channels"]] == sorted(["orders", "audit", "jobs", DLQ_CHANNEL, RETRY])[1:3]

            clientsz = await get(http, "/streaming/clientsz?subs=1")
            assert [c["id"] for c in clientsz["clients"]] == ["mon-pub", "mon-watch"]
            watch = clientsz["clients"][1]
            assert sorted(watch["subscriptions"]) == ["audit", "orders"]
            assert watch["subscriptions"]["audit"][0]["pending_count"] == 0
            one = await get(http, "/streaming/clientsz?client=mon-pub")
            assert one["id"] == "mon-pub" and one["hb_inbox"]

            await get(http, "/streaming/channelsz?channel=nope", 404)
            await get(http, "/streaming/clientsz?client=nope", 404)
            await get(http, "/streaming/channelsz?limit=many", 400)


async def test_metrics_count_what_happened(tmp_path: Path) -> None:
    async with running(config(tmp_path, http_port=-1)) as server:
        async with (
            scripted_run(server.port),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http,
        ):
            response = await http.get("/metrics")
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/plain")
            samples = parse(response.text)
    assert samples['streaming_published_messages_total{channel="orders"}'] == ORDERS
    assert samples['streaming_channel_messages{channel="audit"}'] == AUDIT
    assert samples["streaming_clients"] == 2
    assert samples['streaming_deliveries_total{channel="orders",group="d1",reason="ack_timeout"}'] >= 1
    assert samples['streaming_deliveries_total{channel="orders",group="workers",reason="member_left"}'] == 5
    assert samples['streaming_ack_timeouts_total{channel="orders",group="d1"}'] >= 1
    assert samples['streaming_dead_lettered_total{channel="jobs",group=""}'] == 1
    assert samples['streaming_queue_member_changes_total{change="leave",channel="orders",group="workers"}'] == 2
    assert samples['streaming_acks_total{channel="audit",group=""}'] == AUDIT
    assert samples["streaming_store_commit_duration_seconds_count"] >= 1
    (build,) = [k for k in samples if k.startswith("streaming_build_info{")]
    assert 'version="0.1.0"' in build and samples[build] == 1


def parse(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def test_a_wildcard_subscription_counts_once_and_shows_on_each_channel(tmp_path: Path) -> None:
    from streaming.client import StartPosition, connect

    async with running(config(tmp_path, http_port=-1)) as server:
        async with (
            connect("test-cluster", "wild-watch", port=server.port) as sc,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http,
        ):
            for channel in ("w.a", "w.b", "w.c"):
                await sc.publish(channel, b"x")
            sub = await sc.open_subscription("w.*", start_at=StartPosition.FIRST, manual_ack=True, max_inflight=10)
            got = [await sub.next_msg() for _ in range(3)]
            serverz = await get(http, "/streaming/serverz")
            assert serverz["subscriptions"] == 1, "one subscription, however many channels it follows"
            on_b = await get(http, "/streaming/channelsz?channel=w.b&subs=1")
            assert [s["pending_count"] for s in on_b["subscriptions"]] == [1]
            watch = await get(http, "/streaming/clientsz?client=wild-watch&subs=1")
            assert sorted(watch["subscriptions"]) == ["w.*", "w.a", "w.b", "w.c"]
            assert watch["subscriptions"]["w.*"][0]["pending_count"] == 3, "its pending over all its channels"
            metrics = (await http.get("/metrics")).text
            assert 'streaming_subscriptions{state="online"} 1.0' in metrics
            assert 'streaming_ack_pending_messages{channel="w.a",group=""} 1.0' in metrics
            assert 'channel="w.*"' not in metrics, "the pattern is counted on its channels, not as one"
            for msg in got:
                msg.ack()
