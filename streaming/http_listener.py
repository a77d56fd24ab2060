"""An HTTP listener inside the server's Trio process: a Starlette (ASGI) app served by hypercorn's Trio
worker. The monitoring port and the client-facing HTTP port are both one of these."""

from __future__ import annotations

import logging
import ssl

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.protocol import ws_stream
from hypercorn.trio import serve as hypercorn_serve
from starlette.applications import Starlette
from wsproto.extensions import PerMessageDeflate

from streaming.security.tls import TlsFiles


class _DeclinedDeflate(PerMessageDeflate):
    """permessage-deflate that turns down every offer: the socket's frames go uncompressed."""

    def accept(self, offer: str) -> None:
        return None


def set_websocket_compression(on: bool) -> None:
    """Whether WebSocket upgrades accept a client's permessage-deflate offer. hypercorn accepts it
    whenever it is offered and has no setting for it, so the extension it builds each handshake from
    is chosen here. Off by default, as nats-server's WebSocket compression: for the small JSON frames
    of Bayeux, compressing and inflating each frame on both sides costs more than the bytes saved on
    a local network (bench/README.md: a quarter of the throughput, twice the latency)."""
    ws_stream.PerMessageDeflate = PerMessageDeflate if on else _DeclinedDeflate  # type: ignore[attr-defined]


async def serve_asgi(
    app: Starlette,
    host: str,
    port: int,
    *,
    log_name: str,
    keep_alive_s: float = 5.0,
    tls: TlsFiles | None = None,
    max_frame_bytes: int = 1024 * 1024,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` until cancelled; `task_status` gets the bound port (useful with port 0). hypercorn's
    own messages go to the `log_name` logger, warnings and worse only (not its "Running on" line).
    With `tls`, it serves HTTPS only (hypercorn's TLS), with client certificates when they verify."""
    config = HypercornConfig()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = http_log = logging.getLogger(log_name)
    http_log.setLevel(max(http_log.getEffectiveLevel(), logging.WARNING))
    config.graceful_timeout = 1.0
    config.keep_alive_timeout = keep_alive_s
    config.websocket_max_message_size = max_frame_bytes  # a larger WebSocket message closes its socket (1009)
    if tls is not None:
        config.certfile, config.keyfile = tls.cert, tls.key
        if tls.ca:
            config.ca_certs = tls.ca
        if tls.verify:
            config.verify_mode = ssl.CERT_REQUIRED

    async def started(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        # Starlette is an ASGI app; hypercorn's annotation spells the ASGI callable out more narrowly.
        await hypercorn_serve(app, config, task_status=task_status)  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(started)
        task_status.started(int(binds[0].rsplit(":", 1)[1]))
