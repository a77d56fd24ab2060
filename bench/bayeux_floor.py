"""The least a Bayeux server on our HTTP stack can do, for bench/bayeux.py's floor: what Faye does.

    python bench/bayeux_floor.py PORT

A Starlette app served by hypercorn's Trio worker, as our HTTP doors are, that speaks just enough
Bayeux for the CometD client of bench/node/bayeux_clients.mjs, over long-polling and over WebSocket
(text frames of JSON arrays, permessage-deflate declined, as ours): handshake, connect (held until a
message is queued for the session, or 30 s; over a WebSocket in a task of its own so the socket reads
on), subscribe, disconnect, and publishing, which queues the message for every subscriber in memory
and answers at once. Like Faye it keeps nothing on
disk and offers no acks (it does not answer the client's `ext.ack`, so the client sends none). It
checks nothing a real server must: no validation of the messages, no limits, no expiry, no
durability. Its throughput is what the HTTP stack and the JSON codec leave when a server does no
work of its own, so it bounds what any server on this stack can reach in the same benchmark.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from streaming.http_listener import set_websocket_compression

_ADVICE = {"reconnect": "retry", "interval": 0, "timeout": 30000}
_HOLD_S = 30.0


class _Session:
    def __init__(self) -> None:
        self.queue: list[dict[str, Any]] = []
        self.wake = trio.Event()


class FloorBayeux:
    def __init__(self) -> None:
        self.sessions: dict[str, _Session] = {}
        self.subscribers: dict[str, list[_Session]] = {}
        self.next_id = 0

    async def post(self, request: Request) -> Response:
        out: list[dict[str, Any]] = []
        for message in json.loads(await request.body()):
            out.extend(await self._one(message))
        return Response(json.dumps(out, separators=(",", ":")), media_type="application/json")

    async def websocket(self, ws: WebSocket) -> None:
        await ws.accept()
        lock = trio.Lock()

        async def answer(messages: list[dict[str, Any]]) -> None:
            out: list[dict[str, Any]] = []
            for message in messages:
                out.extend(await self._one(message))
            async with lock:
                await ws.send_text(json.dumps(out, separators=(",", ":")))

        async with trio.open_nursery() as nursery:
            while True:
                try:
                    messages = json.loads(await ws.receive_text())
                except WebSocketDisconnect:
                    break
                if len(messages) == 1 and messages[0].get("channel") == "/meta/connect":
                    nursery.start_soon(answer, messages)  # held: the socket reads on meanwhile
                else:
                    await answer(messages)
            nursery.cancel_scope.cancel()

    async def _one(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        channel = message["channel"]
        reply = {"channel": channel, "successful": True, "id": message.get("id")}
        if channel == "/meta/handshake":
            client_id = secrets.token_hex(16)
            self.sessions[client_id] = _Session()
            types = ["websocket", "long-polling"]
            reply.update(clientId=client_id, version="1.0", supportedConnectionTypes=types, advice=_ADVICE)
            return [reply]
        session = self.sessions[message["clientId"]]
        if channel == "/meta/connect":
            advice = message.get("advice") or {}
            if not session.queue and advice.get("timeout") != 0:
                with trio.move_on_after(_HOLD_S):
                    await session.wake.wait()
            session.wake = trio.Event()
            queued, session.queue = session.queue, []
            reply["advice"] = _ADVICE
            return [*queued, reply]
        if channel == "/meta/subscribe":
            self.subscribers.setdefault(message["subscription"], []).append(session)
            reply["subscription"] = message["subscription"]
            return [reply]
        if channel == "/meta/disconnect":
            self.sessions.pop(message["clientId"], None)
            return [reply]
        for subscriber in self.subscribers.get(channel, ()):
            self.next_id += 1
            subscriber.queue.append({"channel": channel, "data": message.get("data"), "id": str(self.next_id)})
            subscriber.wake.set()
        return [reply]


def main() -> None:
    config = Config()
    config.bind = [f"127.0.0.1:{int(sys.argv[1])}"]
    config.accesslog = None
    set_websocket_compression(False)
    floor = FloorBayeux()
    app = Starlette(routes=[Route("/cometd", floor.post, methods=["POST"]), WebSocketRoute("/cometd", floor.websocket)])
    trio.run(serve, app, config)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
