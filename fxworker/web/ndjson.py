"""NDJSON responses: one compact JSON object a line, streamed as it is produced.

Built on starlette's `StreamingResponse`, which stops the producer when the client
disconnects. A failure after the first byte cannot change the status any more, so it is
sent as a last `session_error` line before the stream closes.

A stream that follows a session holds one store connection nearly all the time (its
reads block in Redis until a line comes), so a web process serves at most
`StreamSlots.limit` of them at once; one more is refused with 503 `FX_LIMIT_STREAMS`
before anything is stored, and the store's pool keeps connections for everything else.
A bound rather than polling: a poll per follower every few hundred ms would cost Redis
work in proportion to idle readers, where a blocked read costs none.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Mapping

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from fxengine.errors import FxError
from fxengine.lines import session_error

from fxworker.errors import FxStreamsFullError

MEDIA_TYPE = "application/x-ndjson"

logger = logging.getLogger("fxworker.web")


def encode_line(line: Mapping[str, object]) -> bytes:
    """One stream line as NDJSON bytes (compact, UTF-8, with its newline)."""
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


async def _encoded(lines: AsyncIterable[Mapping[str, object] | bytes]) -> AsyncIterator[bytes]:
    try:
        async for line in lines:
            if isinstance(line, (bytes, bytearray)):
                yield bytes(line) if line.endswith(b"\n") else bytes(line) + b"\n"
            else:
                yield encode_line(line)
    except FxError as exc:
        logger.warning("stream ended by %s: %s", exc.code, exc.message)
        yield encode_line(session_error(None, {"code": exc.code, "message": exc.message}, None))


class StreamSlot:
    """One taken place among a process's open streams; `release()` gives it back (once)."""

    __slots__ = ("_slots", "_held")

    def __init__(self, slots: StreamSlots) -> None:
        self._slots = slots
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots.open -= 1


class StreamSlots:
    """At most `limit` NDJSON streams open at once in this process (one event loop)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the stream limit must be at least 1, got {limit}")
        self.limit = limit
        self.open = 0

    def __repr__(self) -> str:
        return f"<StreamSlots open={self.open} limit={self.limit}>"

    def take(self) -> StreamSlot:
        """A slot, or `FX_LIMIT_STREAMS` (503) when `limit` streams are open."""
        if self.open >= self.limit:
            raise FxStreamsFullError(
                f"this server has {self.open} streams open, its limit: try again shortly or on another web process"
            )
        self.open += 1
        return StreamSlot(self)


def wants_ndjson(accept: str | None) -> bool:
    """Whether an `Accept` header asks for the streamed turn instead of the 202 JSON answer."""
    return bool(accept) and MEDIA_TYPE in (accept or "")


class NDJSONResponse(StreamingResponse):
    """A streamed NDJSON body from an async iterable of line dicts (or already-encoded lines)."""

    media_type = MEDIA_TYPE

    def __init__(
        self,
        lines: AsyncIterable[Mapping[str, object] | bytes],
        *,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        slot: StreamSlot | None = None,
    ) -> None:
        merged = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", **(headers or {})}
        super().__init__(_encoded(lines), status_code=status_code, headers=merged, media_type=MEDIA_TYPE)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.slot is not None:
                self.slot.release()
