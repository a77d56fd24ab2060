"""Running what `streaming-server` was configured to run, under Trio, until SIGINT or SIGTERM: one
server, a member of an FT group, or `--workers N`. The command line is streaming.cli.server's; this
module (and Trio, the engine, the doors) is loaded only once the configuration is known to be good.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from storage import DamagedStoreError, DamageFoundError, StoreError
from streaming import collector
from streaming.cli.maintenance import way_forward
from streaming.config import ConfigError, ServerConfig
from streaming.ft.status import GroupError
from streaming.nats.link import LinkError
from streaming.security.tls import TlsError
from streaming.stan.partitions import PartitionConflict
from streaming.workers import WorkerPlan, WorkersError, forwarded_arguments, supervise

if TYPE_CHECKING:
    from storage.state_walk import WalkAhead
    from streaming.running import Running

log = logging.getLogger("streaming")


def run_server(config: ServerConfig, state_walk: WalkAhead | None = None) -> int:
    """One server, or a member of an FT group; 1 when it could not start (or stopped on damage).
    `state_walk`: the store's state file walk, begun while this module loaded."""
    failed = False
    try:
        if config.ft_group:
            trio.run(_run_member, config)
        else:
            trio.run(_run_server, config, state_walk)
    except* (StoreError, OSError, ConfigError, LinkError, PartitionConflict, TlsError, GroupError) as group:
        for error in _leaves(group):
            if isinstance(error, DamageFoundError):
                log.error("stopping: the full check found damage: %s; %s", error, way_forward(config.dir))
            elif isinstance(error, DamagedStoreError):
                log.error("cannot start: %s; %s", error, way_forward(config.dir))
            else:
                log.error("cannot start: %s", error)
        failed = True
    return 1 if failed else 0


def run_workers(config: ServerConfig, count: int, argv: list[str]) -> int:
    """`--workers N`: N servers behind a local nats-server, until SIGINT or SIGTERM."""
    plan = WorkerPlan(
        count,
        config.host,
        config.port,
        Path(config.dir),
        config.cluster_id,
        http_port=config.http_port,
        forwarded=forwarded_arguments(argv),
    )
    failed = False
    try:
        trio.run(_run_workers, plan)
    except* (WorkersError, OSError) as group:
        for error in _leaves(group):
            log.error("cannot run the workers: %s", error)
        failed = True
    return 1 if failed else 0


async def _run_workers(plan: WorkerPlan) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervise, plan)
            # Tests and scripts wait for this exact line, as for one server.
            log.info("Listening for client connections on %s:%d", plan.host, plan.port)
            await _stop_on_signal(signals, nursery, "stopping the workers, then the nats-server")
    log.info("workers stopped")


async def _stop_on_signal(signals: AsyncIterator[int], nursery: trio.Nursery, doing: str) -> None:
    """At SIGINT or SIGTERM, say so and stop what `nursery` runs."""
    async for signum in signals:
        log.info("received %s: %s", signal.Signals(signum).name, doing)
        nursery.cancel_scope.cancel()
        break


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


async def _run_server(config: ServerConfig, state_walk: WalkAhead | None) -> None:
    from streaming.server import serve

    collector.settle()  # the modules are loaded; the recovered state is not there yet

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            # Recovered, before any client: what exists then is frozen out of the collector's scans.
            serving = partial(serve, config, after_recovery=collector.recovered, state_walk=state_walk)
            running = await nursery.start(serving)
            where = f"in {config.dir}" if config.store == "lmdb" else "in memory (nothing survives a restart)"
            log.info("store: %s %s", config.store, where)
            if not running.store.synced:
                log.warning(
                    "file_sync is off: commits reach the disk every %gs; "
                    "a machine crash can lose that much and damage the store",
                    config.sync_interval,
                )
            if config.nats_server:
                owned = ", ".join(running.partition.patterns) if running.partition is not None else "all"
                # Tests and scripts wait for this line.
                log.info("Serving STAN clients through the NATS cluster at %s (channels: %s)", running.bus.url, owned)
            else:
                # Tests and scripts wait for this exact line (nats-server prints the same).
                log.info("Listening for client connections on %s:%d", config.host, running.port)
            await _stop_on_signal(signals, nursery, "shutting down")
    log.info("server stopped")


async def _run_member(config: ServerConfig) -> None:
    from streaming.ft.group import serve_member

    collector.settle()

    def on_active(running: Running) -> None:
        # Tests and scripts wait for this line, as for a single server attached to a cluster.
        log.info("Serving STAN clients through the NATS cluster at %s (ft group %s)", running.bus.url, config.ft_group)

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve_member, config, after_recovery=collector.recovered, on_active=on_active))
            log.info("store: lmdb in %s, a copy of ft group %s's log", config.dir, config.ft_group)
            await _stop_on_signal(signals, nursery, "shutting down")
    log.info("server stopped")
