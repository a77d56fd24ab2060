"""The monitoring HTTP port: a Starlette app (`/metrics` and NATS Streaming's JSON pages) served inside
the server's Trio process by hypercorn's Trio worker.

Pages and field names follow nats-streaming-server's monitoring endpoints: `/streaming/serverz`,
`/streaming/storez`, `/streaming/clientsz` (`?subs=1`, `?client=`), `/streaming/channelsz` (`?subs=1`,
`?channel=`), with `offset`/`limit` paging on the lists.
"""

from __future__ import annotations

import datetime
import logging
import os
import platform
import resource
import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from storage import ChannelInfo
from streaming.core.engine import SubscriptionView
from streaming.nats.broker import Broker
from streaming.observability.metrics import Metrics, version
from streaming.running import Running

log = logging.getLogger(__name__)
DEFAULT_LIMIT = 1024
MAX_LIMIT = 10_000


class BadRequest(Exception):
    pass


def _rfc3339(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat().replace("+00:00", "Z")


def _uptime(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    out = f"{days}d" if days else ""
    out += f"{hours}h" if hours or days else ""
    out += f"{minutes}m" if minutes or hours or days else ""
    return out + f"{secs}s"


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected an integer, got {raw!r}") from None
    return max(lo, min(hi, value))


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "0") not in ("0", "", "false")


_INBOXES = ("inbox", "ack_inbox", "hb_inbox")


def _private(out: dict[str, Any], hide: bool) -> dict[str, Any]:
    """Without the inboxes when the NATS port asks for credentials: the page is not authenticated,
    and an inbox is what a connection would need to try to act for a client (docs/security.md)."""
    if hide:
        for key in _INBOXES:
            out.pop(key, None)
    return out


def subz(view: SubscriptionView, hide_inboxes: bool = False) -> dict[str, Any]:
    r = view.record
    out = {
        "client_id": r.client_id,
        "inbox": r.inbox,
        "ack_inbox": r.ack_inbox,
        "durable_name": r.durable_name,
        "queue_name": f"{r.durable_name}:{r.queue_group}" if r.durable_name and r.queue_group else r.queue_group,
        "is_durable": r.is_durable,
        "is_offline": not view.online,
        "max_inflight": r.max_inflight,
        "ack_wait": r.ack_wait_ms // 1000,
        "last_sent": r.last_sent,
        "pending_count": view.pending_count,
        "is_stalled": view.stalled and view.online,
    }
    return _private(out, hide_inboxes)


class Monitor:
    """The pages of one running server."""

    def __init__(self, running: Running, metrics: Metrics, store_type: str) -> None:
        self.running = running
        self.metrics = metrics
        self.store_type = store_type
        self.started = time.time()
        self.app = Starlette(
            routes=[
                Route("/", self.index),
                Route("/metrics", self.prometheus),
                Route("/streaming", self.index),
                Route("/streaming/serverz", self.serverz),
                Route("/streaming/storez", self.storez),
                Route("/streaming/clientsz", self.clientsz),
                Route("/streaming/channelsz", self.channelsz),
            ],
            exception_handlers={BadRequest: self._bad_request},
        )

    async def _bad_request(self, request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=400)

    def _head(self) -> dict[str, Any]:
        return {
            "cluster_id": self.running.stan.config.cluster_id,
            "server_id": self.running.bus.server_id,
            "now": _rfc3339(time.time()),
        }

    def _hide_inboxes(self) -> bool:
        """Inboxes are secrets where clients are authenticated; on an external cluster this server
        cannot tell whether they are, so they are hidden there."""
        bus = self.running.bus
        return bus.auth.required or not isinstance(bus, Broker)

    def _views(self) -> list[SubscriptionView]:
        return self.running.api.views()

    async def index(self, request: Request) -> Response:
        return JSONResponse(
            {"endpoints": ["/metrics", *(f"/streaming/{p}" for p in ("serverz", "storez", "clientsz", "channelsz"))]}
        )

    async def prometheus(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def serverz(self, request: Request) -> Response:
        running = self.running
        channels = running.store.channels()
        broker = running.bus.statistics()
        try:
            open_fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            open_fds = -1
        now = time.time()
        return JSONResponse(
            {
                **self._head(),
                "version": version(),
                "python": platform.python_version(),
                "state": "STANDALONE" if running.ft is None else running.ft.state,
                **(running.ft.as_json() if running.ft is not None else {}),
                "start_time": _rfc3339(self.started),
                "uptime": _uptime(now - self.started),
                "clients": len(running.stan.clients.records()),
                "subscriptions": sum(1 for v in self._views() if not v.record.parent_id),
                "channels": len(channels),
                "total_msgs": sum(c.msgs for c in channels),
                "total_bytes": sum(c.bytes for c in channels),
                "in_msgs": broker.in_msgs,
                "in_bytes": broker.in_bytes,
                "out_msgs": broker.out_msgs,
                "out_bytes": broker.out_bytes,
                "server_name": running.server_name,
                "nats_url": running.bus.url,  # the embedded broker's, or the cluster node attached to
                "partitioned": running.partition is not None,
                "channels_owned": list(running.partition.patterns) if running.partition is not None else None,
                "open_fds": open_fds,
                "max_fds": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            }
        )

    async def storez(self, request: Request) -> Response:
        store = self.running.store
        limits = store.limits
        channels = store.channels()
        stats = store.statistics()
        error = self.running.api.store_write_error()
        return JSONResponse(
            {
                **self._head(),
                "type": self.store_type.upper(),
                "file_sync": store.synced,  # false: commits reach the disk every sync_interval, not each one
                "limits": {
                    "max_channels": limits.max_channels,
                    "max_msgs": limits.channel.max_msgs,
                    "max_bytes": limits.channel.max_bytes,
                    "max_age": int(limits.channel.max_age_s * 1_000_000_000),
                    "max_subscriptions": limits.max_subs,
                    "max_inactivity": int(limits.channel.max_inactivity_s * 1_000_000_000),
                },
                "total_msgs": sum(c.msgs for c in channels),
                "total_bytes": sum(c.bytes for c in channels),
                "messages_used_bytes": stats.messages_used_bytes,
                "messages_map_size_bytes": stats.messages_map_size_bytes,
                "state_used_bytes": stats.state_used_bytes,
                "state_map_size_bytes": stats.state_map_size_bytes,
                # A full disk: publishes, new channels and new durables are refused, the rest is served
                # from memory and written when the store takes writes again.
                "writable": error is None,
                "write_error": None if error is None else str(error),
                "damaged_messages": stats.damaged_messages,  # found failing their checksum when read
                # Subscription-state writes (acks, positions, client records) queued and not yet stored:
                # they gather for ~30 ms; a crash meanwhile can only cause redeliveries.
                "state_writes_pending": self.running.core.runtime.statistics().unwritten,
            }
        )

    async def clientsz(self, request: Request) -> Response:
        subs = _flag(request, "subs")
        views = self._views() if subs else []
        clients = sorted(self.running.stan.clients.records(), key=lambda c: c.client_id)
        hide = self._hide_inboxes()

        def client_json(client_id: str, hb_inbox: str) -> dict[str, Any]:
            out: dict[str, Any] = _private({"id": client_id, "hb_inbox": hb_inbox}, hide)
            if subs:
                by_channel: dict[str, list[dict[str, Any]]] = {}
                for v in views:
                    if v.record.client_id == client_id and v.online:
                        by_channel.setdefault(v.record.channel, []).append(subz(v, hide))
                out["subscriptions"] = by_channel
            return out

        wanted = request.query_params.get("client")
        if wanted is not None:
            for c in clients:
                if c.client_id == wanted:
                    return JSONResponse(client_json(c.client_id, c.hb_inbox))
            return JSONResponse({"error": f"client {wanted!r} not found"}, status_code=404)
        offset = _int_param(request, "offset", 0, 0, 1 << 62)
        limit = _int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        page = clients[offset : offset + limit]
        return JSONResponse(
            {
                **self._head(),
                "offset": offset,
                "limit": limit,
                "count": len(page),
                "total": len(clients),
                "clients": [client_json(c.client_id, c.hb_inbox) for c in page],
            }
        )

    async def channelsz(self, request: Request) -> Response:
        subs = _flag(request, "subs")
        channels = sorted(self.running.store.channels(), key=lambda c: c.name)
        views = self._views() if subs else []

        def channel_json(info: ChannelInfo) -> dict[str, Any]:
            out: dict[str, Any] = {
                "name": info.name,
                "msgs": info.msgs,
                "bytes": info.bytes,
                "first_seq": info.first_seq if info.msgs else 0,
                "last_seq": info.last_seq,
            }
            if subs:
                hide = self._hide_inboxes()
                out["subscriptions"] = [subz(v, hide) for v in views if v.record.channel == info.name]
            return out

        wanted = request.query_params.get("channel")
        if wanted is not None:
            info = self.running.store.channel_info(wanted) if wanted else None
            if info is None:
                return JSONResponse({"error": f"channel {wanted!r} not found"}, status_code=404)
            return JSONResponse(channel_json(info))
        offset = _int_param(request, "offset", 0, 0, 1 << 62)
        limit = _int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        page = channels[offset : offset + limit]
        body: dict[str, Any] = {
            **self._head(),
            "offset": offset,
            "limit": limit,
            "count": len(page),
            "total": len(channels),
        }
        if subs:
            body["channels"] = [channel_json(c) for c in page]
        else:
            body["names"] = [c.name for c in page]
        return JSONResponse(body)
