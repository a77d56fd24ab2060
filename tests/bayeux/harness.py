"""What the Bayeux tests drive: the real server with its HTTP client port, the real CometD client under
Node, a raw HTTP Bayeux client (httpx) for what the JS client never does, and a loopback TCP proxy
that can drop connections or swallow one chosen response."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from streaming.config import ServerConfig
from tests.support.servers import config

NODE_DIR = Path(__file__).parent.parent / "node"
DRIVER = NODE_DIR / "cometd_driver.mjs"
TIMEOUT_S = 2.0  # the server's bayeux_timeout in these tests
MAX_INTERVAL_S = 3.0

node = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_DIR / "node_modules" / "cometd").is_dir(),
    reason="run `npm ci --prefix tests/node` (CI does)",
)


def bayeux_config(directory: Path | None = None, **overrides: Any) -> ServerConfig:
    values: dict[str, Any] = {
        "http_api_port": -1,
        "bayeux_timeout": TIMEOUT_S,
        "bayeux_max_interval": MAX_INTERVAL_S,
    }
    values.update(overrides)
    return config(directory, **values)


Message = dict[str, Any]


class Raw:
    """A Bayeux client by hand: each call is one POST of a JSON array."""

    def __init__(self, http: httpx.AsyncClient, path: str = "/cometd") -> None:
        self.http = http
        self.path = path
        self.client_id = ""
        self._id = 0

    def next_id(self) -> str:
        self._id += 1
        return str(self._id)

    async def post(self, messages: list[Any] | Message, suffix: str = "/") -> list[Message]:
        response = await self.http.post(self.path + suffix, json=messages, timeout=30)
        assert response.status_code == 200, response.text
        answer: list[Message] = response.json()
        assert isinstance(answer, list)
        assert answer, "a Bayeux response is never an empty array"
        return answer

    async def handshake(self, *, ack: bool = True) -> Message:
        message: Message = {
            "id": self.next_id(),
            "channel": "/meta/handshake",
            "version": "1.0",
            "supportedConnectionTypes": ["long-polling"],
        }
        if ack:
            message["ext"] = {"ack": True}
        (reply,) = await self.post([message], "/handshake")
        assert reply["successful"], reply
        self.client_id = reply["clientId"]
        return reply

    def connect_message(self, ack: int | None = None, *, now: bool = False) -> Message:
        message: Message = {
            "id": self.next_id(),
            "channel": "/meta/connect",
            "connectionType": "long-polling",
            "clientId": self.client_id,
        }
        if ack is not None:
            message["ext"] = {"ack": ack}
        if now:
            message["advice"] = {"timeout": 0}
        return message

    async def connect(self, ack: int | None = None, *, now: bool = False) -> tuple[list[Message], Message]:
        """The deliveries of one connect round trip, and the connect reply (which comes last)."""
        answer = await self.post([self.connect_message(ack, now=now)], "/connect")
        *deliveries, reply = answer
        assert reply["channel"] == "/meta/connect", answer
        assert all(d["channel"] != "/meta/connect" for d in deliveries)
        return deliveries, reply

    async def subscriber(self, channel: str) -> Message:
        """A new session subscribed to `channel`: handshake (with acks), the first connect (answered at
        once: batch 1) and the subscribe, whose reply it returns."""
        await self.handshake()
        await self.connect(0, now=True)
        return await self.subscribe(channel)

    async def subscribe(self, channel: str) -> Message:
        message = {"id": self.next_id(), "channel": "/meta/subscribe", "subscription": channel}
        (reply,) = await self.post([{**message, "clientId": self.client_id}])
        return reply

    async def publish(self, channel: str, data: Any) -> Message:
        message = {"id": self.next_id(), "channel": channel, "data": data, "clientId": self.client_id}
        (reply,) = await self.post([message])
        return reply


@asynccontextmanager
async def raw_client(port: int) -> AsyncIterator[Raw]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        yield Raw(http)


async def publish_over_http(port: int, channel: str, datas: list[Any]) -> None:
    """Publish `datas` in order from a fresh Bayeux session, each answered (stored) before the next."""
    async with raw_client(port) as pub:
        await pub.handshake()
        for data in datas:
            assert (await pub.publish(channel, data))["successful"]


class RawSocket:
    """A Bayeux client by hand over one WebSocket: `send` writes one frame (a JSON array), `reply`
    reads frames until the reply to a message id comes, keeping the deliveries read on the way."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.client_id = ""
        self.deliveries: list[Message] = []  # messages read that are no reply
        self.frames: list[list[Message]] = []  # every frame read, in order
        self._replies: dict[str, Message] = {}
        self._id = 0

    def next_id(self) -> str:
        self._id += 1
        return str(self._id)

    async def send(self, messages: list[Message]) -> None:
        await self.ws.send_message(json.dumps(messages))

    async def read(self) -> list[Message]:
        """One frame's messages."""
        frame: list[Message] = json.loads(await self.ws.get_message())
        assert isinstance(frame, list) and frame, frame
        self.frames.append(frame)
        for m in frame:
            if "successful" in m and "id" in m:
                self._replies[m["id"]] = m
            elif "data" in m:
                self.deliveries.append(m)
        return frame

    async def reply(self, msg_id: str, within: float = 10.0) -> Message:
        with trio.fail_after(within):
            while msg_id not in self._replies:
                await self.read()
        return self._replies.pop(msg_id)

    async def call(self, message: Message) -> Message:
        message = {"id": self.next_id(), **message}
        if self.client_id and message["channel"] != "/meta/handshake":
            message["clientId"] = self.client_id
        await self.send([message])
        return await self.reply(message["id"])

    async def handshake(self) -> Message:
        offer = {"version": "1.0", "supportedConnectionTypes": ["websocket"], "ext": {"ack": True}}
        reply = await self.call({"channel": "/meta/handshake", **offer})
        assert reply["successful"], reply
        self.client_id = reply["clientId"]
        return reply

    async def connect(self, ack: int, *, now: bool = False) -> Message:
        message: Message = {"channel": "/meta/connect", "connectionType": "websocket", "ext": {"ack": ack}}
        if now:
            message["advice"] = {"timeout": 0}
        return await self.call(message)

    async def subscribe(self, channel: str) -> Message:
        return await self.call({"channel": "/meta/subscribe", "subscription": channel})


