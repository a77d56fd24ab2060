"""The whole server in one call: `serve(config)` opens the store, starts the STAN layer and the NATS
listener, and runs until cancelled (then flushes and closes the store).

Tests run it in a nursery on port 0: `port = await nursery.start(serve, config)`.
"""

from __future__ import annotations

import logging

import attrs
import trio

from storage import Store, open_store
from streaming.config import ServerConfig
from streaming.nats.broker import Broker, BrokerConfig
from streaming.stan.server import StanConfig, StanServer

log = logging.getLogger(__name__)


@attrs.define
class Running:
    """What `serve` hands to `task_status.started` in tests that want more than the port."""

    port: int
    broker: Broker
    stan: StanServer
    store: Store


def broker_config(config: ServerConfig) -> BrokerConfig:
    return BrokerConfig(
        host=config.host,
        port=config.port,
        max_payload=config.max_payload,
        max_pending_bytes=config.max_pending,
        write_deadline_s=config.write_deadline,
        ping_interval_s=config.ping_interval,
        max_pings_out=config.max_pings_out,
    )


def stan_config(config: ServerConfig) -> StanConfig:
    return StanConfig(
        cluster_id=config.cluster_id,
        discover_prefix=config.discover_prefix,
        hb_interval_s=config.hb_interval,
        hb_timeout_s=config.hb_timeout,
        hb_fail_count=config.hb_fail_count,
        dup_check_timeout_s=config.dup_check_timeout,
        recovery_hold_s=config.recovery_hold,
        ack_wait_ms=config.ack_wait_ms,
    )


async def serve(config: ServerConfig, *, task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the server until cancelled. Store errors at startup (lock, cluster ID, schema) propagate."""
    limits = config.store_limits()
    directory = config.dir if config.store == "lmdb" else None
    store = await trio.to_thread.run_sync(open_store, config.store, directory, config.cluster_id, limits)
    try:
        broker = Broker(broker_config(config))
        stan = StanServer(stan_config(config), broker, store, store_in_thread=config.store == "lmdb")
        async with trio.open_nursery() as nursery:
            await nursery.start(stan.run)
            port = await nursery.start(broker.serve)
            task_status.started(Running(port, broker, stan, store))
    finally:
        with trio.move_on_after(10, shield=True):
            await trio.to_thread.run_sync(store.close)
        log.info("store closed")
