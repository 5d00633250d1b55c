"""The console's guards: where it may bind, the access token, and CSRF on every POST.

* Bound to a loopback address by default; any other address requires a token
  (``LOOM_CONSOLE_TOKEN``), compared in constant time.
* With a token, every request carries it: ``Authorization: Bearer <token>`` (scripts) or the
  ``loom_console_token`` cookie that ``/?token=<token>`` sets once (people, in a browser).
* Every state-changing request is a POST that carries a CSRF token: HMAC(secret, the random
  ``loom_csrf`` cookie), as a form field or an ``X-CSRF-Token`` header. A request
  authenticated by an ``Authorization`` header is exempt: browsers never add that header on
  their own, so a forged cross-site request cannot carry it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loom.errors import ConfigurationError, LoomError

__all__ = ["CSRF_COOKIE", "TOKEN_COOKIE", "ConsoleConfig", "CsrfError", "TokenMiddleware"]

TOKEN_COOKIE = "loom_console_token"
CSRF_COOKIE = "loom_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"


class CsrfError(LoomError):
    """A state-changing request without a valid CSRF token (a forged or stale form)."""

    code = "csrf"
    default_hint = "Reload the page and submit the form again; nothing was changed"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(slots=True)
class ConsoleConfig:
    """How the console is exposed. ``token`` defaults to ``LOOM_CONSOLE_TOKEN`` in the CLI."""

    host: str = "127.0.0.1"
    token: str | None = None
    #: Signs CSRF tokens; random per process (a restart invalidates open forms, on purpose).
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    #: Host headers accepted besides the bound host (DNS-rebinding guard).
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1", "[::1]")

    def check_binding(self) -> None:
        """Refuse to serve a non-loopback address without a token."""
        if not is_loopback(self.host) and not self.token:
            raise ConfigurationError(
                f"binding the console to {self.host} exposes every execution and its gates: "
                "set LOOM_CONSOLE_TOKEN to a long random secret first",
                hint="Or bind to 127.0.0.1 (the default) and reach it through an SSH tunnel",
            )
        if self.token is not None and len(self.token) < 16:
            raise ConfigurationError("LOOM_CONSOLE_TOKEN must be at least 16 characters long")

    def token_ok(self, presented: str | None) -> bool:
        if self.token is None:
            return True
        if not presented:
            return False
        return hmac.compare_digest(presented.encode(), self.token.encode())

    def csrf_for(self, cookie: str) -> str:
        return hmac.new(self.secret, cookie.encode(), hashlib.sha256).hexdigest()


def _bearer(conn: HTTPConnection) -> str | None:
    auth = conn.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def wants_json(scope: Scope) -> bool:
    return str(scope.get("path", "")).startswith("/api")


class TokenMiddleware:
    """Checks the access token and hands every browser a CSRF cookie."""

    def __init__(self, app: ASGIApp, config: ConsoleConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        config = self.config
        bearer = _bearer(conn)
        query_token = conn.query_params.get("token")
        if config.token is not None:
            if query_token is not None and config.token_ok(query_token):
                # Trade the token in the URL for a cookie, and drop it from the address bar.
                rest = urlencode(
                    [(k, v) for k, v in parse_qsl(scope["query_string"].decode()) if k != "token"]
                )
                target = scope["path"] + (f"?{rest}" if rest else "")
                response: Response = RedirectResponse(target, status_code=303)
                response.set_cookie(TOKEN_COOKIE, query_token, httponly=True, samesite="strict")
                await response(scope, receive, send)
                return
            presented = bearer if bearer is not None else conn.cookies.get(TOKEN_COOKIE)
            if not config.token_ok(presented):
                await _unauthorized(scope, receive, send)
                return
        scope.setdefault("state", {})
        scope["state"]["header_auth"] = bearer is not None and config.token is not None
        cookie = conn.cookies.get(CSRF_COOKIE)
        fresh = cookie is None or len(cookie) != 43
        if fresh:
            cookie = secrets.token_urlsafe(32)
        scope["state"]["csrf_cookie"] = cookie
        scope["state"]["csrf_token"] = config.csrf_for(str(cookie))

        async def send_with_cookie(message: Message) -> None:
            if fresh and message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                value = f"{CSRF_COOKIE}={cookie}; HttpOnly; SameSite=Strict; Path=/"
                headers.append((b"set-cookie", value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_cookie)


async def _unauthorized(scope: Scope, receive: Receive, send: Send) -> None:
    message = "this console needs its token: open /?token=<LOOM_CONSOLE_TOKEN> once"
    response: Response
    if wants_json(scope):
        response = JSONResponse(
            {"error": {"type": "Unauthorized", "code": "unauthorized", "message": message}},
            status_code=401,
        )
    else:
        response = PlainTextResponse(message, status_code=401)
    response.headers["www-authenticate"] = "Bearer"
    await response(scope, receive, send)


async def check_csrf(request: Request, form: Any = None) -> None:
    """Raise :class:`CsrfError` unless the POST carries this browser's CSRF token."""
    if request.state.header_auth:
        return
    presented = request.headers.get(CSRF_HEADER)
    if presented is None and form is not None:
        value = form.get(CSRF_FIELD)
        presented = value if isinstance(value, str) else None
    cookie = request.cookies.get(CSRF_COOKIE)
    config: ConsoleConfig = request.app.state.config
    if (
        not presented
        or not cookie
        or not hmac.compare_digest(presented.encode(), config.csrf_for(cookie).encode())
    ):
        raise CsrfError("this request carries no valid CSRF token; it was refused")
