"""What a scripted reply says: its parts, and how they become Chat Completions chunks.

A `Reply` is rendered into a list of *steps* the server plays in order:
``("chunk", dict)`` writes one SSE event, ``("delay", ms)`` pauses, ``("hold", name)``
waits for `ScriptedModel.release(name)`, ``("cut",)`` drops the connection.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Union

__all__ = [
    "Cut",
    "Delay",
    "Hold",
    "Part",
    "Reasoning",
    "Reply",
    "Text",
    "ToolCall",
    "Usage",
    "cut",
    "delay",
    "hold",
    "http_error",
    "reasoning",
    "text",
    "tool_call",
    "usage",
]


@dataclass(frozen=True)
class Text:
    """Visible text, one chunk per string."""

    pieces: tuple[str, ...]


@dataclass(frozen=True)
class Reasoning:
    """Reasoning text (`delta.reasoning_content`), one chunk per string."""

    pieces: tuple[str, ...]


@dataclass(frozen=True)
class ToolCall:
    """One streamed tool call; `arguments` is the exact JSON text the model sends."""

    id: str
    name: str
    arguments: str
    pieces: int = 1


@dataclass(frozen=True)
class Usage:
    """Token counts sent in the usage chunk at the end of the stream."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None

    def to_wire(self) -> dict[str, object]:
        wire: dict[str, object] = {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.input_tokens + self.output_tokens,
        }
        if self.cache_read_tokens is not None:
            wire["prompt_tokens_details"] = {"cached_tokens": self.cache_read_tokens}
        if self.reasoning_tokens is not None:
            wire["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        if self.cache_write_tokens is not None:
            wire["cache_creation_input_tokens"] = self.cache_write_tokens
        return wire


@dataclass(frozen=True)
class Delay:
    """Pause before the next chunk."""

    ms: float


@dataclass(frozen=True)
class Hold:
    """Pause until `ScriptedModel.release(name)` or the client disconnects."""

    name: str


@dataclass(frozen=True)
class Cut:
    """Close the connection here, mid-body: nothing after it is sent, no `[DONE]`."""


Part = Union[Text, Reasoning, ToolCall, Usage, Delay, Hold, Cut]

# One thing a reply plays, in order: a chunk (its JSON), a pause (ms), a hold (its name),
# a cut, the end of the stream.
Step = Union[tuple[Literal["chunk"], dict[str, object]], tuple[Literal["delay"], float],
             tuple[Literal["hold"], str], tuple[Literal["cut"]], tuple[Literal["done"]]]


def text(*pieces: str) -> Text:
    """Visible text; each string is sent as its own chunk."""
    return Text(tuple(pieces))


def reasoning(*pieces: str) -> Reasoning:
    """Reasoning deltas; each string is sent as its own chunk."""
    return Reasoning(tuple(pieces))


def tool_call(id: str, name: str, arguments: Mapping[str, object] | str | None = None, *, pieces: int = 1) -> ToolCall:
    """A tool call whose arguments JSON is streamed in `pieces` chunks after the name.

    `arguments` may be a dict (sent as JSON) or a string sent verbatim (to test
    malformed arguments).
    """
    if pieces < 1:
        raise ValueError("pieces must be at least 1")
    args = arguments if isinstance(arguments, str) else json.dumps(arguments or {}, separators=(",", ":"))
    return ToolCall(id, name, args, pieces)


def usage(
    input_tokens: int = 0,
    output_tokens: int = 0,
    *,
    cache_read_tokens: int | None = None,
    cache_write_tokens: int | None = None,
    reasoning_tokens: int | None = None,
) -> Usage:
    """Token usage, sent in its own chunk after the finish chunk."""
    return Usage(input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens)


def delay(ms: float) -> Delay:
    """Pause `ms` milliseconds before the next chunk."""
    return Delay(ms)


def hold(name: str) -> Hold:
    """Pause until `ScriptedModel.release(name)` (or the client disconnects)."""
    return Hold(name)


def cut() -> Cut:
    """Close the connection at this point of the body (no finish chunk, no `[DONE]`)."""
    return Cut()


class Reply:
    """One scripted response: streamed parts, or an HTTP error when `status` is set.

    Args:
        *parts: `text`, `reasoning`, `tool_call`, `usage`, `delay`, `hold`, `cut`.
        finish_reason: defaults to ``"tool_calls"`` when a tool call is present, else ``"stop"``.
        model: the `model` field of every chunk.
        chunk_delay_ms: pause between any two chunks.
        interleave_tool_calls: stream the argument pieces of adjacent tool calls round-robin.
    """

    def __init__(
        self,
        *parts: Part,
        finish_reason: str | None = None,
        model: str = "scripted",
        chunk_delay_ms: float = 0,
        interleave_tool_calls: bool = False,
    ) -> None:
        self.parts = tuple(parts)
        self.finish_reason = finish_reason
        self.model = model
        self.chunk_delay_ms = chunk_delay_ms
        self.interleave_tool_calls = interleave_tool_calls
        self.status = 200
        self.error_message = ""
        self.retry_after_s: float | None = None

    def __repr__(self) -> str:
        if self.status != 200:
            return f"<Reply status={self.status} message={self.error_message!r}>"
        return f"<Reply parts={list(self.parts)!r} finish_reason={self.effective_finish_reason!r}>"

    @property
    def effective_finish_reason(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if any(isinstance(p, ToolCall) for p in self.parts) else "stop"

    def error_body(self) -> dict[str, object]:
        kind = "rate_limit_error" if self.status == 429 else "api_error"
        return {"error": {"message": self.error_message, "type": kind, "code": str(self.status)}}

    def steps(self, completion_id: str, created_s: int) -> list[Step]:
        """The chunks and pauses this reply plays, in order."""
        base = {"id": completion_id, "object": "chat.completion.chunk", "created": created_s, "model": self.model}

        def chunk(delta: dict[str, object], finish: str | None = None) -> tuple[Literal["chunk"], dict[str, object]]:
            return ("chunk", {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        steps: list[Step] = [chunk({"role": "assistant", "content": ""})]
        usage_part: Usage | None = None
        tool_index = 0
        pending_calls: list[tuple[int, ToolCall]] = []

        def flush_calls() -> None:
            for _, call_steps in _tool_call_steps(pending_calls, self.interleave_tool_calls):
                steps.append(chunk({"tool_calls": [call_steps]}))
            pending_calls.clear()

        for part in self.parts:
            if isinstance(part, ToolCall):
                pending_calls.append((tool_index, part))
                tool_index += 1
                continue
            flush_calls()
            if isinstance(part, Text):
                steps.extend(chunk({"content": p}) for p in part.pieces)
            elif isinstance(part, Reasoning):
                steps.extend(chunk({"reasoning_content": p}) for p in part.pieces)
            elif isinstance(part, Usage):
                usage_part = part
            elif isinstance(part, Delay):
                steps.append(("delay", part.ms))
            elif isinstance(part, Hold):
                steps.append(("hold", part.name))
            elif isinstance(part, Cut):
                steps.append(("cut",))
                return _with_chunk_delay(steps, self.chunk_delay_ms)
        flush_calls()
        steps.append(chunk({}, self.effective_finish_reason))
        if usage_part is not None:
            steps.append(("chunk", {**base, "choices": [], "usage": usage_part.to_wire()}))
        steps.append(("done",))
        return _with_chunk_delay(steps, self.chunk_delay_ms)

    def message(self) -> dict[str, object]:
        """The whole assistant message, for a non-streaming request."""
        content = "".join(p for part in self.parts if isinstance(part, Text) for p in part.pieces)
        message: dict[str, object] = {"role": "assistant", "content": content or None}
        calls = [p for p in self.parts if isinstance(p, ToolCall)]
        if calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
            ]
        return message

    def usage_wire(self) -> dict[str, object] | None:
        found = [p for p in self.parts if isinstance(p, Usage)]
        return found[-1].to_wire() if found else None


def http_error(status: int, message: str = "scripted error", *, retry_after_s: float | None = None) -> Reply:
    """A reply that is an HTTP error with an OpenAI-style JSON error body."""
    reply = Reply()
    reply.status = status
    reply.error_message = message
    reply.retry_after_s = retry_after_s
    return reply


def _split(text_: str, pieces: int) -> list[str]:
    size = max(1, -(-len(text_) // pieces))
    out = [text_[i : i + size] for i in range(0, len(text_), size)]
    return out + [""] * (pieces - len(out)) if len(out) < pieces else out


def _tool_call_steps(calls: list[tuple[int, ToolCall]], interleave: bool) -> list[tuple[int, dict[str, object]]]:
    """The `delta.tool_calls[0]` entries of a run of adjacent tool calls."""
    per_call: list[list[tuple[int, dict[str, object]]]] = []
    for index, call in calls:
        entries = [(index, {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}})]
        entries += [(index, {"index": index, "function": {"arguments": p}}) for p in _split(call.arguments, call.pieces)]
        per_call.append(entries)
    if not interleave:
        return [e for entries in per_call for e in entries]
    out: list[tuple[int, dict[str, object]]] = []
    longest = max((len(e) for e in per_call), default=0)
    for i in range(longest):
        out.extend(entries[i] for entries in per_call if i < len(entries))
    return out


def _with_chunk_delay(steps: list[Step], chunk_delay_ms: float) -> list[Step]:
    if chunk_delay_ms <= 0:
        return steps
    out: list[Step] = []
    for step in steps:
        if out and step[0] in ("chunk", "done"):
            out.append(("delay", chunk_delay_ms))
        out.append(step)
    return out
