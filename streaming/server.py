"""The whole server in one call: `serve(config)` opens the store, recovers the delivery core, opens the
front doors (STAN over the embedded NATS broker, or over a link to an external NATS cluster with
`nats_server`, there owning only its partition's channels with `partitioning`; Bayeux and the HTTP
pull API when `http_api_port` is set) and the monitoring port, and runs until cancelled (then flushes
and closes the store).

Tests run it in a nursery on port 0: `port = await nursery.start(serve, config)`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from storage import DamageFoundError, Store, StoreError, open_store
from streaming.config import ConfigError, ServerConfig
from streaming.core.door_api import DoorApi
from streaming.core.observers import Fanout
from streaming.core.service import Core
from streaming.core.store_calls import call_store
from streaming.nats.broker import Broker, BrokerConfig
from streaming.nats.bus import Bus
from streaming.nats.link import LinkOptions, NatsLink
from streaming.observability.event_log import EventLog
from streaming.running import Running
from streaming.security.auth import NkeySeed, read_creds
from streaming.security.tls import TlsFiles, client_context, server_context
from streaming.stan.config import StanConfig
from streaming.stan.door import StanDoor
from streaming.stan.partitions import Claims, Partition, parse_hash_partition
from streaming.wire.urls import parse_urls

if TYPE_CHECKING:
    from storage.state_walk import WalkAhead

    # The HTTP doors are loaded only by a server that serves them (start-up time).
    from streaming.bayeux.door import BayeuxDoor
    from streaming.bayeux.protocol import BayeuxSettings
    from streaming.observability.metrics import Metrics
    from streaming.observability.monitor import Monitor
    from streaming.pull.door import PullDoor
    from streaming.pull.protocol import PullSettings

log = logging.getLogger(__name__)


def _metrics() -> Metrics:
    # The HTTP stacks (hypercorn, Starlette, prometheus_client) load only when a port that uses them is
    # configured: a server without one starts a fifth of a second sooner.
    from streaming.observability.metrics import Metrics

    return Metrics()


def broker_config(config: ServerConfig) -> BrokerConfig:
    return BrokerConfig(
        host=config.host,
        port=config.port,
        max_payload=config.max_payload,
        max_pending_bytes=config.max_pending,
        write_deadline_s=config.write_deadline,
        ping_interval_s=config.ping_interval,
        max_pings_out=config.max_pings_out,
        connect_timeout_s=config.connect_timeout,
        server_name=config.server_name,
    )


def link_options(config: ServerConfig) -> LinkOptions:
    """How to reach and log in to the external NATS cluster (ConfigError for unusable files)."""
    seed, jwt = None, ""
    for key, path in (("nats_nkey_seed", config.nats_nkey_seed), ("nats_creds", config.nats_creds)):
        if not path:
            continue
        try:
            text = Path(path).read_text()
            if key == "nats_creds":
                jwt, seed = read_creds(text)
            else:
                seed = NkeySeed(text)
        except OSError as exc:
            raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from None
        except ValueError as exc:
            raise ConfigError(f"{key}: {path}: {exc}") from None
    tls = None
    if config.tls_client_cert or config.tls_client_cacert:
        tls = client_context(config.tls_client_cert, config.tls_client_key, config.tls_client_cacert)
    return LinkOptions(
        parse_urls(config.nats_server),
        name=config.server_name,
        user=config.nats_user,
        password=config.nats_password,
        token=config.nats_token,
        nkey_seed=seed,
        jwt=jwt,
        tls=tls,
    )


def bayeux_settings(config: ServerConfig) -> BayeuxSettings:
    from streaming.bayeux.protocol import BayeuxSettings

    return BayeuxSettings(
        timeout_s=config.bayeux_timeout,
        interval_s=config.bayeux_interval,
        max_interval_s=config.bayeux_max_interval,
        max_unacked=config.bayeux_max_unacked,
    )


def pull_settings(config: ServerConfig) -> PullSettings:
    from streaming.pull.protocol import PullSettings

    return PullSettings(
        max_pull_wait_s=config.pull_max_wait,
        tombstone_ttl_s=config.pull_tombstone_ttl,
        ack_replay_window_s=config.pull_ack_replay_window,
        ack_replay_405=config.pull_ack_replay == "405",
        msg_headers=config.pull_msg_headers,
    )


def stan_config(config: ServerConfig) -> StanConfig:
    return StanConfig(
        cluster_id=config.cluster_id,
        discover_prefix=config.discover_prefix,
        hb_interval_s=config.hb_interval,
        hb_timeout_s=config.hb_timeout,
        hb_fail_count=config.hb_fail_count,
        dup_check_timeout_s=config.dup_check_timeout,
        wildcard_subscriptions=config.wildcard_subscriptions,
        allow_ms_ack_wait=config.allow_ms_ack_wait,
    )


async def serve(
    config: ServerConfig,
    *,
    after_recovery: Callable[[], None] | None = None,
    store: Store | None = None,
    state_walk: WalkAhead | None = None,
    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the server until cancelled. Store errors at startup (lock, cluster ID, schema) propagate.
    `after_recovery` runs once the store is recovered, before any client is served (the entry point's
    process-wide settings: `streaming.collector.recovered`). `store`: serve this one (an FT group's
    replicated store) rather than open the one `config` names; it is closed all the same. `state_walk`:
    the walk of the store's state file, begun earlier (`storage.walk_ahead`)."""
    replicated = store is not None
    if store is None:
        directory = config.dir if config.store == "lmdb" else None
        store = await trio.to_thread.run_sync(
            partial(
                open_store,
                config.store,
                directory,
                config.cluster_id,
                config.store_limits(),
                sync=config.file_sync,
                verify=config.verify_on_start,
                state_walk=state_walk,
            )
        )
    try:
        tls_files = config.tls_files()
        bus: Bus
        if config.nats_server:
            bus = link = NatsLink(link_options(config))
        else:
            tls = server_context(tls_files) if tls_files is not None else None
            verify = tls_files is not None and tls_files.verify
            bus = broker = Broker(broker_config(config), config.authenticator(), tls, verify)
        partition: Partition | None = None
        if config.hash_partition:
            partition = parse_hash_partition(config.hash_partition)
        elif config.partitioning:
            partition = Partition(list(config.channels))
        metrics = _metrics() if config.http_port else None
        event_log = EventLog(Path(config.event_log), rotate_bytes=config.event_log_rotate) if config.event_log else None
        observers: list[Metrics | EventLog] = [o for o in (metrics, event_log) if o is not None]
        core = Core(
            store,
            store_in_thread=config.store == "lmdb",
            engine_observers=observers,
            observer=Fanout(list(observers)) if observers else None,
            recovery_hold_s=config.recovery_hold,
            remote_store=replicated,
        )
        api = DoorApi(core)
        stan = StanDoor(stan_config(config), bus, api, partition)
        bayeux: BayeuxDoor | None = None
        pull: PullDoor | None = None
        if config.http_api_port:
            from streaming.bayeux.door import BayeuxDoor
            from streaming.pull.door import PullDoor

            bayeux, pull = BayeuxDoor(api, bayeux_settings(config)), PullDoor(api, pull_settings(config))
        async with trio.open_nursery() as nursery:
            if event_log is not None:
                await nursery.start(event_log.run)
            if not store.synced:
                nursery.start_soon(partial(sync_periodically, store, config.sync_interval, in_thread=True))
            await nursery.start(core.run)
            if after_recovery is not None:
                after_recovery()
            if store.unchecked:
                nursery.start_soon(check_store, store)
            if config.nats_server:
                port = await nursery.start(link.serve)
                if partition is not None:
                    # Before taking a channel's publishes: no other server of the cluster ID owns it.
                    claims = Claims(link, config.cluster_id, config.server_name, partition, config.ft_group)
                    claims.start()
                    await link.flush()
                    await claims.check()
                    link.add_topology_listener(claims.topology_changed)
                    nursery.start_soon(claims.watch)
                await nursery.start(stan.run)
                await link.flush()  # its subscriptions are in place before it says it is ready
            else:
                await nursery.start(stan.run)
                port = await nursery.start(broker.serve)
            running = Running(port, bus, core, api, stan, store, event_log=event_log, bayeux=bayeux, pull=pull)
            running.server_name = config.server_name
            running.partition = partition
            if bayeux is not None and pull is not None:
                await nursery.start(bayeux.run)
                await nursery.start(pull.run)
                running.http_api_port = await nursery.start(serve_http_api, config, bayeux, pull)
            if metrics is not None:
                metrics.attach(running)
                from streaming.observability.monitor import Monitor

                monitor = Monitor(running, metrics, config.store)
                http_port = max(config.http_port, 0)  # -1: any free port
                host = config.http_host or config.host
                running.http_port = await nursery.start(serve_monitor, monitor, host, http_port, tls_files)
            task_status.started(running)
    finally:
        with trio.move_on_after(10, shield=True):
            await trio.to_thread.run_sync(store.close)
        log.info("store closed")


