"""One client connection's NATS session, sans-IO: what its CONNECT set, and the broker's answer to each
of its requests, decided here and carried out by the broker (streaming.nats.broker), which keeps the
subscription lists and the sockets.

The decisions follow nats-server's, word for word where a client can see them: an invalid subject, a
publish to a subject that is not literal in pedantic mode, a subscription or publish the user's
permissions (or the server's own subjects) do not allow. None closes the connection: the client is
told, and everyone else keeps working.
"""

from __future__ import annotations

import attrs

from streaming.security.permissions import Compiled
from streaming.wire import nats as p
from streaming.wire.subjects import valid_literal, valid_subject


@attrs.frozen
class Refusal:
    """A request refused: the `-ERR` line the client gets, and the kind the server counts it under."""

    error: bytes
    kind: str


INVALID_SUBJECT = Refusal(p.encode_err(p.INVALID_SUBJECT), "invalid_subject")
INVALID_PUBLISH_SUBJECT = Refusal(p.encode_err(p.INVALID_PUBLISH_SUBJECT), "invalid_publish_subject")


def violation(what: str, subject: str) -> Refusal:
    """nats-server's answer to a publish or subscription the connection may not make."""
    return Refusal(p.encode_err(f'{p.PERMISSIONS_VIOLATION} for {what} to "{subject}"'), "permissions")


class Session:
    __slots__ = ("echo", "name", "pedantic", "permissions", "pings_out", "verbose")

    def __init__(self) -> None:
        self.verbose = False  # every request is answered +OK
        self.pedantic = False  # a publish must name a literal subject
        self.echo = True  # its own publishes reach its own subscriptions
        self.name = ""
        self.pings_out = 0  # the broker's PINGs not yet answered
        self.permissions: Compiled | None = None  # what its user may publish and subscribe to (None: all)

    def connect(self, event: p.Connect) -> bytes:
        """Its CONNECT (admitted): what the broker writes back."""
        self.verbose = event.verbose
        self.pedantic = event.pedantic
        self.echo = event.echo
        self.name = str(event.options.get("name", ""))
        return self.ok()

    def ok(self) -> bytes:
        """The answer to a request that went through."""
        return p.OK_BYTES if self.verbose else b""

    def subscription(self, event: p.Sub, internal: bool) -> Refusal | None:
        """Why its SUB is refused (None: take it). `internal`: the subject is the server's own."""
        if not valid_subject(event.subject) or (event.queue and not valid_literal(event.queue)):
            return INVALID_SUBJECT
        permissions = self.permissions
        if internal or (permissions is not None and not permissions.may_subscribe(event.subject)):
            return violation("Subscription", event.subject)
        return None

    def filtered(self, subject: str) -> Compiled | None:
        """The permissions a subscription to `subject` is delivered through (its user may receive some
        subjects it matches only), or None when everything it matches may be delivered."""
        permissions = self.permissions
        return permissions if permissions is not None and permissions.filters(subject) else None

    def publish_refusal(self, subject: str, internal: bool) -> Refusal | None:
        """Why its PUB is refused by its user's permissions (None: route it). The broker checks
        `permissions` itself first, on the hot path, and asks this only when there are some."""
        permissions = self.permissions
        if permissions is not None and not internal and not permissions.may_publish(subject):
            return violation("Publish", subject)
        return None

    def unsubscribes_now(self, delivered: int, max_msgs: int | None) -> bool:
        """Whether an UNSUB (with its maximum) ends a subscription that got `delivered` messages."""
        return max_msgs is None or delivered >= max_msgs

    def pong(self) -> None:
        self.pings_out = 0

    def ping(self, max_pings_out: int) -> bytes | None:
        """The broker's next PING to send, or None: `max_pings_out` went unanswered (a stale connection)."""
        if self.pings_out >= max_pings_out:
            return None
        self.pings_out += 1
        return p.PING_BYTES
