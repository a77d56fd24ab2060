"""The client-facing HTTP listener: the Bayeux endpoint as a Starlette app, served by hypercorn's Trio
worker in the server's own Trio process (one task per HTTP connection, so a held `/meta/connect`
never blocks the client's other request).

Every Bayeux answer is HTTP 200 with a JSON array; only a body that is not Bayeux at all is refused
with an HTTP status (400 not JSON, 413 too large), with a JSON body naming the problem. A WebSocket
upgrade is refused (not 101), so CometD clients fall back to long-polling at once.
"""

from __future__ import annotations

import logging
from functools import partial

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from streaming.bayeux import protocol as bx
from streaming.bayeux.door import BayeuxDoor
from streaming.http_listener import serve_asgi

log = logging.getLogger(__name__)
_JSON = "application/json;charset=UTF-8"


class BayeuxApp:
    def __init__(self, door: BayeuxDoor, *, path: str = "/cometd", max_body_bytes: int = 1024 * 1024) -> None:
        self.door = door
        self.max_body_bytes = max_body_bytes
        self.path = base = "/" + path.strip("/")
        routes = [Route(base, self.post, methods=["POST"]), Route(base, self.refuse_get, methods=["GET"])]
        for suffix in ("/", "/handshake", "/connect", "/disconnect"):
            routes.append(Route(base + suffix, self.post, methods=["POST"]))
        self.app = Starlette(routes=routes)

    async def post(self, request: Request) -> Response:
        body = bytearray()
        async for chunk in request.stream():  # chunked bodies too (the Node client sends those)
            body += chunk
            if len(body) > self.max_body_bytes:
                return _problem(413, f"the body is over {self.max_body_bytes} bytes")
        try:
            messages = bx.parse_body(bytes(body))
        except bx.BadBody as exc:
            return _problem(400, str(exc))
        answer = await self.door.handle(messages)
        return Response(bx.encode_answer(answer), media_type=_JSON)

    async def refuse_get(self, request: Request) -> Response:
        return _problem(400, "this endpoint takes Bayeux messages by POST (long-polling); WebSocket is not offered")


def _problem(status: int, text: str) -> Response:
    return JSONResponse([{"successful": False, "error": f"{status}::{text}"}], status_code=status, media_type=_JSON)


async def serve_http_api(
    app: BayeuxApp, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve until cancelled; `task_status` gets the bound port (useful with port 0)."""
    # Connections stay open longer than a held connect, so a client's next request reuses its own.
    serve = partial(serve_asgi, app.app, host, port, log_name="streaming.bayeux.http.server", keep_alive_s=75.0)
    async with trio.open_nursery() as nursery:
        bound: int = await nursery.start(serve)
        log.info("Listening for HTTP clients (Bayeux at %s) on %s:%d", app.path, host, bound)
        task_status.started(bound)
