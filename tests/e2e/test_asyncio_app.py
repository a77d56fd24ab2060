"""The client in an asyncio service, as users run one: a Starlette app (FastAPI is built on it) served
by hypercorn's asyncio worker publishes an order per HTTP request through a client it opened at
startup, and a worker consumes them with manual acks; a worker that dies without acking gets its
orders again, and the client comes back after the STAN server is SIGKILLed and restarted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config as HypercornConfig
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from streaming.client import StanClient, StartPosition, connect
from tests.support.servers import ServerProcess, free_port, state_stored

CID = "test-cluster"


def orders_app(stan_port: int) -> Starlette:
    """What a user writes: one STAN session for the app's life, a publish per request."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with connect(CID, "web", port=stan_port, reconnect_wait_s=0.1) as stan:
            app.state.stan = stan
            yield

    async def create_order(request: Request) -> JSONResponse:
        stan: StanClient = request.app.state.stan
        guid = await stan.publish("orders", await request.body())  # stored before the 201
        return JSONResponse({"guid": guid}, status_code=201)

    return Starlette(routes=[Route("/orders", create_order, methods=["POST"])], lifespan=lifespan)


async def consume(port: int, count: int, *, ack: bool) -> list[tuple[int, bool, dict[str, int]]]:
    """A worker: the durable `billing`, manual acks; (seq, redelivered, order) for `count` orders."""
    got = []
    async with connect(CID, "worker", port=port) as sc:
        async with sc.subscribe(
            "orders", durable="billing", manual_ack=True, ack_wait=1, start_at=StartPosition.FIRST, close_on_exit=True
        ) as sub:
            with anyio.fail_after(10):
                for _ in range(count):
                    msg = await sub.next_msg()
                    got.append((msg.seq, msg.redelivered, json.loads(msg.data)))
                    if ack:
                        msg.ack()
    return got


def test_an_asyncio_web_app_publishes_and_a_worker_acks(tmp_path: Path) -> None:
    stan_port, http_port = free_port(), free_port()
    server = ServerProcess(["-p", str(stan_port), "--http_port=-1", "--dir", str(tmp_path / "data")]).start()

    async def scenario() -> None:
        config = HypercornConfig()
        config.bind = [f"127.0.0.1:{http_port}"]
        stop = asyncio.Event()
        web = asyncio.create_task(hypercorn_serve(orders_app(stan_port), config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=15) as http:
                for attempt in range(100):  # hypercorn is up once it answers
                    try:
                        await http.get("/")
                        break
                    except httpx.ConnectError:
                        await asyncio.sleep(0.05 * (attempt < 99))
                for i in range(3):
                    response = await http.post("/orders", json={"order": i})
                    assert response.status_code == 201 and response.json()["guid"]

                # A worker that dies before acking: its orders come back to the next one.
                first = await consume(stan_port, 3, ack=False)
                assert [(seq, redelivered) for seq, redelivered, _ in first] == [(1, False), (2, False), (3, False)]
                again = await consume(stan_port, 3, ack=True)
                assert [(seq, redelivered) for seq, redelivered, _ in again] == [(1, True), (2, True), (3, True)]
                assert [order for _, _, order in again] == [{"order": i} for i in range(3)]

                # The STAN server dies and comes back: the app's client reconnects, its session intact.
                await state_stored(server.http_port)  # the acks are stored (they linger up to 30 ms)
                server.kill()
                server.start()
                response = await http.post("/orders", json={"order": 3})
                assert response.status_code == 201
                assert [(seq, order) for seq, _, order in await consume(stan_port, 1, ack=True)] == [(4, {"order": 3})]
        finally:
            stop.set()
            await web

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
