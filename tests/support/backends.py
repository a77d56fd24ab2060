"""Running client tests under asyncio and Trio alike: the real server (Trio) in a thread of its own,
and a decorator that runs an async test once per backend.

The server runs in its own thread with its own Trio loop, so the test's client can run under either
backend in the main thread and talk to it over real TCP. `ServerThread.call` runs an async function
in the server's loop (to drop its connections, or to look at its engine).
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

import anyio
import pytest
import trio

from streaming.config import ServerConfig
from streaming.running import Running
from streaming.server import serve

BACKENDS = ("trio", "asyncio")
P = ParamSpec("P")
T = TypeVar("T")


class ServerThread:
    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.running: Running | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    @property
    def port(self) -> int:
        assert self.running is not None
        return self.running.port

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        assert self.running is not None, "the server did not start"
        return self

    def stop(self) -> None:
        """Stop the server and wait for its thread (again: nothing more)."""
        if self._thread.is_alive() and self._token is not None and self._stop is not None:
            self._token.run_sync_soon(self._stop.set)
        self._thread.join(30)

    def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run `fn()` in the server's loop and return its result (blocks this thread meanwhile)."""
        assert self._token is not None
        # From a helper thread: Trio refuses to be called into from a thread that runs Trio itself.
        with concurrent.futures.ThreadPoolExecutor(1) as helper:
            token = self._token
            return helper.submit(lambda: trio.from_thread.run(fn, trio_token=token)).result()

    def _main(self) -> None:
        async def main() -> None:
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self.running = await nursery.start(serve, self.cfg)
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

        try:
            trio.run(main)
        except BaseException as exc:  # the test sees it from start()
            self._error = exc
        finally:
            self._ready.set()


@contextmanager
def server_thread(cfg: ServerConfig) -> Iterator[ServerThread]:
    server = ServerThread(cfg).start()
    try:
        yield server
    finally:
        server.stop()


def on_both_backends(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Turn an async test into a plain one that runs it under Trio and under asyncio (`anyio.run`), a
    test per backend. Plain, so pytest-trio's trio mode leaves it alone; fixtures work as before."""
    signature = inspect.signature(test)

    @functools.wraps(test)
    def run(backend: str, **fixtures: Any) -> None:
        anyio.run(functools.partial(test, **fixtures), backend=backend)

    backend = inspect.Parameter("backend", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    run.__signature__ = signature.replace(parameters=[backend, *signature.parameters.values()])  # type: ignore[attr-defined]
    marked: Callable[..., None] = pytest.mark.parametrize("backend", BACKENDS)(run)
    return marked


async def eventually(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Wait (real time, over real sockets) until predicate() holds; fails after `within` seconds."""
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - another thread's or socket's state: nothing to wait on
            await anyio.sleep(0.01)
