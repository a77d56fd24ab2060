"""Who may connect to the NATS port, in nats-server's terms: one token, or users with passwords, or
users known by an nkey (an ed25519 public key: the CONNECT carries it and its signature of the nonce
the server's INFO gave that connection).

A password in the configuration is either the password itself or its bcrypt hash (`$2a$`, `$2b$` or
`$2y$`, as `nats server passwd` and `htpasswd -B` write them), as nats-server takes them. A CONNECT
names `auth_token`, or `user` and `pass`. Plain secrets are compared in constant time; a bcrypt check
takes tens of milliseconds, so the broker runs it off the event loop (`needs_thread`) and remembers
the digest of a password once it was right, so that a client reconnecting does not pay it again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from streaming.security.permissions import Compiled, Permissions

_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
_NKEY_USER = 20 << 3  # the prefix byte of a user's public nkey ("U...")
_NKEY_SEED = 18 << 3  # a seed's first five bits ("S..."); the next ten say whose seed it is


@attrs.frozen
class User:
    name: str  # for an nkey user, its public nkey
    password: str  # the password, or its bcrypt hash ("" for an nkey user)
    permissions: Permissions | None = None  # None: may publish and subscribe anywhere
    nkey: bool = False

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
        if any(not u.name or not (u.password or u.nkey) for u in users):
            raise ValueError("every user needs a name and a password, or an nkey")
        for u in users:
            if u.nkey and public_nkey(u.name) is None:
                raise ValueError(f"{u.name!r} is not a user's public nkey (U...)")
        self._token = token.encode()
        self._users = {u.name: u for u in users}
        self._permissions = {u.name: u.permissions.compiled() for u in users if u.permissions is not None}
        self._proven: set[tuple[str, bytes]] = set()  # (user, sha256 of a password found right)

    @property
    def required(self) -> bool:
        return bool(self._token or self._users)

    @property
    def wants_nonce(self) -> bool:
        """Whether INFO must carry a nonce for clients to sign (some user has an nkey)."""
        return any(u.nkey for u in self._users.values())

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

    def check(self, options: Mapping[str, Any], nonce: str = "") -> str | None:
        """The user a CONNECT's options prove (the token's is "", an nkey user's its public key), or
        None: not authorized. `nonce`: what the connection's INFO gave it to sign."""
        if not self.required:
            return ""
        if self._token:
            token = options.get("auth_token")
            return "" if isinstance(token, str) and hmac.compare_digest(token.encode(), self._token) else None
        nkey = options.get("nkey")
        if isinstance(nkey, str) and nkey:
            known = self._users.get(nkey)
            return nkey if known is not None and known.nkey and _signed(nkey, options.get("sig"), nonce) else None
        name, given = options.get("user"), options.get("pass")
        user = self._users.get(name) if isinstance(name, str) else None
        if user is None or user.nkey or not isinstance(given, str):
            return None
        if not user.hashed:
            return user.name if hmac.compare_digest(given.encode(), user.password.encode()) else None
        key = (user.name, _digest(given))
        if key in self._proven:
            return user.name
        import bcrypt  # only a server with hashed passwords loads it (start-up time)

        try:
            right = bcrypt.checkpw(given.encode(), user.password.encode())
        except ValueError:  # a malformed hash in the configuration
            return None
        if right:
            self._proven.add(key)
            return user.name
        return None


def public_nkey(nkey: str) -> bytes | None:
    """The ed25519 key of a user's public nkey (base32 of the prefix byte, the key and a CRC-16), or
    None when it is not one."""
    try:
        raw = base64.b32decode(nkey + "=" * (-len(nkey) % 8))
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 35 or raw[0] != _NKEY_USER or not _crc_ok(raw):
        return None
    return raw[1:-2]


def _crc_ok(raw: bytes) -> bool:
    return binascii.crc_hqx(raw[:-2], 0) == int.from_bytes(raw[-2:], "little")


def _encoded(raw: bytes) -> str:
    return base64.b32encode(raw + binascii.crc_hqx(raw, 0).to_bytes(2, "little")).decode().rstrip("=")


class NkeySeed:
    """A user's nkey seed (`S...`, as `nk -gen user` writes it): its public nkey, and signatures of the
    nonces a server's INFO gives, for connecting to a NATS server that knows the user by its nkey."""

    def __init__(self, seed: str) -> None:
        text = seed.strip()
        try:
            raw = base64.b32decode(text + "=" * (-len(text) % 8))
        except (binascii.Error, ValueError):
            raw = b""
        valid = len(raw) == 36 and raw[0] & 0xF8 == _NKEY_SEED and _crc_ok(raw)
        if not valid or ((raw[0] & 7) << 5 | raw[1] >> 3) != _NKEY_USER:
            raise ValueError("not a user's nkey seed (SU...)")
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self._key = Ed25519PrivateKey.from_private_bytes(raw[2:34])
        public = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public = _encoded(bytes([_NKEY_USER]) + public)

    def sign(self, nonce: str) -> str:
        """The signature of `nonce` as a CONNECT carries it (URL-safe base64, unpadded)."""
        return base64.urlsafe_b64encode(self._key.sign(nonce.encode())).decode().rstrip("=")


_CREDS_BLOCK = re.compile(r"-{3,}BEGIN [A-Z ]+-{3,}\s*\n(.+?)\n\s*-{3,}END [A-Z ]+-{3,}", re.DOTALL)


def read_creds(text: str) -> tuple[str, NkeySeed]:
    """A NATS credentials file (`nsc` writes them): the user's JWT and its nkey seed, in that order;
    ValueError when it is not one."""
    blocks = [block.strip() for block in _CREDS_BLOCK.findall(text)]
    if len(blocks) < 2 or blocks[0].count(".") != 2:
        raise ValueError("not a NATS credentials file (a user JWT block, then a user nkey seed block)")
    return blocks[0], NkeySeed(blocks[1])


def _signed(nkey: str, signature: object, nonce: str) -> bool:
    """Whether `signature` (base64, URL-safe or standard, padded or not) is the nkey's of `nonce`."""
    key = public_nkey(nkey)
    if key is None or not nonce or not isinstance(signature, str):
        return False
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    padded = signature + "=" * (-len(signature) % 4)
    try:
        raw = base64.urlsafe_b64decode(padded) if "+" not in padded and "/" not in padded else base64.b64decode(padded)
        Ed25519PublicKey.from_public_bytes(key).verify(raw, nonce.encode())
    except (binascii.Error, ValueError, InvalidSignature):
        return False
    return True


def _digest(password: object) -> bytes:
    return hashlib.sha256(str(password).encode()).digest()
