"""Running the real server for tests: in this process under Trio, or as a separate process."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import attrs
import httpx
import trio

from streaming.config import ServerConfig
from streaming.running import Running
from streaming.server import serve
from streaming.wire import nats as p

T = TypeVar("T")

# Short heartbeats and millisecond AckWaits keep end-to-end tests fast.
FAST: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "allow_ms_ack_wait": True, "recovery_hold": 3.0}


def config(directory: Path | None = None, **overrides: Any) -> ServerConfig:
    values = dict(FAST, store="lmdb" if directory is not None else "memory", dir=str(directory or "unused"))
    values.update(overrides)
    return ServerConfig(**values)


def free_port() -> int:
    """A port that was free a moment ago (for tests that restart a server on the same port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_port_block(offsets: Iterable[int]) -> int:
    """A base port such that base + each offset was free a moment ago, chosen below the kernel's
    ephemeral range (where any outgoing connection may take a port at any time) when it can be."""
    offsets = sorted(set(offsets))
    low, _ = _ephemeral_range()
    candidates = list(range(10_000, max(10_001, low - offsets[-1]), 97))
    random.shuffle(candidates)
    for base in candidates:
        if all(_bindable(base + offset) for offset in offsets):
            return base
    raise RuntimeError(f"no block of free ports with offsets {offsets} below {low}")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@asynccontextmanager
async def running(cfg: ServerConfig) -> AsyncIterator[Running]:
    async with trio.open_nursery() as nursery:
        server: Running = await nursery.start(serve, cfg)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


class RawClient:
    """A bare NATS connection for protocol tests: send bytes, read parsed events."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.parser = p.ClientConnection()
        self.info: dict[str, Any] = {}

    @classmethod
    async def open(cls, port: int, connect: bytes = b"CONNECT {}\r\n") -> RawClient:
        client = cls(await trio.open_tcp_stream("127.0.0.1", port))
        info = await client.next()
        assert isinstance(info, p.Info)
        client.info = info.options
        if connect:
            await client.send(connect + b"PING\r\n")
            reply = await client.next()
            if reply == p.OK:  # verbose: +OK for the CONNECT comes first
                reply = await client.next()
            assert reply == p.PONG
        return client

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def next(self) -> p.Event:
        """The next event; raises EOFError when the server closed the connection."""
        while True:
            event = self.parser.next_event()
            if not isinstance(event, p._NeedData):
                return event
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError
            self.parser.receive_data(data)

    async def until_closed(self) -> list[p.Event]:
        seen: list[p.Event] = []
        try:
            while True:
                seen.append(await self.next())
        except (EOFError, trio.BrokenResourceError):
            return seen

    async def aclose(self) -> None:
        await self.stream.aclose()


LISTENING = r"\] streaming: Listening for client connections on [^:]+:(\d+)"  # ours, not a child nats-server's
ATTACHED = r"Serving STAN clients through the NATS cluster at "  # with nats_server: no port of its own
MONITORING = r"Listening for HTTP monitoring on [^:]+:(\d+)"


@attrs.define
class ServerProcess:
    """`python -m streaming` in a child process, as users run it."""

    args: list[str]
    proc: subprocess.Popen[str] | None = None
    port: int = 0
    http_port: int = 0  # its monitoring port, when it serves one (`--http_port=-1`: any free port)
    log: list[str] = attrs.Factory(list)
    preexec: Callable[[], None] | None = None  # run in the child before the server (resource limits)
    ready: str = LISTENING  # the log line that says it serves (a group: the port it listens on)

    def start(self, timeout: float = 20.0) -> ServerProcess:
        self.log = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streaming", "-a", "127.0.0.1", *self.args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=self.preexec,
        )
        found = threading.Event()
        serving = False

        def pump() -> None:
            nonlocal serving
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line.rstrip())
                monitoring = re.search(MONITORING, line)
                if monitoring:
                    self.http_port = int(monitoring.group(1))
                match = re.search(self.ready, line)
                if match:
                    self.port = int(match.group(1)) if match.groups() else 0
                    serving = True
                    found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(timeout) or not serving:
            self.stop()
            raise RuntimeError("server did not start:\n" + "\n".join(self.log))
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@contextmanager
def server_process(*args: str) -> Iterator[ServerProcess]:
    server = ServerProcess(["-p", "0", *args]).start()
    try:
        yield server
    finally:
        server.stop()


def command(entry: str, *args: str, stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A console entry point of streaming.cli ("server_main", "client_main") run as users run it."""
    return subprocess.run(
        [sys.executable, "-c", f"from streaming.cli import {entry}; raise SystemExit({entry}())", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )


def connect_when_up(
    connect: Callable[[], T], server: subprocess.Popen[Any], refused: type[Exception], timeout: float = 30.0
) -> T:
    """`connect()` once the server just started takes it: tried again while it raises `refused`, until
    the server exits or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return connect()
        except refused:
            if time.monotonic() > deadline or server.poll() is not None:
                raise
            time.sleep(0.1)


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


async def eventually(predicate: Any, within: float = 5.0) -> None:
    """Wait (real time, over real sockets) until predicate() holds; fails after `within` seconds.

    Polling is the honest way to watch state another process or socket changes; nothing here can
    signal an Event for it.
    """
    with trio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - see the docstring
            await trio.sleep(0.01)


async def state_stored(http_port: int, within: float = 10.0) -> None:
    """Wait until the server has stored every subscription-state write it had queued (acks, positions,
    client records): its storez says `state_writes_pending` is 0. Call it once the server has what is
    to be stored (after the client's `nats.flush()` on the embedded broker). Under Trio or asyncio."""
    with anyio.fail_after(within):
        async with httpx.AsyncClient() as http:
            # Another process's state, over HTTP: polling is the only way to watch it (see `eventually`).
            while (await http.get(f"http://127.0.0.1:{http_port}/streaming/storez")).json()["state_writes_pending"]:  # noqa: ASYNC110
                await anyio.sleep(0.005)


async def nats_py_round_trip(nc: Any, subject: str, payload: bytes) -> None:
    """With a connected nats-py client: subscribe, publish, get it back; then close the client."""
    try:
        sub = await nc.subscribe(subject)
        await nc.publish(subject, payload)
        assert (await sub.next_msg(timeout=2)).data == payload
    finally:
        await nc.close()
