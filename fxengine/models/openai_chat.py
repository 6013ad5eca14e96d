"""OpenAI Chat Completions over httpx: the request body, one streamed attempt, the retry.

The conversation is kept in a provider-neutral form (see `fxengine.conversation`) and
turned into Chat Completions messages here. A response body is decoded by
`ChatStreamDecoder` (compiled or pure); text and reasoning deltas go to `on_delta` as
they arrive, so a slow reader slows the stream (backpressure) rather than growing a buffer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Protocol

import aiohttp
import httpx

from ..codes import Code
from ..errors import FxInputError, FxProviderError
from ..limits import Block
from ..messages import Message
from ..providers.base import MODEL_IDLE_TIMEOUT_S, WIRE_RESPONSES, ModelSpec, Provider
from ..providers.credentials import mask_secrets
from .aio import AioClient, ModelResponse
from .responses import ResponsesDecoder, responses_body
from ..tools.definition import Tool
from ..tools.runner import ToolCall
from ..usage import clean_usage
from .sse import ChatStreamDecoder, StreamOutcome

if TYPE_CHECKING:
    from ._sse_py import StreamEvent

ACTIVITY_INTERVAL_S = 0.25
RETRY_DELAY_S = 0.2
RETRY_AFTER_MAX_S = 10.0
ERROR_BODY_MAX_BYTES = 64 * 1024
RESUME_NOTICE = "Resuming from unexpected session interruption."

Diagnostic = Callable[[dict[str, object]], None]
OnDelta = Callable[[str, str], Awaitable[None]]


class StreamDecoder(Protocol):
    """What decodes a model's streamed answer: `ChatStreamDecoder`, `ResponsesDecoder`."""

    def feed(self, data: bytes) -> list[StreamEvent]: ...

    def finish(self) -> StreamOutcome: ...


def _user_content(blocks: Sequence[Block]) -> str | list[dict[str, object]]:
    if all(b.get("type") == "text" for b in blocks):
        return "".join(b["text"] for b in blocks)
    parts: list[dict[str, object]] = []
    for block in blocks:
        if block.get("type") == "text":
            parts.append({"type": "text", "text": block["text"]})
        else:
            url = f"data:{block['mimeType']};base64,{block['data']}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def wire_messages(messages: Sequence[Message], instructions: str | None) -> list[dict[str, object]]:
    """Chat Completions `messages` from the conversation's neutral messages."""
    out: list[dict[str, object]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for message in messages:
        if message["role"] == "user":
            out.append({"role": "user", "content": _user_content(message["blocks"])})
        elif message["role"] == "assistant":
            wire: dict[str, object] = {"role": "assistant", "content": message.get("content") or None}
            calls = message.get("tool_calls") or []
            if calls:
                wire["tool_calls"] = [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in calls
                ]
            elif wire["content"] is None:
                wire["content"] = ""
            out.append(wire)
        elif message["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": message["id"], "content": message.get("content", "")})
            images = message.get("images") or []
            if images:
                # Chat Completions tool messages carry text only: images follow as a user part.
                blocks = [{"type": "text", "text": f"Images returned by {message.get('name', 'the tool')}:"}]
                blocks += [{"type": "image", **image} for image in images]
                out.append({"role": "user", "content": _user_content(blocks)})
    return out


def _holds_images(messages: Sequence[Message]) -> bool:
    for message in messages:
        if message["role"] == "tool" and message.get("images"):
            return True
        if message["role"] == "user" and any(b.get("type") == "image" for b in message.get("blocks") or ()):
            return True
    return False


