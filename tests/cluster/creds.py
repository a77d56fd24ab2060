"""Operator-mode NATS for tests: an operator, an account and a user, their JWTs signed as nsc signs
them (ed25519 nkeys, with the `nkeys` package), a nats-server configuration that trusts them, and
the user's credentials file."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import nkeys


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _keys(prefix: int) -> Any:
    return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))


def _jwt(claims: dict[str, Any], signer: Any) -> str:
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body: dict[str, Any] = {"iat": int(time.time()), "iss": signer.public_key.decode(), **claims}
    body["jti"] = base64.b32encode(hashlib.sha256(json.dumps(body).encode()).digest()).decode().rstrip("=")
    payload = _b64(json.dumps(body).encode())
    return f"{header}.{payload}.{_b64(signer.sign(f'{header}.{payload}'.encode()))}"


def operator_mode(directory: Path) -> tuple[str, Path]:
    """(nats-server configuration lines, path of a user's credentials file)."""
    operator, account, user = (
        _keys(p) for p in (nkeys.PREFIX_BYTE_OPERATOR, nkeys.PREFIX_BYTE_ACCOUNT, nkeys.PREFIX_BYTE_USER)
    )
    unlimited = {
        "subs": -1,
        "data": -1,
        "payload": -1,
        "imports": -1,
        "exports": -1,
        "wildcards": True,
        "conn": -1,
        "leaf": -1,
    }
    operator_jwt = _jwt(
        {"sub": operator.public_key.decode(), "name": "op", "nats": {"type": "operator", "version": 2}}, operator
    )
    account_claims = {"limits": unlimited, "type": "account", "version": 2}
    account_jwt = _jwt({"sub": account.public_key.decode(), "name": "app", "nats": account_claims}, operator)
    user_claims = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2}
    user_jwt = _jwt({"sub": user.public_key.decode(), "name": "streaming", "nats": user_claims}, account)
    creds = directory / "user.creds"
    creds.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n"
    )
    preload = f"resolver_preload: {{\n  {account.public_key.decode()}: {account_jwt}\n}}\n"
    conf = f"operator: {operator_jwt}\nresolver: MEMORY\n{preload}"
    return conf, creds
