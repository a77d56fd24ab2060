"""Which web pages may use the client-facing HTTP listener: CORS for its requests, and the `Origin`
check of its WebSocket upgrades.

Browsers apply CORS to `fetch()` and XMLHttpRequest (Starlette's `CORSMiddleware` answers preflights
and adds the `Access-Control-*` headers) but not to WebSocket: any page may open a socket to any
server, and the browser sends the user's cookies and cached HTTP credentials with it. So the server
checks the upgrade's `Origin` itself (cross-site WebSocket hijacking):
- no `Origin` header: not a browser (Node, curl, our clients), allowed;
- the listener's own origin (the same scheme, host and port as the request's `Host`): allowed;
- an origin in `http_api_allow_origins`, or any origin when the list is `["*"]`: allowed;
- anything else, `null` (a sandboxed page, a file) included: refused with 403.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

import attrs

if TYPE_CHECKING:  # the configuration checks origins; only a server with an HTTP port loads Starlette
    from starlette.middleware import Middleware

ANY: Final = "*"
# What a page may send: credentials, bodies, the pull API's conditional ack and long-poll headers.
ALLOWED_HEADERS: Final = ["Authorization", "Content-Type", "If-Match", "If-None-Match", "Accept-Wait", "Prefer"]
# What a page may read besides the CORS-safelisted headers: the pull API's links, tags and message headers.
EXPOSED_HEADERS: Final = [
    "ETag",
    "Link",
    "Location",
    "Retry-After",
    "WWW-Authenticate",
    "Msg-Channel",
    "Msg-Sequence",
    "Msg-Timestamp",
    "Msg-Redelivered",
    "Msg-Delivery-Count",
    "Msg-Ack-Deadline",
    "msg-create",
    "msg-pull-consumers",
    "msg-consumer",
    "msg-acknowledgement",
    "msg-consume-next",
    "msg-acknowledge-next",
]
_METHODS: Final = ["GET", "POST", "PUT", "PATCH", "DELETE"]
_DEFAULT_PORTS: Final = {"http": 80, "https": 443, "ws": 80, "wss": 443}


class OriginError(ValueError):
    """A configured origin is not `scheme://host[:port]` (or a lone `*`); `str()` says which."""


def normalise(origin: str) -> str:
    """`origin` as browsers send it: lower-case scheme and host, no default port, no trailing slash.
    Raises `OriginError` for anything with a path, query, user or a scheme other than http(s)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError as exc:
        raise OriginError(f"{origin!r} is not an origin: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise OriginError(f"{origin!r} is not an origin (expected scheme://host[:port], http or https)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise OriginError(f"{origin!r} is not an origin: it has a path, a query or a fragment")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}:{port}"
    return f"{scheme}://{host}"


@attrs.frozen
class Origins:
    """The allowed origins, normalised; `any` when the list is `["*"]` (then without credentials)."""

    allowed: frozenset[str] = frozenset()
    any: bool = False

    @classmethod
    def parse(cls, values: Sequence[str]) -> Origins:
        if ANY in values:
            if len(values) > 1:
                raise OriginError("'*' allows every origin: list it alone, or list origins without it")
            return cls(any=True)
        return cls(allowed=frozenset(normalise(v) for v in values))

    @property
    def configured(self) -> bool:
        return self.any or bool(self.allowed)

    def allows_socket(self, origin: str | None, host: str | None, scheme: str) -> bool:
        """Whether a WebSocket upgrade with this `Origin` (None: no header) may go on; `host` is the
        request's `Host` header and `scheme` the listener's (`ws` or `wss`)."""
        if origin is None:
            return True
        if self.any:
            return True
        try:
            origin = normalise(origin)
        except OriginError:
            return False  # "null" and anything else no page of a listed origin sends
        if origin in self.allowed:
            return True
        if host is None:
            return False
        own = "https" if scheme in ("wss", "https") else "http"
        try:
            return origin == normalise(f"{own}://{host}")
        except OriginError:
            return False

    def middleware(self) -> list[Middleware]:
        """Starlette's CORS middleware for these origins (none when no origin is configured: browsers
        then keep pages of other origins from reading any answer)."""
        if not self.configured:
            return []
        from starlette.middleware import Middleware
        from starlette.middleware.cors import CORSMiddleware

        return [
            Middleware(
                CORSMiddleware,
                allow_origins=[ANY] if self.any else sorted(self.allowed),
                allow_methods=_METHODS,
                allow_headers=ALLOWED_HEADERS,
                # Credentials (Authorization, cookies) only for listed origins: with "*" any page could
                # act with a visitor's cached credentials.
                allow_credentials=not self.any,
                expose_headers=EXPOSED_HEADERS,
                max_age=600,
            )
        ]