def build_request(
    spec: ModelSpec,
    messages: Sequence[Message],
    *,
    tools: Sequence[Tool],
    instructions: str | None,
    output: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """The JSON body of one streaming Chat Completions request.

    `output`, for a typed answer (`fxengine.output`): ``{"tool": <a tools entry>}`` adds
    the final-result tool, ``{"response_format": <it>}`` asks for the object natively.

    Raises:
        FxInputError: `FX_MODEL_NO_IMAGES` when the history holds an image (a checkpoint
            made with another model) and this model's catalog entry takes none: no image
            bytes leave the process.
    """
    if spec.entry is not None and not spec.entry.supports_images and _holds_images(messages):
        raise FxInputError(f"model {spec.id} does not take images, and the conversation holds some",
                           code=Code.MODEL_NO_IMAGES)
    body: dict[str, object] = {
        "model": spec.id,
        "messages": wire_messages(messages, instructions),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if tools and (spec.entry is None or spec.entry.supports_tools):
        body["tools"] = [t.describe() for t in tools]
    if output is not None and "tool" in output:
        body["tools"] = [*(body.get("tools") or []), output["tool"]]  # type: ignore[misc]
    if output is not None and "response_format" in output:
        body["response_format"] = output["response_format"]
    if spec.effort is not None:
        body["reasoning_effort"] = spec.effort
    if spec.ultrafast:
        body["service_tier"] = "priority"
    elif spec.fast:
        body["service_tier"] = "fast"
    return body


@dataclass
class StepOutput:
    """What one model step produced; filled as the stream arrives (read it after a cut)."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None
    emitted: bool = False

    @property
    def content(self) -> str:
        return "".join(self.text)


class AttemptFailed(Exception):
    """One attempt failed; `error` is what the turn reports if it is not retried."""

    def __init__(self, error: FxProviderError, *, retryable: bool, retry_after_s: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retryable = retryable
        self.retry_after_s = retry_after_s


def _status_error(status: int, message: str) -> FxProviderError:
    if status in (401, 403):
        code = Code.PROVIDER_AUTH
    elif status == 429:
        code = Code.PROVIDER_RATE_LIMITED
    elif status >= 500:
        code = Code.PROVIDER_UNAVAILABLE
    else:
        code = Code.PROVIDER_REJECTED
    error = FxProviderError(f"the model provider answered HTTP {status}: {message}", code=code)
    error.status = status  # type: ignore[attr-defined]
    return error


def _error_message(body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")[:500].strip() or "no message"
    if isinstance(parsed, dict):
        inner = parsed.get("error", parsed)
        message = inner.get("message") if isinstance(inner, dict) else None
        if isinstance(message, str):
            return message[:2000]
        if isinstance(inner, str):
            return inner[:2000]
    return json.dumps(parsed)[:500]


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait before the retry: `retry-after-ms` (as OpenAI sends), else `retry-after`."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _idle_timeout(client: httpx.AsyncClient, provider: Provider) -> httpx.Timeout:
    """The client's timeouts with the read timeout (the longest wait for the response's
    headers or its next bytes) set to the provider's idle timeout."""
    base = client.timeout
    return httpx.Timeout(connect=base.connect, read=provider.idle_timeout_s or MODEL_IDLE_TIMEOUT_S,
                         write=base.write, pool=base.pool)


async def _as_event(response: ModelResponse) -> AsyncIterator[bytes]:
    """A whole (non-streamed) Chat Completions reply as the one event of a stream: its
    `choices[].message` reads as a delta (`_sse_py.ChatStreamDecoder`). JSON whitespace
    may hold line ends; strings cannot, so flattening them keeps the value."""
    raw = await response.aread()
    yield b"data: " + raw.replace(b"\r", b" ").replace(b"\n", b" ") + b"\n\ndata: [DONE]\n\n"


class _MapTransportErrors:
    """Turns what httpx or aiohttp raise while a model request runs into a retryable
    `AttemptFailed` with its `FX_PROVIDER_*` code. A plain class, not @contextmanager: it
    wraps every model request (`fxworker.store._boundary.map_redis_errors` is its store twin)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if exc is None or isinstance(exc, AttemptFailed):
            return False
        name = type(exc).__name__
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout,
                            aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):
            error = FxProviderError(f"cannot reach the model provider ({name})", code=Code.PROVIDER_UNREACHABLE)
        elif isinstance(exc, (httpx.TimeoutException, aiohttp.ServerTimeoutError)):
            error = FxProviderError(f"the model provider timed out ({name})", code=Code.PROVIDER_TIMEOUT)
        elif isinstance(exc, (httpx.TransportError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError)):
            # The connection broke mid-body: the same as a cut stream.
            error = FxProviderError(f"the model stream was cut ({name})", code=Code.PROVIDER_STREAM_CUT)
        else:
            return False
        raise AttemptFailed(error, retryable=True) from None


_MAP_TRANSPORT_ERRORS = _MapTransportErrors()


def map_transport_errors() -> _MapTransportErrors:
    """The provider boundary: `with map_transport_errors(): ...` around a model request."""
    return _MAP_TRANSPORT_ERRORS


async def stream_attempt(
    client: httpx.AsyncClient,
    provider: Provider,
    body: Mapping[str, object],
    out: StepOutput,
    *,
    on_delta: OnDelta,
    diag: Diagnostic,
    attempt: int,
    step: int,
) -> None:
    """Sends one request and decodes its stream into `out`.

    Raises:
        AttemptFailed: the request or its stream failed (`retryable` says whether a
            retry is allowed by the kind of failure alone).
    """
    started = time.monotonic()
    diag({"type": "transport.start", "attempt": attempt, "method": "POST", "endpoint": provider.chat_url,
          "model": body.get("model"), "step": step})
    headers = await _headers(client, provider)
    secrets = provider.secrets()
    responses = provider.wire == WIRE_RESPONSES
    wire_body = responses_body(body) if responses else body
    decoder: StreamDecoder = ResponsesDecoder() if responses else ChatStreamDecoder()
    timeout = _idle_timeout(client, provider)
    with map_transport_errors():
        # A worker's client sends on aiohttp directly (fxengine/models/aio.py).
        request = (client.post_json(provider.chat_url, wire_body, headers=headers, timeout=timeout)
                   if isinstance(client, AioClient)
                   else client.stream("POST", provider.chat_url, json=wire_body, headers=headers, timeout=timeout))
        async with request as response:
            _report_response(response, diag, attempt, step, started)
            if response.status_code != 200:
                raise await _refused(response, secrets)
            whole = not responses and response.headers.get("content-type", "").startswith("application/json")
            chunks = _as_event(response) if whole else response.aiter_raw()
            await _decode(chunks, decoder, out, on_delta=on_delta, diag=diag, attempt=attempt, step=step,
                          started=started)
    _settle(decoder.finish(), out, secrets)


async def _headers(client: httpx.AsyncClient, provider: Provider) -> dict[str, str]:
    """The request's headers; a provider's credentials are added here, just before sending:
    they never sit in the body or the journal."""
    headers = provider.request_headers()
    if provider.auth is not None:
        try:
            headers.update(await provider.auth.headers(client))
        except FxProviderError as exc:
            raise AttemptFailed(FxProviderError(mask_secrets(exc.message, provider.secrets()), code=exc.code),
                                retryable=False) from None
    return headers


def _report_response(response: ModelResponse, diag: Diagnostic, attempt: int, step: int, started: float) -> None:
    event: dict[str, object] = {"type": "transport.response", "attempt": attempt, "status": response.status_code,
                             "elapsedMs": int((time.monotonic() - started) * 1000), "step": step}
    request_id = response.headers.get("x-vercel-id") or response.headers.get("x-request-id")
    if request_id:
        event["requestId"] = request_id
    diag(event)


async def _refused(response: ModelResponse, secrets: list[str]) -> AttemptFailed:
    """The failure of a request the provider answered with an error status (its body, bounded and masked)."""
    raw = b""
    async for piece in response.aiter_bytes():
        raw += piece
        if len(raw) > ERROR_BODY_MAX_BYTES:
            break
    status = response.status_code
    return AttemptFailed(_status_error(status, mask_secrets(_error_message(raw), secrets)),
                         retryable=status == 429 or status >= 500, retry_after_s=_retry_after(response.headers))


async def _decode(chunks: AsyncIterator[bytes], decoder: StreamDecoder, out: StepOutput, *, on_delta: OnDelta,
                  diag: Diagnostic, attempt: int, step: int, started: float) -> None:
    """Feeds the body to the decoder, passing text and reasoning on as they come, with a
    `transport.activity` diagnostic every `ACTIVITY_INTERVAL_S`."""
    total = chunk_bytes = 0
    last_activity = started
    async for raw_chunk in chunks:
        total += len(raw_chunk)
        chunk_bytes += len(raw_chunk)
        now = time.monotonic()
        if now - last_activity >= ACTIVITY_INTERVAL_S:
            diag({"type": "transport.activity", "attempt": attempt, "chunkBytes": chunk_bytes, "totalBytes": total,
                  "step": step})
            last_activity = now
            chunk_bytes = 0
        for event in decoder.feed(raw_chunk):
            if event[0] == "text_delta":
                out.text.append(event[1])
                out.emitted = True
                await on_delta("text_delta", event[1])
            elif event[0] == "reasoning_delta":
                out.reasoning.append(event[1])
                out.emitted = True
                await on_delta("reasoning_delta", event[1])


def _settle(outcome: StreamOutcome, out: StepOutput, secrets: list[str]) -> None:
    """What the finished stream said, into `out`; its in-band error or an early end as a failure."""
    if outcome.error is not None:
        detail = outcome.error.get("message") if isinstance(outcome.error, dict) else None
        message = mask_secrets(str(detail or json.dumps(outcome.error))[:2000], secrets)
        raise AttemptFailed(FxProviderError(f"the model provider failed: {message}"), retryable=False)
    if not outcome.done and outcome.finish_reason is None:
        raise AttemptFailed(
            FxProviderError("the model stream ended before it finished", code=Code.PROVIDER_STREAM_CUT), retryable=True
        )
    out.finish_reason = outcome.finish_reason
    out.usage = clean_usage(outcome.usage)
    out.model = outcome.model
    out.tool_calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in outcome.tool_calls]


async def model_step(
    client: httpx.AsyncClient,
    provider: Provider,
    body: Mapping[str, object],
    *,
    on_delta: OnDelta,
    diag: Diagnostic,
    step: int,
    out: StepOutput | None = None,
) -> StepOutput:
    """One model step with at most one automatic retry (docs/design.md §8).

    The retry happens only for a retryable failure before any delta was emitted;
    a cancel (the caller's task cancelled) ends it without a retry.

    Raises:
        FxProviderError: the step failed (with a code naming why).
    """
    out = out if out is not None else StepOutput()
    started = time.monotonic()
    attempt = 1
    retried = False
    refreshed = False
    while True:
        try:
            await stream_attempt(client, provider, body, out, on_delta=on_delta, diag=diag, attempt=attempt, step=step)
            return out
        except AttemptFailed as failed:
            elapsed_ms = int((time.monotonic() - started) * 1000)
            diag({"type": "transport.error", "attempt": attempt, "elapsedMs": elapsed_ms, "error": failed.error.code,
                  "step": step})
            if not refreshed and _rejected(failed, provider):
                # Credentials refused: refresh them once and send again (not the transport retry).
                refreshed = True
                diag({"type": "credentials.refresh", "attempt": attempt, "nextAttempt": attempt + 1, "step": step})
                await _refresh(client, provider)
                attempt += 1
                continue
            if retried or not failed.retryable or out.emitted:
                raise failed.error from None
            delay_s = RETRY_DELAY_S if failed.retry_after_s is None else min(failed.retry_after_s, RETRY_AFTER_MAX_S)
            diag({"type": "transport.retry", "attempt": attempt, "nextAttempt": attempt + 1, "elapsedMs": elapsed_ms,
                  "error": failed.error.code, "delayMs": int(delay_s * 1000), "step": step})
            await asyncio.sleep(delay_s)
            out.text.clear()
            out.reasoning.clear()
            retried = True
            attempt += 1


def _rejected(failed: AttemptFailed, provider: Provider) -> bool:
    """Whether the provider refused refreshable credentials (HTTP 401)."""
    return (getattr(failed.error, "status", None) == 401 and provider.auth is not None
            and provider.auth.refreshable)


async def _refresh(client: httpx.AsyncClient, provider: Provider) -> None:
    """Refreshes the provider's credentials; a failure ends the step, tokens masked."""
    assert provider.auth is not None
    try:
        await provider.auth.refresh_rejected(client)
    except FxProviderError as exc:
        raise FxProviderError(mask_secrets(exc.message, provider.secrets()), code=exc.code) from None
