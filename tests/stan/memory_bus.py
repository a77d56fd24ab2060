"""A NATS bus in memory, for testing the STAN door without sockets: the test hands messages in as a
client connection would (`send`, one input span each, as the broker's reader does), and reads what
the door sent, and to which connection (`sent`)."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Awaitable, Callable, Iterator

import attrs
import trio
import trio.testing

from streaming.nats.bus import BusStatistics, Handler, Origin, RunHandler, SpanListener
from streaming.security.auth import Authenticator
from streaming.wire.subjects import Sublist


@attrs.frozen
class Sent:
    subject: str
    payload: bytes
    reply: str
    to: int  # the connection it was for (0: whoever listens)


@attrs.define(eq=False)
class _Handler:
    handler: Handler
    runs: RunHandler | None


class MemoryBus:
    server_id = "MEMORY"
    url = "memory://"

    def __init__(self) -> None:
        self.auth = Authenticator()
        self.slow_consumers = 0
        self.protocol_errors: collections.Counter[str] = collections.Counter()
        self.sent: list[Sent] = []
        self.connections: set[int] = set()
        self.interest: set[str] = set()  # subjects some client listens on (heartbeat inboxes, ...)
        self.reserved: dict[str, int] = {}
        self.protected: list[str] = []
        self._subs: Sublist[_Handler] = Sublist()
        self._listeners: list[SpanListener] = []
        self._close_hooks: list[Callable[[list[str]], None]] = []
        self._disconnect_hooks: list[Callable[[int], None]] = []
        self._interest_added = trio.Event()

    # -- what the test does ------------------------------------------------------------------------

    async def send(self, subject: str, payload: bytes, reply: str = "", *, origin: Origin) -> None:
        """A client connection's message, as one input span (as the broker's reader hands it over)."""
        waits: list[Awaitable[None]] = []
        for listener in self._listeners:
            listener.span_started()
        try:
            for sub in self._subs.match(subject):
                result = (
                    sub.runs(subject, reply, [payload], origin)
                    if sub.runs is not None
                    else sub.handler(subject, reply, payload, origin)
                )
                if result is not None:
                    waits.append(result)
        finally:
            for listener in self._listeners:
                listener.span_ended(more_input=False)
        for wait in waits:
            await wait
        await trio.testing.wait_all_tasks_blocked()

    def take(self, to: int | None = None, subject: str | None = None) -> list[Sent]:
        """What was sent (to connection `to`, on `subject`) since the last take, in order."""
        taken = [s for s in self.sent if (to is None or s.to == to) and (subject is None or s.subject == subject)]
        self.sent = [s for s in self.sent if s not in taken]
        return taken

    def listen(self, subject: str) -> None:
        self.interest.add(subject)
        self._interest_added.set()
        self._interest_added = trio.Event()

    # -- the bus -----------------------------------------------------------------------------------

    def subscribe(self, subject: str, handler: Handler, queue: str = "", *, runs: RunHandler | None = None) -> object:
        entry = _Handler(handler, runs)
        self._subs.add(entry, subject, queue)
        return entry

    def unsubscribe(self, token: object) -> None:
        assert isinstance(token, _Handler)
        self._subs.remove(token)

    def publish(self, subject: str, payload: bytes, reply: str = "", *, to: int = 0) -> list[Awaitable[None]]:
        self.sent.append(Sent(subject, payload, reply, to or self.reserved.get(subject, 0)))
        return []

    def publish_many(self, subject: str, payloads: list[bytes]) -> None:
        for payload in payloads:
            self.publish(subject, payload)

    @contextlib.contextmanager
    def holding_writes(self) -> Iterator[None]:
        yield

    def add_span_listener(self, listener: SpanListener) -> None:
        self._listeners.append(listener)

    def add_close_hook(self, hook: Callable[[list[str]], None]) -> None:
        self._close_hooks.append(hook)

    def add_disconnect_hook(self, hook: Callable[[int], None]) -> None:
        self._disconnect_hooks.append(hook)

    def protect(self, prefix: str) -> None:
        self.protected.append(prefix)

    def reserve(self, subject: str, owner: int) -> None:
        self.reserved[subject] = owner

    def release(self, subject: str) -> None:
        self.reserved.pop(subject, None)

    def client_connected(self, cid: int) -> bool:
        return cid in self.connections

    def has_interest(self, subject: str) -> bool:
        return subject in self.interest

    async def wait_interest(self, subjects: list[str]) -> None:
        while not all(s in self.interest for s in subjects):
            await self._interest_added.wait()

    def statistics(self) -> BusStatistics:
        return BusStatistics(len(self.connections), len(self.connections), len(self._subs), 0, len(self.sent), 0, 0, 0)
