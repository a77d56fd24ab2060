"""TLS from certificate files: for the server's listeners, the NATS port (as nats-server does it: a
plain INFO that says `tls_required`, then the handshake) and the HTTP listeners (hypercorn's own TLS),
where with `verify` clients must present a certificate signed by `ca` (mutual TLS); and for the
server's own connection to an external NATS cluster (`client_context`)."""

from __future__ import annotations

import ssl

import attrs


class TlsError(Exception):
    """The certificate files cannot be used (missing, unreadable, not matching)."""


@attrs.frozen
class TlsFiles:
    cert: str  # the server's certificate chain (PEM)
    key: str  # its private key (PEM)
    ca: str = ""  # CA certificates that client certificates must chain to (PEM)
    verify: bool = False  # require a client certificate


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server-side context for these files (TLS 1.2 or later); raises TlsError."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
        if files.ca:
            context.load_verify_locations(files.ca)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load the TLS certificate files: {exc}") from None
    if files.verify:
        if not files.ca:
            raise TlsError("verifying client certificates needs the CA that signs them (tls_ca_cert)")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(cert: str = "", key: str = "", ca: str = "") -> ssl.SSLContext:
    """A client-side context: the server's certificates checked against `ca` (default: the system's
    CAs), and this side's certificate when given; raises TlsError."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if ca:
            context.load_verify_locations(ca)
        if cert:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load the TLS client certificate files: {exc}") from None
    return context
