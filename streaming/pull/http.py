"""The HTTP pull API's resources (Starlette routes), on the client-facing HTTP listener.

Every URL the server gives out is absolute, in `Link` headers (RFC 8288; several links are joined in
one header, as the RFC allows) and `Location`; clients follow them and never build URLs. Errors carry
a short JSON body naming the problem; a wrong method gets 405 with `Allow`.
"""

from __future__ import annotations

import datetime
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from streaming.core.errors import ORDERED_MISMATCH, NotPermitted, RequestError, StoreError
from streaming.pull import protocol as pp
from streaming.pull.door import Conflict, PullConsumer, PullDoor
from streaming.security.auth import Authenticator
from streaming.security.http_auth import permissions_of

_CHANNEL = re.compile(r"[^./*>\s]+(\.[^./*>\s]+)*")  # a literal NATS subject, as STAN channels are
_CONTENT_TYPE = re.compile(r"[\x20-\x7e]{0,255}")  # what the store keeps (storage.codec)
Handler = Callable[[Request], Awaitable[Response]]


def _problem(status: int, error: str, headers: dict[str, str] | None = None, **fields: Any) -> Response:
    return JSONResponse({"error": error, **fields}, status_code=status, headers=headers)


def _links(*links: tuple[str, str, str]) -> str:
    """`Link` header value from (url, rel, extra parameters)."""
    return ", ".join(f'<{url}>; rel="{rel}"{extra}' for url, rel, extra in links)


_MIRRORED = {"create": "msg-create", "pull-consumers": "msg-pull-consumers", "consumer": "msg-consumer"}
_MIRRORED_ACK = "msg-acknowledgement"


def _rfc3339(unix_s: float) -> str:
    return (
        datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    )