@asynccontextmanager
async def raw_socket(
    port: int, *, origin: str | None = None, headers: list[tuple[str, str]] | None = None, path: str = "/cometd"
) -> AsyncIterator[RawSocket]:
    extra = [(name.encode(), value.encode()) for name, value in headers or []]
    if origin is not None:
        extra.append((b"Origin", origin.encode()))
    async with open_websocket_url(f"ws://127.0.0.1:{port}{path}", extra_headers=extra, connect_timeout=10) as ws:
        yield RawSocket(ws)


class Proxy:
    """A loopback TCP proxy to `target`: `drop_for(d)` closes every connection and refuses new ones
    for d seconds; `swallow(marker)` drops the first server-to-client bytes containing `marker` and
    closes that connection, so its response never arrives."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self._refuse_until = -math.inf
        self._scopes: set[trio.CancelScope] = set()
        self._marker: bytes | None = None
        self.swallowed: list[bytes] = []
        self.log: list[bytearray] = []  # per connection: the server-to-client bytes that got through
        self.held = False  # while true, server-to-client bytes wait (a client whose connect is held back)
        self._release = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._handle, listeners)
            task_status.started(self.port)

    def drop_for(self, seconds: float) -> None:
        self._refuse_until = trio.current_time() + seconds
        for scope in list(self._scopes):
            scope.cancel()

    def swallow(self, marker: bytes) -> None:
        self._marker = marker

    def hold(self) -> None:
        self.held = True
        self._release = trio.Event()

    def release(self) -> None:
        self.held = False
        self._release.set()

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            if trio.current_time() < self._refuse_until:
                return
            server = await trio.open_tcp_stream("127.0.0.1", self.target)
            log = bytearray()
            self.log.append(log)
            async with server, trio.open_nursery() as nursery:
                self._scopes.add(nursery.cancel_scope)
                nursery.start_soon(self._pump, client, server, None, nursery.cancel_scope)
                nursery.start_soon(self._pump, server, client, log, nursery.cancel_scope)
            self._scopes.discard(nursery.cancel_scope)

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, log: bytearray | None, scope: trio.CancelScope
    ) -> None:
        try:
            async for data in source:
                if log is not None:  # server to client
                    if self.held:
                        await self._release.wait()
                    if self._marker is not None and self._marker in data:
                        self._marker = None
                        self.swallowed.append(bytes(data))
                        scope.cancel()
                        return
                    log += data
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()

    def responses(self) -> list[list[Message]]:
        """The JSON bodies of the responses that reached the client, per connection in order."""
        bodies: list[list[Message]] = []
        for stream in self.log:
            data = bytes(stream)
            while b"\r\n\r\n" in data:
                head, _, rest = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(rest) < length:
                    break  # cut off (a dropped connection)
                body, data = rest[:length], rest[length:]
                if body:
                    bodies.append(json.loads(body))
        return bodies


class Cometd:
    """The real CometD JS client in a Node process, driven by commands and read by events."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.events: list[Message] = []
        self._changed = trio.Event()

    @classmethod
    @asynccontextmanager
    async def start(cls, url: str, **options: Any) -> AsyncIterator[Cometd]:
        process = await trio.lowlevel.open_process(
            ["node", str(DRIVER), url, json.dumps(options)],
            stdin=-1,
            stdout=-1,
            cwd=str(NODE_DIR),
        )
        client = cls(process)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._read)
            try:
                yield client
            finally:
                process.kill()
                nursery.cancel_scope.cancel()

    async def _read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    try:
                        event = json.loads(line)
                    except ValueError:  # the client's own console output
                        event = {"ev": "log", "text": line.decode(errors="replace")}
                    event["_t"] = trio.current_time()  # when pytest saw it
                    self.events.append(event)
            self._changed.set()
            self._changed = trio.Event()

    async def send(self, op: str, **fields: Any) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(json.dumps({"op": op, **fields}).encode() + b"\n")

    async def wait_for(self, predicate: Callable[[Message], bool], *, within: float = 15, after: int = 0) -> Message:
        """The first event at index >= `after` that satisfies `predicate` (waiting for it)."""
        with trio.fail_after(within):
            index = after
            while True:
                while index < len(self.events):
                    event = self.events[index]
                    index += 1
                    if predicate(event):
                        return event
                await self._changed.wait()

    async def wait_count(self, predicate: Callable[[Message], bool], n: int, *, within: float = 15) -> list[Message]:
        with trio.fail_after(within):
            while True:
                found = [e for e in self.events if predicate(e)]
                if len(found) >= n:
                    return found
                await self._changed.wait()

    def of(self, kind: str) -> list[Message]:
        return [e for e in self.events if e["ev"] == kind]

    def received(self, channel: str | None = None) -> list[Any]:
        """The data of the messages the application saw, in order."""
        return [e["data"] for e in self.events if e["ev"] == "message" and channel in (None, e["channel"])]

    def wire(self, direction: str, channel: str) -> list[Message]:
        """Messages on `channel` the client sent ("out") or got ("in"), in order."""
        return [e["message"] for e in self.events if e["ev"] == direction and e["message"].get("channel") == channel]

    async def subscribed(self, channel: str) -> None:
        """Wait until the server has answered the client's subscribe to `channel` (successfully)."""
        event = await self.wait_for(lambda e: e["ev"] == "subscribed" and e["message"].get("subscription") == channel)
        assert event["message"]["successful"], event

    async def handshaken(self, *, after: int = 0) -> Message:
        event = await self.wait_for(lambda e: e["ev"] == "handshake" and e["message"]["successful"], after=after)
        message: Message = event["message"]
        return message


def is_message(event: Message) -> bool:
    return bool(event["ev"] == "message")
