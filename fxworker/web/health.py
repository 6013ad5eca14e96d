"""`GET /healthz` (the store answers and takes writes) and `GET /metrics` (Prometheus text)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.exceptions import ResponseError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fxworker import metrics
from fxworker.store._boundary import closed_connection, describe_redis_error
from fxworker.store.preflight import cluster_refusal, write_refusal

from fxengine.codes import Code

from .auth import check_access
from .errors import error_response

PING_TIMEOUT_S = 2.0
WRITABLE_TTL_S = 1.0  # how long one reading of whether the store takes writes answers /healthz


async def healthz(request: Request) -> Response:
    """200 `{"ok": true, "store": "redis"|"cluster"|"sentinel"|"local"|"embedded", "pingMs"}` when the
    store answers and takes writes; else 503 `FX_STORE_UNAVAILABLE`: no answer, a read-only
    replica, a primary short of its `min-replicas-to-write`, a cluster that is down."""
    client = request.app.state.redis
    url = request.app.state.settings.store_url
    if client is None and url:
        # Mounted in another app (app.mount("/fx", create_app(...))), whose lifespan does not
        # run the mounted one's: the client is made on first use instead.
        from fxworker.store import store_clients, store_kind

        request.app.state.store_kind = await asyncio.to_thread(store_kind, url)
        client = request.app.state.redis = store_clients(url, socket_timeout_s=5.0)[0]()
    if client is None:
        return await _local_health(request)
    kind = getattr(request.app.state, "store_kind", "redis")
    started_s = time.perf_counter()
    try:
        try:
            await asyncio.wait_for(client.ping(), timeout=PING_TIMEOUT_S)
        except Exception as exc:
            if not closed_connection(exc):
                raise
            # A pooled connection Redis closed is not Redis down: once more, on a fresh one.
            await asyncio.wait_for(client.ping(), timeout=PING_TIMEOUT_S)
        ping_ms = round((time.perf_counter() - started_s) * 1000, 2)
        refusal = await _cached_refusal(request, client, kind)
    except Exception as exc:  # any failure to answer means "not healthy", whatever raised it
        return error_response(Code.STORE_UNAVAILABLE, f"Redis did not answer: {describe_redis_error(exc)}", 503)
    if refusal is not None:
        return error_response(Code.STORE_UNAVAILABLE, refusal, 503)
    return JSONResponse({"ok": True, "store": kind, "pingMs": ping_ms})


async def _local_health(request: Request) -> Response:
    """With no store URL: the local store's server answers PING on its socket (`"local"`),
    or the in-memory store, which always does (`"embedded"`)."""
    from fxworker.store import _local_server, local

    settings = request.app.state.settings
    directory = local.data_dir(settings)
    if directory is None or local.server_binary() is None:
        return JSONResponse({"ok": True, "store": "embedded"})
    started_s = time.perf_counter()
    try:
        reply = await asyncio.to_thread(_local_server.command, local.socket_path(directory), "PING",
                                        timeout_s=PING_TIMEOUT_S)
    except OSError as exc:
        return error_response(Code.STORE_UNAVAILABLE, f"the local store's server did not answer: {exc}", 503)
    if not reply.startswith(b"+PONG"):
        return error_response(Code.STORE_UNAVAILABLE, f"the local store's server answered {reply[:60]!r}", 503)
    return JSONResponse({"ok": True, "store": "local", "pingMs": round((time.perf_counter() - started_s) * 1000, 2)})


async def _cached_refusal(request: Request, client: Any, kind: str) -> str | None:
    """`_refusal`, read at most once per `WRITABLE_TTL_S` per app: a load balancer's probes
    cost a ping each, not an INFO each."""
    state = request.app.state
    checked_s, refusal = getattr(state, "store_refusal", (float("-inf"), None))
    now_s = time.monotonic()
    if now_s - checked_s >= WRITABLE_TTL_S:
        refusal = await _refusal(client, kind)
        state.store_refusal = (now_s, refusal)
    return refusal


async def _refusal(client: Any, kind: str) -> str | None:
    """Why the store refuses writes now (store/preflight.py reads the answers), or None.
    Reads only: `CLUSTER INFO` of each primary of a cluster, else `INFO replication` (and
    `CONFIG GET min-replicas-to-write` where that is on)."""
    if kind == "cluster":
        return await _cluster_refusal(client)
    info = await asyncio.wait_for(client.info("replication"), timeout=PING_TIMEOUT_S)
    needed: int | None = None
    if "min_slaves_good_slaves" in info:
        try:
            config = await asyncio.wait_for(client.config_get("min-replicas-to-write"), timeout=PING_TIMEOUT_S)
            needed = int(config.get("min-replicas-to-write", 0) or 0)
        except ResponseError:
            needed = None  # CONFIG disabled (managed Redis): only "none in reach" is known
    return write_refusal(info, min_replicas_to_write=needed)


async def _cluster_refusal(client: Any) -> str | None:
    """`cluster_refusal` of the first primary that says the cluster is down. Each node keeps
    its own `cluster_state`, and a command sent to one that says fail is refused, so any one
    is enough; a primary that does not answer is skipped (the others mark its slots lost
    once the node timeout passes), all of them not answering is the store down."""
    primaries = client.get_primaries()
    replies = await asyncio.gather(
        *(asyncio.wait_for(node.execute_command("CLUSTER INFO"), timeout=PING_TIMEOUT_S) for node in primaries),
        return_exceptions=True,
    )
    answers = [r for r in replies if isinstance(r, dict)]
    for answer in answers:
        down = cluster_refusal(answer)
        if down is not None:
            return down
    if not answers and replies:
        error = next(r for r in replies if isinstance(r, BaseException))
        return f"no primary of the Redis Cluster answered: {describe_redis_error(error)}"
    return None


async def metrics_text(request: Request) -> Response:
    """This process's metrics in the Prometheus text format (a web process's own, unless it
    runs turns too); under an `authorize` hook, only for callers it allows `metrics` (with
    `FX_API_TOKEN`, the token guards it)."""
    await check_access(request, None, "metrics")
    from fxworker.embedded import embedded_workers

    # A process that also runs turns (`fx dev`, an app with embedded workers) counts them too.
    names = None if embedded_workers() else metrics.WEB_METRICS
    return Response(metrics.render(names), media_type=metrics.CONTENT_TYPE)
