"""The Bayeux endpoint's routes, on the client-facing HTTP listener (a Starlette app served by hypercorn's
Trio worker in the server's own Trio process: one task per HTTP connection, so a held `/meta/connect`
never blocks the client's other request).

Every Bayeux answer is HTTP 200 with a JSON array; only a body that is not Bayeux at all is refused
with an HTTP status (400 not JSON, 413 too large), with a JSON body naming the problem. A WebSocket
upgrade on the same path speaks Bayeux over the socket (`streaming.bayeux.websocket`) once its
`Origin` passes the listener's check (`streaming.security.origins`); one that does not gets 403.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from streaming.bayeux import protocol as bx
from streaming.bayeux.door import BayeuxDoor
from streaming.bayeux.websocket import CLOSE_POLICY, BayeuxSocket
from streaming.security.auth import Authenticator
from streaming.security.http_auth import permissions_of
from streaming.security.origins import Origins

log = logging.getLogger(__name__)

_JSON = "application/json;charset=UTF-8"


class BayeuxApp:
    def __init__(
        self,
        door: BayeuxDoor,
        *,
        path: str = "/cometd",
        max_body_bytes: int = 1024 * 1024,
        auth: Authenticator | None = None,
        origins: Origins | None = None,
    ) -> None:
        self.door = door
        self.auth = auth or Authenticator()
        self.origins = origins or Origins()
        self.max_body_bytes = max_body_bytes
        self.path = base = "/" + path.strip("/")
        self.routes: list[BaseRoute] = [
            Route(base, self.post, methods=["POST"]),
            Route(base, self.refuse_get, methods=["GET"]),
            WebSocketRoute(base, self.websocket),
        ]
        for suffix in ("/", "/handshake", "/connect", "/disconnect"):
            self.routes.append(Route(base + suffix, self.post, methods=["POST"]))

    async def post(self, request: Request) -> Response:
        body = bytearray()
        async for chunk in request.stream():  # chunked bodies too (the Node client sends those)
            body += chunk
            if len(body) > self.max_body_bytes:
                # The rest of the body is not read: the connection cannot carry another request.
                return _problem(413, f"the body is over {self.max_body_bytes} bytes", close=True)
        try:
            messages = bx.parse_body(bytes(body))
        except bx.BadBody as exc:
            return _problem(400, str(exc))
        answer = await self.door.handle(messages, permissions_of(request, self.auth))
        return Response(bx.encode_answer(answer), media_type=_JSON)

    async def refuse_get(self, request: Request) -> Response:
        return _problem(400, "this endpoint takes Bayeux messages by POST (long-polling) or over a WebSocket")

    async def websocket(self, ws: WebSocket) -> None:
        origin = ws.headers.get("origin")
        if not self.origins.allows_socket(origin, ws.headers.get("host"), ws.url.scheme):
            client = ws.client.host if ws.client else "?"
            log.warning("bayeux websocket from %s refused: origin %r is not allowed", client, origin)
            await ws.close(CLOSE_POLICY)  # before accepting: the upgrade is answered 403
            return
        await ws.accept()
        await BayeuxSocket(ws, self.door, permissions_of(ws, self.auth), self.max_body_bytes).run()


def _problem(status: int, text: str, *, close: bool = False) -> Response:
    headers = {"Connection": "close"} if close else None
    body = [{"successful": False, "error": f"{status}::{text}"}]
    return JSONResponse(body, status_code=status, media_type=_JSON, headers=headers)
