"""The least a Bayeux server on our HTTP stack can do, for bench/bayeux.py's floor: what Faye does.

    python bench/bayeux_floor.py PORT [--durable DIR]

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

With `--durable DIR` it adds the one step that a durable server cannot skip: a request's or frame's
publishes reach the disk before anyone sees them. Its JSON is appended to a file in DIR and
`fdatasync`ed on the event loop (`bench/floor_log.py`) before the fan-out and the answer, as ours
does for a small commit. That bounds what a server that
delivers only what is on disk can reach on this stack and this disk.
"""

from __future__ import annotations

import argparse
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
from bench.floor_log import FloorLog
from streaming.http_listener import set_websocket_compression

_ADVICE = {"reconnect": "retry", "interval": 0, "timeout": 30000}
_HOLD_S = 30.0


class _Session:
    def __init__(self) -> None:
        self.queue: list[dict[str, Any]] = []
        self.wake = trio.Event()


class FloorBayeux:
    def __init__(self, log: FloorLog | None) -> None:
        self.sessions: dict[str, _Session] = {}
        self.subscribers: dict[str, list[_Session]] = {}
        self.next_id = 0
        self.log = log

    def _persist(self, text: str | bytes, messages: list[dict[str, Any]]) -> None:
        """With a log, a request's publishes (its whole text, as it came) on disk before they fan out."""
        if self.log is not None and any(not m["channel"].startswith("/meta/") for m in messages):
            self.log.append(text.encode() if isinstance(text, str) else text)

    async def post(self, request: Request) -> Response:
        out: list[dict[str, Any]] = []
        body = await request.body()
        messages = json.loads(body)
        self._persist(body, messages)
        for message in messages:
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
                    text = await ws.receive_text()
                except WebSocketDisconnect:
                    break
                messages = json.loads(text)
                self._persist(text, messages)
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("port", type=int)
    parser.add_argument("--durable", type=Path, metavar="DIR", help="publishes on disk before they are seen")
    args = parser.parse_args()
    config = Config()
    config.bind = [f"127.0.0.1:{args.port}"]
    config.accesslog = None
    set_websocket_compression(False)
    floor = FloorBayeux(FloorLog(args.durable / "floor-log") if args.durable else None)
    app = Starlette(routes=[Route("/cometd", floor.post, methods=["POST"]), WebSocketRoute("/cometd", floor.websocket)])
    trio.run(serve, app, config)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
