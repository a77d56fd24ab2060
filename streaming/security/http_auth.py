"""Credentials on the client-facing HTTP listener (CometD and pull API): the NATS port's users or
token, given as HTTP Basic (`user:password`) or as a bearer token, checked by Starlette's
AuthenticationMiddleware with this backend. Missing or wrong credentials get 401 with a
`WWW-Authenticate` challenge; a bcrypt check runs on a worker thread, as on the NATS port."""

from __future__ import annotations

import base64
import binascii
import logging

import trio
from starlette.authentication import AuthCredentials, AuthenticationBackend, AuthenticationError, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response

from streaming.security.auth import Authenticator
from streaming.security.permissions import Compiled

log = logging.getLogger(__name__)
CHALLENGE = 'Basic realm="streaming", charset="UTF-8", Bearer realm="streaming"'


class CredentialsBackend(AuthenticationBackend):
    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser]:
        options = _options(conn.headers.get("authorization", ""))
        if self.auth.needs_thread(options):
            user = await trio.to_thread.run_sync(self.auth.check, options)
        else:
            user = self.auth.check(options)
        if user is None:
            client = conn.client.host if conn.client else "?"
            log.info("HTTP request from %s refused: %s", client, "bad credentials" if options else "no credentials")
            raise AuthenticationError("credentials required" if not options else "bad credentials")
        return AuthCredentials(["authenticated"]), SimpleUser(user)


def _options(header: str) -> dict[str, str]:
    """The CONNECT options an Authorization header stands for ({}: none usable)."""
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return {"auth_token": value}
    if scheme.lower() == "basic" and value:
        try:
            user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return {}
        if sep:
            return {"user": user, "pass": password}
    return {}


def permissions_of(request: HTTPConnection, auth: Authenticator) -> Compiled | None:
    """The permissions of the request's user (None: anything, or no credentials are asked for)."""
    if not auth.restricts or "user" not in request.scope:
        return None
    return auth.permissions(request.user.display_name)


def _refused(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    return JSONResponse({"error": "unauthorized", "detail": str(exc)}, 401, {"WWW-Authenticate": CHALLENGE})


def middleware(auth: Authenticator) -> list[Middleware]:
    """What a Starlette app needs to ask for these credentials (nothing when none are configured)."""
    if not auth.required:
        return []
    return [Middleware(AuthenticationMiddleware, backend=CredentialsBackend(auth), on_error=_refused)]