class PullApp:
    def __init__(self, door: PullDoor, *, max_payload: int, auth: Authenticator | None = None) -> None:
        self.door = door
        self.auth = auth or Authenticator()
        self.max_payload = max_payload
        self.mirror = door.settings.msg_headers
        base = "/channels/{channel}"
        consumer = base + "/pull-consumers/{cid}"
        self.routes = [
            self._route(base, {"GET": self.channel_info, "HEAD": self.channel_info}),
            self._route(base + "/messages", {"POST": self.publish}),
            self._route(base + "/pull-consumers", {"POST": self.create}),
            self._route(consumer, {"GET": self.consumer, "HEAD": self.consumer, "DELETE": self.delete}),
            self._route(consumer + "/next/{step}", {"POST": self.pull}),
            self._route(consumer + "/next", {"POST": self.pull}),
            self._route(
                consumer + "/acknowledgements/{seq}", {"GET": self.ack_state, "HEAD": self.ack_state, "POST": self.ack}
            ),
        ]

    @staticmethod
    def _route(path: str, handlers: dict[str, Handler]) -> Route:
        allow = ", ".join(handlers)

        async def endpoint(request: Request) -> Response:
            handler = handlers.get(request.method)
            if handler is None:
                return _problem(405, "method-not-allowed", {"Allow": allow}, allow=allow)
            if not _CHANNEL.fullmatch(request.path_params["channel"]):
                return _problem(400, "bad-parameter", parameter="channel", detail="not a valid channel name")
            return await handler(request)

        return Route(path, endpoint, methods=["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])

    # -- urls --------------------------------------------------------------------------------------

    @staticmethod
    def _base(request: Request, channel: str) -> str:
        return f"{str(request.base_url).rstrip('/')}/channels/{channel}"

    def _consumer_url(self, request: Request, live: PullConsumer) -> str:
        return f"{self._base(request, live.consumer.channel)}/pull-consumers/{live.consumer.id}"

    def _next_links(self, request: Request, live: PullConsumer) -> list[tuple[str, str, str]]:
        url = self._consumer_url(request, live)
        return [(f"{url}/next/{live.consumer.step + 1}", "next", ""), (url, "consumer", "")]

    def _ack_link(self, request: Request, live: PullConsumer, seq: int, tag: str) -> tuple[str, str, str]:
        return (f"{self._consumer_url(request, live)}/acknowledgements/{seq}", "acknowledgement", f'; etag="{tag}"')

    def _link_headers(self, links: list[tuple[str, str, str]], live: PullConsumer | None = None) -> dict[str, str]:
        """A `Link` header with these links and, when the server mirrors them, the same URLs in the
        `msg-*` headers that Artemis REST clients follow."""
        headers = {"Link": _links(*links)}
        if self.mirror:
            auto = live is not None and not live.consumer.options.ack_manual
            for url, rel, _ in links:
                if rel == "next":
                    headers["msg-consume-next" if auto else "msg-acknowledge-next"] = url
                elif rel == "acknowledgement":
                    headers.setdefault(_MIRRORED_ACK, url)  # the delivery's own (it comes first)
                elif rel in _MIRRORED:
                    headers[_MIRRORED[rel]] = url
        return headers

    def _live(self, request: Request) -> PullConsumer | Response:
        cid = request.path_params["cid"]
        live = self.door.get(cid)
        if live is None or live.consumer.channel != request.path_params["channel"]:
            factory = f"{self._base(request, request.path_params['channel'])}/pull-consumers"
            error = "consumer-expired" if self.door.tombstoned(cid) else "unknown-consumer"
            return _problem(404, error, self._link_headers([(factory, "pull-consumers", "")]))
        return live

    # -- channels ----------------------------------------------------------------------------------

    async def channel_info(self, request: Request) -> Response:
        channel = request.path_params["channel"]
        info = self.door.channel_info(channel)
        if info is None:
            return _problem(404, "unknown-channel", channel=channel)
        base = self._base(request, channel)
        body = {"first_seq": info.first_seq if info.msgs else 0, "last_seq": info.last_seq, "msgs": info.msgs}
        body["bytes"] = info.bytes
        links = self._link_headers(
            [(f"{base}/messages", "create", ""), (f"{base}/pull-consumers", "pull-consumers", "")]
        )
        return JSONResponse(body, headers=links)

    async def publish(self, request: Request) -> Response:
        channel = request.path_params["channel"]
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_payload:
                # The rest of the body is not read: the connection cannot carry another request.
                return _problem(413, "payload-too-large", {"Connection": "close"}, limit=self.max_payload)
        if isinstance(self.door.refusal(channel, "publish", permissions_of(request, self.auth)), NotPermitted):
            return _problem(403, "forbidden", detail=f"may not publish to channel {channel!r}")
        content_type = request.headers.get("content-type", "")
        if not _CONTENT_TYPE.fullmatch(content_type):
            detail = "a media type of at most 255 printable ASCII characters"
            return _problem(400, "bad-parameter", parameter="Content-Type", detail=detail)
        try:
            seq = await self.door.publish(channel, bytes(body), content_type)
        except (RequestError, StoreError) as exc:
            status = 507 if isinstance(exc, StoreError) else 400
            return _problem(status, "not-stored", detail=str(exc) if isinstance(exc, RequestError) else "store error")
        location = f"{self._base(request, channel)}/messages/{seq}"
        return Response(status_code=201, headers={"Location": location, "Msg-Sequence": str(seq)})

    # -- consumers ---------------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        channel = request.path_params["channel"]
        try:
            form = await _form(request)
            options = pp.parse_options(form, time.time_ns())
        except pp.BadParameter as exc:
            return _problem(400, "bad-parameter", parameter=exc.name, detail=str(exc))
        if isinstance(self.door.refusal(channel, "subscribe", permissions_of(request, self.auth)), NotPermitted):
            return _problem(403, "forbidden", detail=f"may not consume from channel {channel!r}")
        try:
            live = await self.door.create(channel, options)
        except Conflict as exc:
            return _problem(409, "conflict", detail=str(exc))
        except RequestError as exc:
            # A durable in use, or a group member that would not keep the group's order: a conflict.
            conflict = "duplicate durable" in str(exc) or str(exc) == ORDERED_MISMATCH
            return _problem(409 if conflict else 400, "refused", detail=str(exc))
        except StoreError:
            return _problem(507, "not-stored", detail="store error")
        url = self._consumer_url(request, live)
        body = {"consumer": live.consumer.id, "channel": channel, **options.as_json(), "step": 0}
        headers = {"Location": url, **self._link_headers(self._next_links(request, live), live)}
        return JSONResponse(body, status_code=201, headers=headers)

    async def consumer(self, request: Request) -> Response:
        live = self._live(request)
        if isinstance(live, Response):
            return live
        consumer = live.consumer
        url = self._consumer_url(request, live)
        inflight = []
        links = self._next_links(request, live)
        for seq, bound in sorted(consumer.bound.items()):
            h = bound.handout
            ack_url = f"{url}/acknowledgements/{seq}"
            inflight.append(
                {
                    "seq": seq,
                    "etag": h.tag,
                    "ack_url": ack_url,
                    "deadline": _rfc3339(h.deadline_unix_s),
                    "delivery_count": h.count,
                }
            )
            links.append(self._ack_link(request, live, seq, h.tag))
        body = {"consumer": consumer.id, "channel": consumer.channel, **consumer.options.as_json()}
        body.update(step=consumer.step, in_flight=inflight)
        return JSONResponse(body, headers=self._link_headers(links, live))

    async def delete(self, request: Request) -> Response:
        live = self._live(request)
        if isinstance(live, Response):
            return live
        unsubscribe = request.query_params.get("unsubscribe", "false")
        if unsubscribe not in ("true", "false"):
            return _problem(400, "bad-parameter", parameter="unsubscribe", detail="expected true or false")
        self.door.close(live, unsubscribe=unsubscribe == "true")
        return Response(status_code=204)

    # -- pulls -------------------------------------------------------------------------------------

    async def pull(self, request: Request) -> Response:
        live = self._live(request)
        if isinstance(live, Response):
            return live
        step: int | None = None
        if "step" in request.path_params:
            try:
                step = int(request.path_params["step"])
            except ValueError:
                return _problem(400, "bad-parameter", parameter="step", detail="expected a whole number")
        try:
            wait = pp.parse_wait(
                request.headers.get("accept-wait"), request.headers.get("prefer"), self.door.settings.max_pull_wait_s
            )
        except pp.BadParameter as exc:
            return _problem(400, "bad-parameter", parameter=exc.name, detail=str(exc))
        result = await self.door.pull(live, step, wait)
        if self.door.get(live.consumer.id) is not live:  # closed or expired while it waited
            gone = self._live(request)
            assert isinstance(gone, Response)
            return gone
        consumer = live.consumer
        if result.status == 200:
            h = result.handout
            assert h is not None
            links = [*self._next_links(request, live)]
            if h.tag:
                links.insert(0, self._ack_link(request, live, h.seq, h.tag))
            headers = {
                "Msg-Channel": consumer.channel,
                "Msg-Sequence": str(h.seq),
                "Msg-Timestamp": _rfc3339(h.timestamp_unix_ns / 1e9),
                "Msg-Redelivered": "true" if h.count > 1 else "false",
                "Msg-Delivery-Count": str(h.count),
                **self._link_headers(links, live),
            }
            if h.tag:
                headers["Msg-Ack-Deadline"] = _rfc3339(h.deadline_unix_s)
            return Response(h.data, media_type=h.content_type or "application/octet-stream", headers=headers)
        next_links = self._link_headers(self._next_links(request, live), live)
        if result.status == 503:
            return _problem(503, "no-message", {"Retry-After": "1", **next_links})
        if result.status == 412:
            return _problem(412, "step-out-of-sync", next_links, step=consumer.step)
        links = [self._ack_link(request, live, seq, b.handout.tag) for seq, b in sorted(consumer.bound.items())]
        return _problem(409, "max-inflight", self._link_headers([*links, *self._next_links(request, live)], live))

    # -- acknowledgements --------------------------------------------------------------------------

    async def ack(self, request: Request) -> Response:
        live = self._live(request)
        if isinstance(live, Response):
            if self.door.tombstoned(request.path_params["cid"]):
                return _problem(412, "stale-delivery", state="closed")
            return live
        try:
            seq = _seq(request)
            form = await _form(request)
            acknowledge = pp.parse_acknowledge(form.get("acknowledge"))
            delay = pp.parse_delay(form.get("delay"), acknowledge)
        except pp.BadParameter as exc:
            return _problem(400, "bad-parameter", parameter=exc.name, detail=str(exc))
        decision = await self.door.acknowledge(live, seq, request.headers.get("if-match"), acknowledge, delay)
        if decision.status == 204:
            return Response(status_code=204, headers=self._link_headers(self._next_links(request, live), live))
        if decision.status == 405:
            return _problem(405, "already-acknowledged", {"Allow": "GET, HEAD"})
        return JSONResponse(decision.body or {"error": "refused"}, status_code=decision.status)

    async def ack_state(self, request: Request) -> Response:
        live = self._live(request)
        if isinstance(live, Response):
            return live
        try:
            seq = _seq(request)
        except pp.BadParameter as exc:
            return _problem(400, "bad-parameter", parameter=exc.name, detail=str(exc))
        now = trio.current_time()
        state = live.consumer.state_of(seq, now)
        if state is None:
            return _problem(404, "not-delivered", seq=seq)
        if state["deadline"] is not None:
            state["deadline"] = _rfc3339(state["deadline"])
        tag = live.consumer.current_tag(seq, now)
        return JSONResponse(state, headers={"ETag": f'"{tag}"'} if tag else None)


def _seq(request: Request) -> int:
    text = request.path_params["seq"]
    if not text.isdigit() or int(text) < 1:
        raise pp.BadParameter("seq", f"expected a sequence number, got {text!r}")
    return int(text)


async def _form(request: Request) -> dict[str, str]:
    """A form (urlencoded) or JSON object body as strings; an empty body is an empty form."""
    body = await request.body()
    if not body.strip():
        return {}
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            raise pp.BadParameter("body", "not JSON") from None
        if not isinstance(value, dict):
            raise pp.BadParameter("body", "expected a JSON object")
        return {k: (json.dumps(v) if isinstance(v, bool) else str(v)) for k, v in value.items()}
    try:
        return dict(parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=True))
    except (UnicodeDecodeError, ValueError):
        raise pp.BadParameter("body", "expected application/x-www-form-urlencoded or JSON") from None