async def check_store(store: Store) -> None:
    """The full check `verify_on_start = "background"` owes, while the server serves; damage it finds
    (or a read meets first) stops the server, as the same damage would have stopped its start."""
    damage = await trio.to_thread.run_sync(store.check_fully, abandon_on_cancel=True)
    if damage is not None:
        raise DamageFoundError(damage)


async def serve_http_api(
    config: ServerConfig,
    bayeux: BayeuxDoor,
    pull: PullDoor,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The client-facing HTTP listener: the Bayeux endpoint and the pull API in one Starlette app."""
    from starlette.applications import Starlette

    from streaming.bayeux.http import BayeuxApp
    from streaming.http_listener import serve_asgi, set_websocket_compression
    from streaming.pull.http import PullApp
    from streaming.security import http_auth

    auth = config.authenticator()  # the NATS port's users and permissions, when it has any
    set_websocket_compression(config.http_api_ws_compression)
    origins = config.allowed_origins()
    bayeux_app = BayeuxApp(
        bayeux, path=config.bayeux_path, max_body_bytes=config.http_api_max_body, auth=auth, origins=origins
    )
    app = Starlette(
        routes=[*bayeux_app.routes, *PullApp(pull, max_payload=config.max_payload, auth=auth).routes],
        # CORS outermost: a preflight carries no credentials, and a refusal must be readable by the page.
        middleware=[*origins.middleware(), *http_auth.middleware(auth)],
    )
    host, port = config.http_api_host or config.host, max(config.http_api_port, 0)
    # Connections stay open longer than a held connect or pull, so a client's next request reuses its own.
    serve = partial(
        serve_asgi,
        app,
        host,
        port,
        log_name="streaming.http_api.server",
        keep_alive_s=75.0,
        tls=config.tls_files(),
        max_frame_bytes=config.http_api_max_body,
    )
    async with trio.open_nursery() as nursery:
        bound: int = await nursery.start(serve)
        log.info(
            "Listening for HTTP clients (Bayeux at %s, pull API at /channels) on %s:%d", bayeux_app.path, host, bound
        )
        task_status.started(bound)


async def serve_monitor(
    monitor: Monitor,
    host: str,
    port: int,
    tls: TlsFiles | None = None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The monitoring listener, until cancelled (HTTPS with `tls`); `task_status` gets the bound port."""
    from streaming.http_listener import serve_asgi

    serve = partial(serve_asgi, monitor.app, host, port, log_name="streaming.observability.monitor.http", tls=tls)
    async with trio.open_nursery() as nursery:
        bound: int = await nursery.start(serve)
        log.info("Listening for HTTP monitoring on %s:%d", host, bound)
        task_status.started(bound)


async def sync_periodically(store: Store, interval: float, *, in_thread: bool) -> None:
    """Flush a store that does not sync its commits (`file_sync = false`) every `interval` seconds."""
    while True:
        await trio.sleep(interval)
        try:
            await call_store(store.sync, in_thread=in_thread)
        except StoreError as exc:
            # Commits still go on (and are still in the page cache); the next flush tries again.
            log.error("could not flush the store to disk: %s", exc)
