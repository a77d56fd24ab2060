"""`bench/bayeux_floor.py` does the work it is the floor of: a subscriber's held connect is answered with
what another client published, and with `--durable` every publish is in the log on disk by the time
anyone is handed it, while a request of only meta messages writes nothing. A floor that skipped the
fan-out or the write would measure nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from bench import bayeux, peers


@pytest.fixture
def durable_floor() -> Iterator[peers.Server]:
    with bayeux.server("durable_floor") as server:
        yield server


async def _bayeux(client: httpx.AsyncClient, *messages: dict[str, Any]) -> list[dict[str, Any]]:
    response = await client.post("/cometd", json=list(messages))
    response.raise_for_status()
    answer: list[dict[str, Any]] = response.json()
    return answer


async def _handshake(client: httpx.AsyncClient) -> str:
    (reply,) = await _bayeux(client, {"channel": "/meta/handshake", "version": "1.0"})
    client_id: str = reply["clientId"]
    return client_id


def _log(server: peers.Server) -> bytes:
    return (server.data / "floor-log").read_bytes().rstrip(b"\0")


async def test_a_publish_is_on_disk_when_the_subscriber_is_handed_it(durable_floor: peers.Server) -> None:
    base = f"http://127.0.0.1:{durable_floor.port}"
    async with httpx.AsyncClient(base_url=base) as sub, httpx.AsyncClient(base_url=base) as pub:
        subscriber, publisher = await _handshake(sub), await _handshake(pub)
        await _bayeux(sub, {"channel": "/meta/subscribe", "clientId": subscriber, "subscription": "/a"})
        await _bayeux(sub, {"channel": "/meta/connect", "clientId": subscriber, "advice": {"timeout": 0}})
        assert _log(durable_floor) == b""  # meta messages are not written
        got: list[dict[str, Any]] = []

        async def held_connect() -> None:
            got.extend(await _bayeux(sub, {"channel": "/meta/connect", "clientId": subscriber}))
            seen_on_disk.append(_log(durable_floor))

        seen_on_disk: list[bytes] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(held_connect)
                await trio.sleep(0.2)  # the connect is held by now
                (ack,) = await _bayeux(pub, {"channel": "/a", "clientId": publisher, "data": {"n": "payload-7"}})
    assert ack["successful"]
    assert [m["data"] for m in got if m["channel"] == "/a"] == [{"n": "payload-7"}]
    assert b"payload-7" in seen_on_disk[0]
