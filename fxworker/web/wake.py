"""`POST /v1/wake`: the delivery handler for push queues, behind an HMAC-SHA256 signature.

A sender signs ``f"{timestamp}.".encode() + body`` with `FX_WAKE_SECRET` and sends

    X-Fx-Timestamp: <unix seconds>
    X-Fx-Signature: sha256=<hex digest>

(`sign_wake()` builds both). The server refuses an unsigned or wrongly signed body (401),
a timestamp more than `WINDOW_S` from its clock either way (401 `FX_WAKE_EXPIRED`), and a
signature it already took within that window (409 `FX_WAKE_REPLAYED`). Because the
timestamp is signed and old ones are refused, remembering signatures for `WINDOW_S` bounds
every replay. A signature is reserved before the handler runs and forgotten again when the
answer is 503, so the queue's redelivery of the same signed message is taken.

A wake carries no input (§7), so a replay that got through would only wake a session early.
Answers: 200 `{"outcome": "done" | "yielded" | "noop"}`; 200 `{"outcome": "refused"}` for a
session the store does not know (dropped: redelivering cannot help); 503 `FX_NO_AGENT` or
`FX_STORE_UNAVAILABLE` (deliver again).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import time
from typing import Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fxengine.codes import Code
from fxengine.errors import FxError
from fxworker import metrics
from fxworker.errors import FxConfigError, FxUnknownSessionError, FxWakeRefusedError
from fxworker.keys import wake_seen_key
from fxworker.store._transport import AsyncClient
from fxworker.store._boundary import map_redis_errors

from .bodies import WakeBody, parse_body, read_body
from .errors import error_body, fx_error_response

WINDOW_S = 300.0
TIMESTAMP_HEADER = "x-fx-timestamp"
SIGNATURE_HEADER = "x-fx-signature"


def sign_wake(body: bytes, secret: str, *, now_s: float | None = None) -> dict[str, str]:
    """The headers that sign `body` for `POST /v1/wake`."""
    timestamp = str(int(time.time() if now_s is None else now_s))
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {"X-Fx-Timestamp": timestamp, "X-Fx-Signature": f"sha256={digest}"}


def verify_wake(body: bytes, *, timestamp: str | None, signature: str | None, secret: str, now_s: float) -> str:
    """Check one signed body; return the signature (the replay key) or raise `FxWakeRefusedError`."""
    if not timestamp or not signature:
        raise FxWakeRefusedError("wake is not signed: X-Fx-Timestamp and X-Fx-Signature are required", code=Code.WAKE_UNSIGNED)
    try:
        sent_s = int(timestamp)
    except ValueError:
        raise FxWakeRefusedError("X-Fx-Timestamp is not unix seconds", code=Code.WAKE_SIGNATURE) from None
    expected = sign_wake(body, secret, now_s=sent_s)["X-Fx-Signature"]
    if not hmac.compare_digest(signature.encode(), expected.encode()):
        raise FxWakeRefusedError("wake signature does not match the body", code=Code.WAKE_SIGNATURE)
    if abs(now_s - sent_s) > WINDOW_S:
        raise FxWakeRefusedError(f"wake timestamp is more than {int(WINDOW_S)} s from this server's clock", code=Code.WAKE_EXPIRED)
    return signature


class ReplayGuard(Protocol):
    """Remembers signatures for a window; shared by every web process when it lives in Redis."""

    async def reserve(self, signature: str, window_s: float) -> bool: ...

    async def forget(self, signature: str) -> None: ...


class MemoryReplayGuard:
    """Signatures seen by this process (the embedded default, or no Redis client)."""

    def __init__(self) -> None:
        self._seen_until_s: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<MemoryReplayGuard seen={len(self._seen_until_s)}>"

    async def reserve(self, signature: str, window_s: float) -> bool:
        now_s = time.monotonic()
        for key in [k for k, until in self._seen_until_s.items() if until <= now_s]:
            del self._seen_until_s[key]
        if signature in self._seen_until_s:
            return False
        self._seen_until_s[signature] = now_s + window_s
        return True

    async def forget(self, signature: str) -> None:
        self._seen_until_s.pop(signature, None)


class RedisReplayGuard:
    """Signatures seen by any web process: `SET NX PX` on one key per signature."""

    def __init__(self, client: AsyncClient, *, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def __repr__(self) -> str:
        return f"<RedisReplayGuard prefix={self.prefix}>"

    def key(self, signature: str) -> str:
        return wake_seen_key(self.prefix, signature)

    async def reserve(self, signature: str, window_s: float) -> bool:
        # Redis down is 503 (the queue delivers again), its address left out of the message.
        with map_redis_errors():
            return bool(await self.client.set(self.key(signature), b"1", nx=True, px=int(window_s * 2000)))

    async def forget(self, signature: str) -> None:
        with map_redis_errors():
            await self.client.delete(self.key(signature))


async def _deliver(payload: dict[str, object]) -> str:
    from fxworker.delivery import handle_wake

    if inspect.iscoroutinefunction(handle_wake):
        return str(await handle_wake(payload))
    # The handler blocks until its turn is done or yielded: keep the event loop free.
    return str(await asyncio.to_thread(handle_wake, payload))


async def wake(request: Request) -> Response:
    """`POST /v1/wake`: verify, reserve the signature, run the delivery handler."""
    secret: str | None = request.app.state.settings.wake_secret
    if not secret:
        return fx_error_response(FxConfigError("POST /v1/wake needs FX_WAKE_SECRET on this server"))
    body = await read_body(request)
    signature = verify_wake(
        body,
        timestamp=request.headers.get(TIMESTAMP_HEADER),
        signature=request.headers.get(SIGNATURE_HEADER),
        secret=secret,
        now_s=time.time(),
    )
    guard: ReplayGuard = request.app.state.replay_guard
    if not await guard.reserve(signature, WINDOW_S):
        raise FxWakeRefusedError("this signed wake was already taken", code=Code.WAKE_REPLAYED)
    try:
        wake_body = parse_body(body, WakeBody)
        outcome = await _deliver(wake_body.model_dump(by_alias=True, exclude_none=True))
    except FxUnknownSessionError as exc:
        metrics.WAKES.labels(outcome="refused").inc()
        return JSONResponse({"outcome": "refused", **error_body(exc.code, exc.message)})
    except FxError as exc:
        metrics.WAKES.labels(outcome="error").inc()
        if exc.code in (Code.NO_AGENT, Code.STORE_UNAVAILABLE, Code.STORE_FULL):
            # The queue delivers this message again: let the same signature through then.
            await guard.forget(signature)
        raise
    metrics.WAKES.labels(outcome=outcome).inc()
    return JSONResponse({"outcome": outcome})
