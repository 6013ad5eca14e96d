"""`GET /healthz` (liveness, with a Redis round trip) and `GET /metrics` (Prometheus text)."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fxworker import metrics
from fxworker.store._boundary import closed_connection, describe_redis_error

from fxengine.codes import Code

from .auth import check_access
from .errors import error_response

PING_TIMEOUT_S = 2.0


async def healthz(request: Request) -> Response:
    """200 `{"ok": true, "store": "redis"|"cluster"|"sentinel"|"embedded", "pingMs"}` when the
    store answers, else 503."""
    client = request.app.state.redis
    url = request.app.state.settings.store_url
    if client is None and url:
        # Mounted in another app (app.mount("/fx", create_app(...))), whose lifespan does not
        # run the mounted one's: the client is made on first use instead.
        from fxworker.store import store_clients, store_kind

        request.app.state.store_kind = await asyncio.to_thread(store_kind, url)
        client = request.app.state.redis = store_clients(url, socket_timeout_s=5.0)[0]()
    if client is None:
        return JSONResponse({"ok": True, "store": "embedded"})
    started_s = time.perf_counter()
    try:
        try:
            await asyncio.wait_for(client.ping(), timeout=PING_TIMEOUT_S)
        except Exception as exc:
            if not closed_connection(exc):
                raise
            # A pooled connection Redis closed is not Redis down: once more, on a fresh one.
            await asyncio.wait_for(client.ping(), timeout=PING_TIMEOUT_S)
    except Exception as exc:  # any failure to answer means "not healthy", whatever raised it
        return error_response(Code.STORE_UNAVAILABLE, f"Redis did not answer: {describe_redis_error(exc)}", 503)
    ping_ms = round((time.perf_counter() - started_s) * 1000, 2)
    kind = getattr(request.app.state, "store_kind", "redis")
    return JSONResponse({"ok": True, "store": kind, "pingMs": ping_ms})


async def metrics_text(request: Request) -> Response:
    """This process's metrics in the Prometheus text format; under an `authorize` hook, only
    for callers it allows `metrics` (with `FX_API_TOKEN`, the token guards it)."""
    await check_access(request, None, "metrics")
    return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)
