"""How `FX_` errors become HTTP responses: one status per code, one JSON shape.

Every error the web app sends is ``{"error": {"code": "FX_...", "message": "..."}}``.
The status comes from the exact code when it is listed here, else from the class:
bad input (`ValueError` / `FxInputError`) is 400, anything else 500.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Match

from fxengine.codes import Code
from fxengine.errors import FxError, FxInputError

logger = logging.getLogger("fxworker.web")

STATUS_BY_CODE: dict[str, int] = {
    Code.UNAUTHORIZED: 401,
    Code.WAKE_UNSIGNED: 401,
    Code.WAKE_SIGNATURE: 401,
    Code.WAKE_EXPIRED: 401,
    Code.FORBIDDEN: 403,
    Code.FORBIDDEN_HOST: 403,
    Code.FORBIDDEN_ORIGIN: 403,
    Code.UNKNOWN_SESSION: 404,
    Code.UNKNOWN_AGENT: 404,
    Code.SESSION_INCOMPLETE: 410,
    Code.NOT_FOUND: 404,
    Code.METHOD_NOT_ALLOWED: 405,
    Code.NOT_ACCEPTABLE: 406,
    Code.MESSAGE_ID_IN_USE: 409,
    Code.WAKE_REPLAYED: 409,
    Code.DECISION_UNKNOWN_CALL: 409,
    Code.DECISION_REPEATED: 409,
    Code.DECISION_EXPIRED: 409,
    Code.LIMIT_BODY: 413,
    Code.UNSUPPORTED_MEDIA_TYPE: 415,
    Code.LIMIT_QUEUE: 429,
    Code.CONFIG: 500,
    Code.ACK_UNSUPPORTED: 500,
    Code.INTERNAL: 500,
    Code.STORE_UNAVAILABLE: 503,
    Code.STORE_FULL: 503,
    Code.NO_AGENT: 503,
    Code.LIMIT_STREAMS: 503,
    Code.UPGRADE_IN_PROGRESS: 503,
}

_HTTP_CODES = {404: Code.NOT_FOUND, 405: Code.METHOD_NOT_ALLOWED, 406: Code.NOT_ACCEPTABLE}


def status_for(exc: FxError) -> int:
    """The HTTP status of an `FX_` error."""
    status = STATUS_BY_CODE.get(exc.code)
    if status is not None:
        return status
    if isinstance(exc, (FxInputError, ValueError)):
        return 400
    return 500


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code, "message": message}}


def error_response(
    code: str, message: str, status: int, *, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """A JSON error response; 401 says how to authenticate, 503 and a full steer queue
    (429 `FX_LIMIT_QUEUE`) say when to come back."""
    headers = dict(headers or {})
    if status == 401 and code == Code.UNAUTHORIZED:
        headers["WWW-Authenticate"] = "Bearer"
    if status == 503 or (status == 429 and code == Code.LIMIT_QUEUE):
        headers["Retry-After"] = "1"
    return JSONResponse(error_body(code, message), status_code=status, headers=headers)


def fx_error_response(exc: FxError) -> JSONResponse:
    return error_response(exc.code, exc.message, status_for(exc))


async def handle_fx_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FxError)
    status = status_for(exc)
    if status >= 500:
        logger.warning("%s %s failed: %s %s", request.method, request.url.path, exc.code, exc.message)
    return fx_error_response(exc)


def allowed_methods(request: Request) -> str:
    """Every method some route of the app takes at this path (the `Allow` of a 405).

    Starlette names only the methods of the first route that matched the path, and
    `/v1/sessions` is two routes (GET lists, POST creates).
    """
    methods: set[str] = set()
    for route in request.app.routes:
        match, _ = route.matches({**request.scope, "method": "\0"})
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


async def handle_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, Code.INVALID_REQUEST if exc.status_code < 500 else Code.INTERNAL)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = allowed_methods(request) or headers.get("Allow", "")
    return error_response(code, str(exc.detail), exc.status_code, headers=headers)


async def handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("%s %s failed", request.method, request.url.path)
    return error_response(Code.INTERNAL, "internal error", 500)


EXCEPTION_HANDLERS = {
    FxError: handle_fx_error,
    HTTPException: handle_http_error,
    Exception: handle_unexpected,
}
