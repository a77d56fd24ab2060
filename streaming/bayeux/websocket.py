"""Bayeux over one WebSocket (CometD's `websocket` transport): every text frame holds a JSON array of
Bayeux messages, and so does every answer. The session, its batches and its queue are the door's,
exactly as over long-polling: a client that loses its socket and comes back within `maxInterval`
(over a new socket or by long-polling) keeps its session and gets its unacknowledged messages first.

One socket runs three kinds of work, all in the socket's nursery:
- the reader takes frames in order and `begin`s each (its messages acted on, its publishes handed to
  the group commit), so a client's messages reach the log in the order it sent them;
- the answerer `finish`es those answers in the same order (waits for their commits) and sends them,
  so the reader goes on while a commit is under way;
- a frame that is one `/meta/connect` runs in a task of its own, because the door holds it until
  there is something to deliver (a newer connect replaces it, as over HTTP).
With the ack extension messages go out only in connect replies (as CometD's own server does it with
the extension on): each reply closes a batch, so the client's next connect acknowledges it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Final

import trio
from starlette.websockets import WebSocket, WebSocketDisconnect

from streaming.bayeux import protocol as bx
from streaming.bayeux.door import Answer, BayeuxDoor
from streaming.security.permissions import Compiled

log = logging.getLogger(__name__)

CLOSE_POLICY: Final = 1008  # the Origin is not allowed
CLOSE_INVALID: Final = 1007  # a frame that is not Bayeux
CLOSE_TOO_BIG: Final = 1009
_PIPELINE: Final = 64  # answers begun and not yet sent: past this the reader waits (back-pressure)


class BayeuxSocket:
    """One accepted WebSocket: reads frames, answers them, until the client closes it."""

    def __init__(self, ws: WebSocket, door: BayeuxDoor, permissions: Compiled | None, max_frame_bytes: int) -> None:
        self.ws = ws
        self.door = door
        self.permissions = permissions
        self.max_frame_bytes = max_frame_bytes
        self._send_lock = trio.Lock()  # whole frames: the answerer and connect tasks share the socket
        self._unsent = 0  # answers handed to the answerer and not yet sent

    async def run(self) -> None:
        door = self.door
        door.websockets += 1
        try:
            async with trio.open_nursery() as nursery:
                answers_in, answers_out = trio.open_memory_channel[Answer](_PIPELINE)
                nursery.start_soon(self._answer, answers_out)
                async with answers_in:
                    await self._read(nursery, answers_in)
                # The client is gone or a frame was refused: a held connect ends (its session then
                # expires after maxInterval unless the client comes back), and so do answers not sent.
                nursery.cancel_scope.cancel()
        finally:
            door.websockets -= 1

    async def _read(self, nursery: trio.Nursery, answers: trio.MemorySendChannel[Answer]) -> None:
        while True:
            try:
                frame = await self.ws.receive()
            except WebSocketDisconnect:
                return
            if frame["type"] == "websocket.disconnect":
                return
            text: str | None = frame.get("text")
            body = text.encode() if text is not None else frame.get("bytes") or b""
            if len(body) > self.max_frame_bytes:
                await self._close(CLOSE_TOO_BIG, f"a frame is over {self.max_frame_bytes} bytes")
                return
            try:
                messages = bx.parse_body(body)
            except bx.BadBody as exc:
                await self._close(CLOSE_INVALID, str(exc))
                return
            if _is_connect(messages):
                # A connect still held is answered as superseded by the door when this one comes in.
                nursery.start_soon(self._hold_connect, messages)
                continue
            answer = await self.door.begin(messages, self.permissions, source=self)
            # A lone publisher's frame is committed here and now, and answered from here when no
            # earlier answer waits to go (two trips through the scheduler fewer on its way back).
            self.door.commit_now()
            parts = self.door.answered(answer) if not self._unsent else None
            if parts is not None:
                await self._send(parts)
            else:
                self._unsent += 1
                await answers.send(answer)

    async def _answer(self, answers: trio.MemoryReceiveChannel[Answer]) -> None:
        async with answers:
            async for answer in answers:
                await self._send(await self.door.finish(answer))
                self._unsent -= 1

    async def _hold_connect(self, messages: list[Any]) -> None:
        await self._send(await self.door.handle(messages, self.permissions))

    async def _send(self, parts: list[dict[str, Any] | bytes]) -> None:
        text = bx.encode_answer(parts).decode()  # text frames: the CometD client parses them as JSON text
        lock = self._send_lock
        # Taken at once when free (the usual case): `async with` would first yield to every other
        # runnable task, and the answer would wait for them on its way to the client.
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()
        try:
            await self.ws.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError):
            log.debug("bayeux websocket closed before an answer was sent")
        finally:
            lock.release()

    async def _close(self, code: int, reason: str) -> None:
        log.info("bayeux websocket from %s closed: %s", _peer(self.ws), reason)
        async with self._send_lock:
            with contextlib.suppress(RuntimeError, OSError):  # the client closed it meanwhile
                # A close reason has at most 123 bytes.
                await self.ws.close(code, reason.encode()[:123].decode(errors="ignore"))


def _is_connect(messages: list[Any]) -> bool:
    return len(messages) == 1 and isinstance(messages[0], dict) and messages[0].get("channel") == "/meta/connect"


def _peer(ws: WebSocket) -> str:
    return f"{ws.client.host}:{ws.client.port}" if ws.client else "?"
