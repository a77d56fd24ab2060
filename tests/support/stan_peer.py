"""The server we replace, nats-streaming-server (v0.25.6), as a peer in tests: from `STAN_SERVER`, else
`../shared/peers/` beside the repository; tests that need it skip when it is absent (it is not part of
the repository)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.servers import free_port


def stan_binary() -> Path | None:
    found = os.environ.get("STAN_SERVER") or str(
        Path(__file__).resolve().parents[3] / "shared/peers/nats-streaming-server"
    )
    return Path(found) if Path(found).is_file() and os.access(found, os.X_OK) else None


needs_stan = pytest.mark.skipif(stan_binary() is None, reason="nats-streaming-server not found (STAN_SERVER)")


class StanPeer:
    """One nats-streaming-server process on a file store."""

    def __init__(self, store: Path, *flags: str, port: int = 0) -> None:
        self.store, self.flags = store, flags
        self.port, self.http_port = port or free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> StanPeer:
        binary = stan_binary()
        assert binary is not None
        self.proc = subprocess.Popen(
            [
                str(binary),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-m",
                str(self.http_port),
                "-st",
                "FILE",
                "--dir",
                str(self.store),
                "-cid",
                "test-cluster",
                *self.flags,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop(signal.SIGKILL)  # never left behind
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + 20
        while True:  # its monitoring answers once the streaming server is up (each page in turn)
            try:
                if self.page("serverz").get("state") and "total" in self.page("channelsz"):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("nats-streaming-server did not start")
            time.sleep(0.05)

    def page(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = httpx.get(f"http://127.0.0.1:{self.http_port}/streaming/{name}", timeout=5).json()
        return found

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(15)


@contextmanager
def stan_peer(store: Path, *flags: str, port: int = 0) -> Iterator[StanPeer]:
    peer = StanPeer(store, *flags, port=port).start()
    try:
        yield peer
    finally:
        peer.stop(signal.SIGKILL)
