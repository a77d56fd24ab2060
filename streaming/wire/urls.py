"""NATS server URLs as users write them: `nats://host:port`, `tls://host:port`, `host:port` or `host`,
with credentials in the URL (`nats://user:password@host`, `nats://token@host`), several separated by
commas; and the `host:port` entries a server's INFO lists in `connect_urls`."""

from __future__ import annotations

import urllib.parse

import attrs

DEFAULT_PORT = 4222
_SCHEMES = ("nats", "tls")


@attrs.frozen
class ServerUrl:
    host: str
    port: int = DEFAULT_PORT
    user: str = ""
    password: str = ""
    token: str = ""  # the URL's user part when it has no password
    tls: bool = False  # `tls://`: TLS is required even if the server's INFO does not ask for it

    def __str__(self) -> str:
        """The URL without its credentials (for logs and monitoring)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'tls' if self.tls else 'nats'}://{host}:{self.port}"

    def same_server(self, other: ServerUrl) -> bool:
        return (self.host, self.port) == (other.host, other.port)


def parse_url(text: str) -> ServerUrl:
    """One URL; ValueError says what is wrong with it."""
    raw = text.strip()
    if not raw:
        raise ValueError("an empty NATS server URL")
    if "://" not in raw:
        raw = "nats://" + raw
    parts = urllib.parse.urlsplit(raw)
    if parts.scheme not in _SCHEMES:
        raise ValueError(f"{text!r}: a NATS server URL starts with nats:// or tls://")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ValueError(f"{text!r}: the port is not a number between 0 and 65535") from None
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{text!r}: expected nats://[user:password@]host[:port]")
    user = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    if user and parts.password is None:
        return ServerUrl(parts.hostname, port, token=user, tls=parts.scheme == "tls")
    return ServerUrl(parts.hostname, port, user, password, tls=parts.scheme == "tls")


def parse_urls(text: str) -> list[ServerUrl]:
    """Comma-separated URLs, in order, without repeats."""
    urls: list[ServerUrl] = []
    for part in text.split(","):
        url = parse_url(part)
        if not any(url.same_server(u) for u in urls):
            urls.append(url)
    return urls


def discovered(connect_urls: object, like: ServerUrl) -> list[ServerUrl]:
    """The nodes an INFO's `connect_urls` names, with the scheme and credentials of the URL in use."""
    if not isinstance(connect_urls, list):
        return []
    found: list[ServerUrl] = []
    for entry in connect_urls:
        if not isinstance(entry, str):
            continue
        try:
            url = parse_url(entry)
        except ValueError:
            continue
        found.append(attrs.evolve(like, host=url.host, port=url.port))
    return found
