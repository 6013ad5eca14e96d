"""NDJSON responses: one compact JSON object a line, streamed as it is produced.

Built on starlette's `StreamingResponse`, which stops the producer when the client
disconnects. A failure after the first byte cannot change the status any more, so it is
sent as a last `session_error` line before the stream closes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

from starlette.responses import StreamingResponse

from fxengine.errors import FxError

MEDIA_TYPE = "application/x-ndjson"

logger = logging.getLogger("fxworker.web")


def encode_line(line: Mapping[str, Any]) -> bytes:
    """One stream line as NDJSON bytes (compact, UTF-8, with its newline)."""
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


async def _encoded(lines: AsyncIterable[Mapping[str, Any] | bytes]) -> AsyncIterator[bytes]:
    try:
        async for line in lines:
            if isinstance(line, (bytes, bytearray)):
                yield bytes(line) if line.endswith(b"\n") else bytes(line) + b"\n"
            else:
                yield encode_line(line)
    except FxError as exc:
        logger.warning("stream ended by %s: %s", exc.code, exc.message)
        yield encode_line({"type": "session_error", "code": exc.code, "message": exc.message})


def wants_ndjson(accept: str | None) -> bool:
    """Whether an `Accept` header asks for the streamed turn instead of the 202 JSON answer."""
    return bool(accept) and MEDIA_TYPE in (accept or "")


class NDJSONResponse(StreamingResponse):
    """A streamed NDJSON body from an async iterable of line dicts (or already-encoded lines)."""

    media_type = MEDIA_TYPE

    def __init__(
        self,
        lines: AsyncIterable[Mapping[str, Any] | bytes],
        *,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        merged = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", **(headers or {})}
        super().__init__(_encoded(lines), status_code=status_code, headers=merged, media_type=MEDIA_TYPE)
