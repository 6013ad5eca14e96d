"""Who may call the web app: a bearer token (`FX_API_TOKEN`) and the embedder's `authorize` hook.

`BearerAuth` is a small pure-ASGI middleware. With a token set it requires
``Authorization: Bearer <token>`` on the API (`/v1/...` except `/v1/wake`, which is signed
instead, and `/metrics`); the page, its files and `/healthz` stay open. With no token and
no `authorize` hook it serves loopback clients of a loopback-bound server only: the built-in
app must not run open on a public address.

`authorize(request, session_id, action)` is called by each route, after the token check,
with `session_id` None for a new session or a listing. `action` is one of `ACTIONS`. It
returns (or resolves to) True to allow; False is answered with 403 `FX_FORBIDDEN`.
"""

from __future__ import annotations

import hmac
import inspect
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Protocol

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from fxworker.errors import FxForbiddenError

from .errors import error_response

ACTIONS = ("create", "prompt", "steer", "cancel", "stream", "state", "list")


class Authorize(Protocol):
    """The embedder's access check; may be a plain function or a coroutine function."""

    def __call__(self, request: Request, session_id: str | None, action: str) -> bool | Awaitable[bool]: ...


def is_loopback(host: str | None) -> bool:
    """Whether `host` (an address or `localhost`) is this machine only."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _protected(path: str) -> bool:
    return (path.startswith("/v1/") and path != "/v1/wake") or path == "/metrics"


class BearerAuth:
    """Pure-ASGI middleware: the bearer token on the API, or loopback only when there is none."""

    def __init__(self, app: ASGIApp, *, token: str | None, open_off_loopback: bool = False) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None
        self.open_off_loopback = open_off_loopback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self.expected is None:
            if self.open_off_loopback or self._loopback_only(scope):
                await self.app(scope, receive, send)
                return
            response = error_response(
                "FX_CONFIG", "this server is not on loopback: set FX_API_TOKEN (or pass authorize=) to serve the API", 403
            )
            await response(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        message = "missing bearer token" if not given else "wrong bearer token"
        await error_response("FX_UNAUTHORIZED", message, 401)(scope, receive, send)

    @staticmethod
    def _loopback_only(scope: Scope) -> bool:
        server = scope.get("server")
        client = scope.get("client")
        # An in-process ASGI call has no socket: nothing reaches it from outside.
        if server is None:
            return True
        return is_loopback(server[0]) and (client is None or is_loopback(client[0]))


async def check_access(request: Request, session_id: str | None, action: str) -> None:
    """Run the app's `authorize` hook, if any; raise `FxForbiddenError` when it refuses."""
    hook: Callable[..., bool | Awaitable[bool]] | None = request.app.state.authorize
    if hook is None:
        return
    allowed = hook(request, session_id, action)
    if inspect.isawaitable(allowed):
        allowed = await allowed
    if not allowed:
        target = f"session {session_id}" if session_id else "this server"
        raise FxForbiddenError(f"not allowed to {action} on {target}")
