"""Request bodies: read with an 8 MiB cap before anything parses them, then validated by pydantic.

A body is refused with 413 (`FX_LIMIT_BODY`) as soon as its `Content-Length` or the bytes
received so far pass the cap, so an oversized body is never buffered whole nor parsed.
Field names are the camelCase of the wire (`messageId`); unknown fields are refused.
JSON that Python reads but nothing downstream can store is refused with 400
`FX_INVALID_REQUEST` too: NaN and Infinity (not JSON; `1e999` reads as Infinity), a lone
UTF-16 surrogate (`"\\ud800"`: no UTF-8 encodes it), nesting deeper than
`MAX_JSON_DEPTH`.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal, NoReturn, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request

from fxworker.errors import FxBodyTooLargeError, FxInvalidRequestError

MAX_BODY_BYTES = 8 * 1024 * 1024
# Arrays and objects inside one another; a prompt's blocks are 3 deep, a context rarely 10.
MAX_JSON_DEPTH = 64

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
    # The application's own id for the session (where the server allows it: `check_session_id`).
    session_id: str | None = Field(default=None, alias="sessionId")


class SteerBody(_Wire):
    """`POST /v1/sessions/{id}/steer`: text (or blocks) for the running turn."""

    input: str | list[dict[str, Any]]
    message_id: str | None = Field(default=None, alias="messageId")


class DecisionBody(_Wire):
    """`POST /v1/sessions/{id}/calls/{call_id}`: the decision for a call a parked turn
    waits on: approve it, deny it (`reason`), or give an external tool's `result`."""

    type: Literal["approve", "deny", "result"]
    reason: str = Field(default="", max_length=4096)
    result: Any = None
    is_error: bool = Field(default=False, alias="isError")
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


def _no_constant(name: str) -> NoReturn:
    raise FxInvalidRequestError(f"request body has {name}: JSON has no NaN or Infinity")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise FxInvalidRequestError(f"request body has a number out of range ({text[:40]})")
    return value


def _check_string(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise FxInvalidRequestError("request body has a lone UTF-16 surrogate (\\ud800-\\udfff) in a string") from None


def check_tree(data: object, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuses (`FxInvalidRequestError`) parsed JSON nested deeper than `max_depth` or
    holding a string no UTF-8 encodes. Iterative: a deep value cannot exhaust the stack."""
    stack: list[tuple[object, int]] = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _check_string(node)
        elif isinstance(node, (dict, list)):
            if depth >= max_depth:
                raise FxInvalidRequestError(f"request body is nested deeper than {max_depth} levels")
            if isinstance(node, dict):
                for key, value in node.items():
                    _check_string(key)
                    stack.append((value, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in node)


def parse_body(raw: bytes, model: type[Body]) -> Body:
    """Parse JSON bytes into `model`, or raise `FxInvalidRequestError` saying what is wrong."""
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite) if raw else None
    except FxInvalidRequestError:
        raise
    except RecursionError:
        raise FxInvalidRequestError(f"request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise FxInvalidRequestError(f"request body is not JSON: {exc}") from None
    check_tree(data)
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
