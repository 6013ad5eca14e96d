"""Who may call the web app: a bearer token (`FX_API_TOKEN`) and the embedder's `authorize` hook.

`BearerAuth` is a small pure-ASGI middleware. With a token set it requires
``Authorization: Bearer <token>`` on the API (`/v1/...` except `/v1/wake`, which is signed
instead, and `/metrics`); the page, its files and `/healthz` stay open. With no token and
no `authorize` hook it serves loopback clients of a loopback-bound server only: the built-in
app must not run open on a public address. Being on loopback is not enough then, since any
web page the user opens can send requests to 127.0.0.1: the API also refuses (403) a `Host`
that is not a loopback name (a DNS-rebinding page sends its own host name) and an `Origin`
that is not a loopback origin (a cross-site page's request).

In every mode a request to the API that carries a body must say
`Content-Type: application/json` (415 otherwise): a cross-site page can send a
`text/plain` or form body without asking, but not a JSON one (the browser first asks the
server with a CORS preflight, which this app does not answer). Two `Authorization` headers
are refused (400) in every mode: the middleware and a hook must not read different ones.

With an `authorize` hook (cookies, say: credentials a browser attaches by itself) every
POST must say `Content-Type: application/json` even without a body (a body-less form POST
from another site would otherwise cancel a turn), and a request whose `Origin` is not the
server's own (`Host`) nor one of `allowed_origins` (`FX_ALLOWED_ORIGINS`) is refused 403
`FX_FORBIDDEN_ORIGIN`.

`authorize(request, session_id, action)` is called by each route, after the token check,
with `session_id` None for a new session or a listing. `action` is one of `ACTIONS`. It
returns (or resolves to) True to allow; False is answered with 403 `FX_FORBIDDEN`.
"""

from __future__ import annotations

import hmac
import inspect
import ipaddress
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from fxworker.errors import FxForbiddenError

from fxengine.codes import Code

from .errors import error_response

if TYPE_CHECKING:
    from .bodies import CreateSessionBody

# `timeline` is asked for the timeline route alone: it shows the prompts' text, which a
# hook allowing `state` (status, cursor, counts) did not agree to show.
ACTIONS = ("create", "prompt", "steer", "cancel", "stream", "state", "timeline", "list", "metrics")


class Authorize(Protocol):
    """The embedder's access check; may be a plain function or a coroutine function."""

    def __call__(self, request: Request, session_id: str | None, action: str) -> bool | Awaitable[bool]: ...


class SessionContext(Protocol):
    """The embedder's choice of a new session's tool context (`create_app(session_context=)`)."""

    def __call__(self, request: Request, create: CreateSessionBody) -> object: ...


class SessionIdHook(Protocol):
    """The embedder's say on a create that names its session (`create_app(client_session_ids=)`)."""

    def __call__(self, request: Request, session_id: str) -> bool | Awaitable[bool]: ...


ClientSessionIds = bool | SessionIdHook


async def check_session_id(request: Request, session_id: str) -> None:
    """`FxForbiddenError` unless this server lets a client name the session it creates
    (`create_app(client_session_ids=)`; by default only where no `authorize` hook runs)."""
    rule = request.app.state.client_session_ids
    if rule is None:
        allowed: object = request.app.state.authorize is None
    elif isinstance(rule, bool):
        allowed = rule
    else:
        allowed = rule(request, session_id)
        if inspect.isawaitable(allowed):
            allowed = await allowed
    if allowed is not True:
        raise FxForbiddenError("this server does not let a client name its sessions: send no sessionId "
                               "(the embedder passes create_app(client_session_ids=...) to allow it)")


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


