"""Request bodies: read with an 8 MiB cap before anything parses them, then validated by pydantic.

A body is refused with 413 (`FX_LIMIT_BODY`) as soon as its `Content-Length` or the bytes
received so far pass the cap, so an oversized body is never buffered whole nor parsed.
Field names are the camelCase of the wire (`messageId`); unknown fields are refused.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request

from fxworker.errors import FxBodyTooLargeError, FxInvalidRequestError

MAX_BODY_BYTES = 8 * 1024 * 1024

Body = TypeVar("Body", bound=BaseModel)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class PromptBody(_Wire):
    """`POST /v1/sessions/{id}/prompts`: the prompt, text or content blocks (text and images)."""

    input: str | list[dict[str, Any]]
    message_id: str | None = Field(default=None, alias="messageId")


class CreateSessionBody(PromptBody):
    """`POST /v1/sessions`: the first prompt, the agent that owns the session, and its tool context."""

    agent: str | None = None
    context: Any = None


class SteerBody(_Wire):
    """`POST /v1/sessions/{id}/steer`: text (or blocks) for the running turn."""

    input: str | list[dict[str, Any]]
    message_id: str | None = Field(default=None, alias="messageId")


class WakeBody(BaseModel):
    """`POST /v1/wake`: a wake carries no input, only which session to look at (§7)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

    session_id: str = Field(alias="sessionId")
    agent: str | None = None
    reason: str | None = None


async def read_body(request: Request, *, limit_bytes: int = MAX_BODY_BYTES) -> bytes:
    """The raw body, refused with `FxBodyTooLargeError` once it passes `limit_bytes`."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            declared_bytes = int(declared)
        except ValueError:
            raise FxInvalidRequestError("Content-Length is not a number") from None
        if declared_bytes > limit_bytes:
            raise FxBodyTooLargeError(f"request body of {declared_bytes} bytes is over the {limit_bytes}-byte cap")
    chunks: list[bytes] = []
    received_bytes = 0
    async for chunk in request.stream():
        received_bytes += len(chunk)
        if received_bytes > limit_bytes:
            raise FxBodyTooLargeError(f"request body is over the {limit_bytes}-byte cap")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_body(raw: bytes, model: type[Body]) -> Body:
    """Parse JSON bytes into `model`, or raise `FxInvalidRequestError` saying what is wrong."""
    try:
        data = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise FxInvalidRequestError(f"request body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise FxInvalidRequestError("request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors()[:5]
        )
        raise FxInvalidRequestError(f"invalid request body: {problems}") from None


async def read_json(request: Request, model: type[Body]) -> Body:
    """Read (capped) and validate one request body."""
    return parse_body(await read_body(request), model)
