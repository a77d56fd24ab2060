"""The client side of a NATS connection's start and of reconnecting, sans-IO, shared by the client
library (streaming.client.nats_conn) and the server's link to a NATS cluster (streaming.nats.link).

- `Handshake`: one attempt on one server: its INFO in → whether TLS starts (and with which context)
  → the CONNECT (with the credentials the URL or the options give, or an nkey's signature of the
  INFO's nonce) and a PING out → its PONG (done) or `-ERR` (refused, `HandshakeError`).
- `ServerList`: the servers to try, configured first, then those INFO's `connect_urls` names; which
  to try after a drop (the next after the one that went); whether the cluster's list changed.
- `resubscribe`: what a reconnected connection sends before anything else, every subscription
  again with its sid.

The callers move the bytes and hold the sockets; nothing here does I/O.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterable, Mapping

import attrs

from streaming.wire import nats as p
from streaming.wire.urls import ServerUrl, discovered


class HandshakeError(Exception):
    """The server refused the connection, or the two sides cannot agree (TLS); str() says which."""


# Given the nonce of the server's INFO, the credential fields that sign it (an nkey: `nkey` and `sig`;
# a user JWT: `jwt` and `sig`). HandshakeError when there is no nonce to sign.
Signer = Callable[[str], dict[str, str]]


@attrs.frozen
class HandshakeOptions:
    name: str = ""
    lang: str = "python"
    version: str = "0.1.0"
    echo: bool = True  # its own publishes reach its own subscriptions
    user: str = ""
    password: str = ""
    token: str = ""
    signer: Signer | None = None  # wins over the other credentials
    tls: ssl.SSLContext | None = None  # client certificate and CAs; None: the system's, when TLS is used
    # When the server asks for TLS that was not configured: use the system's CAs (the server's link), or
    # refuse, so that the application chooses (the client library, whose user passes `tls=`).
    tls_when_asked: bool = False


class Handshake:
    """One connection attempt's handshake with the server at `url`."""

    def __init__(self, url: ServerUrl, options: HandshakeOptions) -> None:
        self.url = url
        self.options = options
        self.info: dict[str, object] = {}

    def tls_for(self, info: p.Info) -> ssl.SSLContext | None:
        """The server's INFO came: the TLS context to start TLS with now (None: stay in the clear)."""
        self.info = info.options
        required = bool(info.options.get("tls_required"))
        configured = self.options.tls is not None or self.url.tls
        if configured and not required:
            raise HandshakeError("TLS is configured, but the server does not offer it (no tls_required in its INFO)")
        if required and not configured and not self.options.tls_when_asked:
            raise HandshakeError("the server requires TLS: connect with tls=")
        if not required:
            return None
        return self.options.tls or ssl.create_default_context()

    def connect(self) -> bytes:
        """The CONNECT and the PING whose PONG says it was taken."""
        options = self.options
        connect = {
            "verbose": False,
            "pedantic": False,
            "lang": options.lang,
            "version": options.version,
            "protocol": 1,
            "echo": options.echo,
            "name": options.name,
            "headers": False,
            **self._credentials(),
        }
        return p.encode_connect(connect) + p.PING_BYTES

    def _credentials(self) -> dict[str, str]:
        options, url = self.options, self.url
        if options.signer is not None:
            nonce = str(self.info.get("nonce", ""))
            if not nonce:
                raise HandshakeError(
                    "an nkey seed or credentials file is configured, but the server gave no nonce to sign"
                )
            return options.signer(nonce)
        if url.user or url.token:  # credentials in the URL win, as in NATS clients
            return {"user": url.user, "pass": url.password} if url.user else {"auth_token": url.token}
        if options.user:
            return {"user": options.user, "pass": options.password}
        if options.token:
            return {"auth_token": options.token}
        return {}

    def done(self, event: p.Event) -> bool:
        """An event after the CONNECT: True at the PONG (connected); raises HandshakeError at -ERR."""
        if isinstance(event, p.Err):
            raise HandshakeError(f"the server refused the connection: {event.text}")
        return isinstance(event, p.Pong)


class ServerList:
    """The servers of a cluster to (re)connect to, and what the latest INFO said of the cluster."""

    def __init__(self, urls: Iterable[ServerUrl]) -> None:
        self.known: list[ServerUrl] = list(urls)
        if not self.known:
            raise ValueError("no NATS server URL")
        self.cluster: tuple[str, ...] = ()  # the connect_urls of the latest INFO

    def learn(self, info: Mapping[str, object], current: ServerUrl) -> bool:
        """Add the nodes an INFO's `connect_urls` names (with the scheme and credentials of `current`);
        True when the cluster's list is not what the INFO before said."""
        urls = info.get("connect_urls")
        cluster = tuple(sorted(str(u) for u in urls)) if isinstance(urls, list) else ()
        if cluster == self.cluster:
            return False
        self.cluster = cluster
        for url in discovered(list(cluster), current):
            if not any(url.same_server(k) for k in self.known):
                self.known.append(url)
        return True

    def after(self, current: ServerUrl | None) -> list[ServerUrl]:
        """Every known server, starting with the one after `current` (the one that went)."""
        known = self.known
        start = 0
        if current is not None:
            start = next((i + 1 for i, u in enumerate(known) if u.same_server(current)), 0)
        return known[start:] + known[:start]


def resubscribe(subscriptions: Iterable[tuple[str, str, str]]) -> list[bytes]:
    """The SUBs of (sid, subject, queue), to send again first on a new connection."""
    return [p.encode_sub(subject, sid, queue) for sid, subject, queue in subscriptions]