def _host_name(host_header: str) -> str:
    """The name of a `Host` header without its port (`[::1]:8000` -> `::1`)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() else host


def is_loopback_host(host_header: str | None) -> bool:
    """Whether a `Host` header names this machine: `localhost`, `127.0.0.1`, `[::1]`, any port."""
    return bool(host_header) and is_loopback(_host_name(host_header or "").rstrip("."))


def is_loopback_origin(origin: str) -> bool:
    """Whether an `Origin` header is a page served from this machine (http or https)."""
    try:
        parts = urlsplit(origin.strip())
        hostname = parts.hostname
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and is_loopback(hostname)


def _protected(path: str) -> bool:
    return (path.startswith("/v1/") and path != "/v1/wake") or path == "/metrics"


def _has_body(headers: dict[bytes, bytes]) -> bool:
    return headers.get(b"content-length", b"0").strip() not in (b"0", b"") or b"transfer-encoding" in headers


def _is_json(content_type: bytes | None) -> bool:
    return content_type is not None and content_type.split(b";", 1)[0].strip().lower() == b"application/json"


class BearerAuth:
    """Pure-ASGI middleware: the bearer token on the API, or loopback only when there is none."""

    def __init__(self, app: ASGIApp, *, token: str | None, open_off_loopback: bool = False,
                 allowed_origins: tuple[str, ...] = ()) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None
        self.open_off_loopback = open_off_loopback
        self.allowed_origins = {o.rstrip("/").lower() for o in allowed_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        if sum(1 for name, _ in scope["headers"] if name == b"authorization") > 1:
            await error_response(Code.INVALID_REQUEST, "more than one Authorization header", 400)(scope, receive, send)
            return
        headers = dict(scope["headers"])
        refused = self._refusal(scope, headers)
        hook_post = self.expected is None and self.open_off_loopback and scope["method"] == "POST"
        if refused is None and hook_post:
            refused = self._cross_site(headers)
        if refused is None and (_has_body(headers) or hook_post) and not _is_json(headers.get(b"content-type")):
            given = headers.get(b"content-type", b"").decode("latin-1") or "none"
            refused = error_response(
                Code.UNSUPPORTED_MEDIA_TYPE, f"request bodies are JSON: send Content-Type: application/json (got {given})", 415
            )
        if refused is not None:
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[bytes, bytes]) -> Response | None:
        """The response refusing this request, or None to let it through."""
        if self.expected is not None:
            given = headers.get(b"authorization", b"")
            if hmac.compare_digest(given, self.expected):
                return None
            return error_response(Code.UNAUTHORIZED, "missing bearer token" if not given else "wrong bearer token", 401)
        if self.open_off_loopback:
            return None  # the embedder's authorize hook decides
        if not self._loopback_only(scope):
            return error_response(
                Code.CONFIG, "this server is not on loopback: set FX_API_TOKEN (or pass authorize=) to serve the API", 403
            )
        if scope.get("server") is None:
            return None  # an in-process ASGI call: no browser can reach it
        host = headers.get(b"host", b"").decode("latin-1")
        if not is_loopback_host(host):
            return error_response(
                Code.FORBIDDEN_HOST,
                f"without FX_API_TOKEN this server answers requests addressed to localhost, 127.0.0.1 or [::1] only, "
                f"not {host or 'no Host'!r}",
                403,
            )
        origin = headers.get(b"origin")
        if origin is not None and not is_loopback_origin(origin.decode("latin-1")):
            return error_response(
                Code.FORBIDDEN_ORIGIN,
                f"without FX_API_TOKEN this server answers pages served from this machine only, not {origin.decode('latin-1')!r}",
                403,
            )
        return None

    def _cross_site(self, headers: dict[bytes, bytes]) -> Response | None:
        """Hook mode: a POST from a page of another site (an `Origin` that is neither this
        server's `Host` nor an allowed origin) is refused."""
        origin = headers.get(b"origin")
        if origin is None:
            return None  # not sent by a browser's cross-site request (the JSON check still applies)
        given = origin.decode("latin-1").strip().rstrip("/").lower()
        host = headers.get(b"host", b"").decode("latin-1").strip().lower()
        if given in self.allowed_origins or urlsplit(given).netloc == host:
            return None
        return error_response(
            Code.FORBIDDEN_ORIGIN,
            f"this server does not take requests from pages of {given!r}: list it in FX_ALLOWED_ORIGINS "
            "(create_app(allowed_origins=...)) if it should",
            403,
        )

    @staticmethod
    def _loopback_only(scope: Scope) -> bool:
        server = scope.get("server")
        client = scope.get("client")
        # An in-process ASGI call has no socket: nothing reaches it from outside.
        if server is None:
            return True
        return is_loopback(server[0]) and (client is None or is_loopback(client[0]))


async def is_allowed(request: Request, session_id: str | None, action: str) -> bool:
    """What the app's `authorize` hook answers (True with no hook)."""
    hook: Callable[..., bool | Awaitable[bool]] | None = request.app.state.authorize
    if hook is None:
        return True
    allowed = hook(request, session_id, action)
    if inspect.isawaitable(allowed):
        allowed = await allowed
    return bool(allowed)


async def check_access(request: Request, session_id: str | None, action: str) -> None:
    """Run the app's `authorize` hook, if any; raise `FxForbiddenError` when it refuses."""
    if not await is_allowed(request, session_id, action):
        target = f"session {session_id}" if session_id else "this server"
        raise FxForbiddenError(f"not allowed to {action} on {target}")
