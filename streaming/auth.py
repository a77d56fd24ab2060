"""Who may connect to the NATS port, in nats-server's terms: one token, or users with passwords.

A password in the configuration is either the password itself or its bcrypt hash (`$2a$`, `$2b$` or
`$2y$`, as `nats server passwd` and `htpasswd -B` write them), as nats-server takes them. A CONNECT
names `auth_token`, or `user` and `pass`. Plain secrets are compared in constant time; a bcrypt check
takes tens of milliseconds, so the broker runs it off the event loop (`needs_thread`) and remembers
the digest of a password once it was right, so that a client reconnecting does not pay it again.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import bcrypt

from streaming.permissions import Compiled, Permissions

_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")


@attrs.frozen
class User:
    name: str
    password: str  # the password, or its bcrypt hash
    permissions: Permissions | None = None  # None: may publish and subscribe anywhere

    @property
    def hashed(self) -> bool:
        return self.password.startswith(_BCRYPT_PREFIXES)


class Authenticator:
    """Checks the credentials of a CONNECT. With neither a token nor users, everyone may connect."""

    def __init__(self, token: str = "", users: Sequence[User] = ()) -> None:
        if token and users:
            raise ValueError("a token and users cannot both be configured (as in nats-server)")
        names = [u.name for u in users]
        if len(set(names)) != len(names):
            raise ValueError("a user is configured twice")
        if any(not u.name or not u.password for u in users):
            raise ValueError("every user needs a name and a password")
        self._token = token.encode()
        self._users = {u.name: u for u in users}
        self._permissions = {u.name: u.permissions.compiled() for u in users if u.permissions is not None}
        self._proven: set[tuple[str, bytes]] = set()  # (user, sha256 of a password found right)

    @property
    def required(self) -> bool:
        return bool(self._token or self._users)

    @property
    def restricts(self) -> bool:
        """Whether any user has permissions (so that requests must be checked against them)."""
        return bool(self._permissions)

    def permissions(self, user: str) -> Compiled | None:
        """What `user` may publish and subscribe to (None: anything)."""
        return self._permissions.get(user)

    def needs_thread(self, options: Mapping[str, Any]) -> bool:
        """Whether checking these credentials is a bcrypt check not made before (slow)."""
        user = self._users.get(str(options.get("user", "")))
        if user is None or not user.hashed:
            return False
        return (user.name, _digest(options.get("pass"))) not in self._proven

    def check(self, options: Mapping[str, Any]) -> str | None:
        """The user a CONNECT's options prove (the token's is ""), or None: not authorized."""
        if not self.required:
            return ""
        if self._token:
            token = options.get("auth_token")
            return "" if isinstance(token, str) and hmac.compare_digest(token.encode(), self._token) else None
        name, given = options.get("user"), options.get("pass")
        user = self._users.get(name) if isinstance(name, str) else None
        if user is None or not isinstance(given, str):
            return None
        if not user.hashed:
            return user.name if hmac.compare_digest(given.encode(), user.password.encode()) else None
        key = (user.name, _digest(given))
        if key in self._proven:
            return user.name
        try:
            right = bcrypt.checkpw(given.encode(), user.password.encode())
        except ValueError:  # a malformed hash in the configuration
            return None
        if right:
            self._proven.add(key)
            return user.name
        return None


def _digest(password: object) -> bytes:
    return hashlib.sha256(str(password).encode()).digest()
