"""Durable Bayeux subscriptions (`ext.durable` on `/meta/subscribe`), with the hand-made HTTP client:
a durable outlives its session and the server, and the next session that names it gets what was
not acknowledged first, then what was published meanwhile, in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streaming.bayeux import protocol as bx
from tests.bayeux.harness import Raw, bayeux_config, publish_over_http, raw_client
from tests.support.servers import eventually, running

pytestmark = pytest.mark.slow


async def subscribe_durable(raw: Raw, channel: str, durable: Any) -> dict[str, Any]:
    await raw.handshake()
    await raw.connect(0, now=True)
    message = {"id": raw.next_id(), "channel": "/meta/subscribe", "subscription": channel, "clientId": raw.client_id}
    (reply,) = await raw.post([{**message, "ext": {"durable": durable}}])
    return reply


async def test_a_durable_gives_the_next_session_what_was_not_acknowledged_then_the_rest(tmp_path: Path) -> None:
    async with running(bayeux_config(tmp_path / "data")) as server:
        async with raw_client(server.http_api_port) as first:
            assert (await subscribe_durable(first, "/d/a", "page-1"))["successful"]
            await publish_over_http(server.http_api_port, "/d/a", [1, 2])
            deliveries, _ = await first.connect(1)
            assert [d["data"] for d in deliveries] == [1, 2]
            await first.post([{"channel": "/meta/disconnect", "clientId": first.client_id}])  # never acknowledged
        await publish_over_http(server.http_api_port, "/d/a", [3])
        async with raw_client(server.http_api_port) as second:
            assert (await subscribe_durable(second, "/d/a", "page-1"))["successful"]
            deliveries, reply = await second.connect(1)
            assert [d["data"] for d in deliveries] == [1, 2, 3]
            await second.connect(reply["ext"]["ack"], now=True)
            await eventually(lambda: sum(v.pending_count for v in server.core.engine.views()) == 0)


async def test_a_durable_goes_on_after_a_restart_with_nothing_lost(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    async with running(bayeux_config(directory)) as server:
        async with raw_client(server.http_api_port) as raw:
            assert (await subscribe_durable(raw, "/d/r", "keeper"))["successful"]
            await publish_over_http(server.http_api_port, "/d/r", ["a", "b"])
            deliveries, reply = await raw.connect(1)
            assert [d["data"] for d in deliveries] == ["a", "b"]
            await raw.connect(reply["ext"]["ack"], now=True)  # a and b acknowledged
            await publish_over_http(server.http_api_port, "/d/r", ["c"])
            deliveries, _ = await raw.connect(reply["ext"]["ack"])
            assert [d["data"] for d in deliveries] == ["c"]  # sent, not acknowledged when the server stops
    async with running(bayeux_config(directory)) as server:
        await publish_over_http(server.http_api_port, "/d/r", ["d"])
        async with raw_client(server.http_api_port) as raw:
            assert (await subscribe_durable(raw, "/d/r", "keeper"))["successful"]
            deliveries, _ = await raw.connect(1)
            assert [d["data"] for d in deliveries] == ["c", "d"], "recovered pending first, nothing acked again"


async def test_a_durable_held_by_a_session_is_refused_to_another_and_a_bad_name_is_refused(tmp_path: Path) -> None:
    async with running(bayeux_config(tmp_path / "data")) as server:
        async with raw_client(server.http_api_port) as a, raw_client(server.http_api_port) as b:
            assert (await subscribe_durable(a, "/d/x", "mine"))["successful"]
            taken = await subscribe_durable(b, "/d/x", "mine")
            assert taken["successful"] is False and taken["error"] == bx.DURABLE_IN_USE
            for bad in ("", "a b", "x" * 65, 7, "dots.are.not"):
                (reply,) = await b.post(
                    [
                        {
                            "channel": "/meta/subscribe",
                            "subscription": "/d/x",
                            "clientId": b.client_id,
                            "ext": {"durable": bad},
                        }
                    ]
                )
                assert reply["error"] == bx.DURABLE_INVALID, bad


async def test_unsubscribing_a_durable_ends_it(tmp_path: Path) -> None:
    async with running(bayeux_config(tmp_path / "data")) as server:
        async with raw_client(server.http_api_port) as raw:
            assert (await subscribe_durable(raw, "/d/u", "gone"))["successful"]
            await publish_over_http(server.http_api_port, "/d/u", ["old"])
            message = {"channel": "/meta/unsubscribe", "subscription": "/d/u", "clientId": raw.client_id}
            (reply,) = await raw.post([message])
            assert reply["successful"]
            await raw.post([{"channel": "/meta/disconnect", "clientId": raw.client_id}])
        await publish_over_http(server.http_api_port, "/d/u", ["between"])
        async with raw_client(server.http_api_port) as raw:
            assert (await subscribe_durable(raw, "/d/u", "gone"))["successful"]
            await publish_over_http(server.http_api_port, "/d/u", ["new"])
            deliveries, _ = await raw.connect(1)
            assert [d["data"] for d in deliveries] == ["new"], "a new durable starts at new messages"
