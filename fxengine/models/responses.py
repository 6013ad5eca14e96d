"""The Responses API shape the Codex backend speaks: the request and the streamed answer.

The engine builds every model request as a Chat Completions body
(`models/openai_chat.build_request`); for a provider with `wire="responses"` it is
turned into a Responses body here, and the stream is read by `ResponsesDecoder`, which
gives the same events and outcome (`StreamOutcome`, `ToolCallOut`) as the Chat Completions
decoder, so the turn loop does not know which shape went over the wire.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .sse import StreamOutcome, ToolCallOut

if TYPE_CHECKING:
    from ._sse_py import StreamEvent

# A reply's end: the Responses `incomplete_details.reason` -> a Chat Completions finish_reason.
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


def _input_content(content: object, role: str) -> list[dict[str, object]]:
    kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        return [{"type": kind, "text": content}] if content else []
    parts: list[dict[str, object]] = []
    for part in content if isinstance(content, list) else []:  # else None: no text
        if part.get("type") == "text":
            parts.append({"type": kind, "text": part["text"]})
        elif part.get("type") == "image_url":
            parts.append({"type": "input_image", "image_url": part["image_url"]["url"]})
    return parts


def _input_items(messages: Sequence[Mapping[str, object]]) -> tuple[str | None, list[dict[str, object]]]:
    """(instructions, input items) from Chat Completions messages."""
    instructions: list[str] = []
    items: list[dict[str, object]] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            instructions.append(str(message.get("content") or ""))
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                          "output": message.get("content") or ""})
        else:
            content = _input_content(message.get("content"), str(role))
            if content:
                items.append({"type": "message", "role": role, "content": content})
            calls = message.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                              "arguments": call["function"]["arguments"]})
    return ("\n\n".join(instructions) if instructions else None), items


def responses_body(chat: Mapping[str, object]) -> dict[str, object]:
    """The Responses request for a Chat Completions request body (`openai_chat.build_request`)."""
    messages = chat.get("messages")
    instructions, items = _input_items(messages if isinstance(messages, list) else [])
    body: dict[str, object] = {"model": chat["model"], "input": items, "stream": True, "store": False}
    if instructions is not None:
        body["instructions"] = instructions
    tools = chat.get("tools")
    if isinstance(tools, list) and tools:
        body["tools"] = [{"type": "function", "name": t["function"]["name"],
                          "description": t["function"].get("description", ""),
                          "parameters": t["function"].get("parameters") or {"type": "object", "properties": {}}}
                         for t in tools]
        body["tool_choice"] = "auto"
        body["parallel_tool_calls"] = True
    response_format = chat.get("response_format")
    if isinstance(response_format, Mapping) and isinstance(response_format.get("json_schema"), Mapping):
        schema = response_format["json_schema"]
        body["text"] = {"format": {"type": "json_schema", "name": schema.get("name"), "schema": schema.get("schema"),
                                   "strict": bool(schema.get("strict"))}}
    if chat.get("reasoning_effort") is not None:
        body["reasoning"] = {"effort": chat["reasoning_effort"], "summary": "auto"}
    if chat.get("service_tier") is not None:
        body["service_tier"] = chat["service_tier"]
    return body


def _usage(raw: object) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, int] = {}
    pairs = (("inputTokens", raw.get("input_tokens")), ("outputTokens", raw.get("output_tokens")),
             ("cacheReadTokens", (raw.get("input_tokens_details") or {}).get("cached_tokens")),
             ("reasoningTokens", (raw.get("output_tokens_details") or {}).get("reasoning_tokens")))
    for key, value in pairs:
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    return out


class ResponsesDecoder:
    """Reads a Responses event stream: `feed(bytes)` gives ``("text_delta", s)`` and
    ``("reasoning_delta", s)`` events as they arrive, `finish()` the outcome."""

    def __init__(self) -> None:
        self._buf = b""
        self._calls: list[ToolCallOut] = []
        self._finish: str | None = None
        self._usage: dict[str, int] = {}
        self._done = False
        self._error: object = None  # the error of a failed response, as the server sent it
        self._model: str | None = None
        self._refusal: list[str] = []

    def feed(self, data: bytes) -> list[StreamEvent]:
        self._buf += data
        events: list[StreamEvent] = []
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                self._event(line[5:].strip(), events)
        return events

    def _event(self, payload: bytes, events: list[StreamEvent]) -> None:
        if not payload or payload == b"[DONE]":
            return
        try:
            event = json.loads(payload)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "response.output_text.delta" and isinstance(event.get("delta"), str):
            events.append(("text_delta", event["delta"]))
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta") \
                and isinstance(event.get("delta"), str):
            events.append(("reasoning_delta", event["delta"]))
        elif kind == "response.refusal.delta" and isinstance(event.get("delta"), str):
            # A refusal reads as text, and the reply ends refused (as a content filter does).
            self._refusal.append(event["delta"])
            events.append(("text_delta", event["delta"]))
        elif kind == "response.refusal.done" and not self._refusal and isinstance(event.get("refusal"), str):
            self._refusal.append(event["refusal"])
            events.append(("text_delta", event["refusal"]))
        elif kind == "response.output_item.done":
            item = event.get("item") or {}
            if item.get("type") == "function_call":
                self._calls.append(ToolCallOut(str(item.get("call_id") or item.get("id")), str(item.get("name")),
                                            str(item.get("arguments") or "{}")))
        elif kind in ("response.completed", "response.incomplete"):
            self._end(event.get("response") or {})
        elif kind in ("response.failed", "error"):
            response = event.get("response") or {}
            self._error = response.get("error") or event.get("error") or {"message": event.get("message")}
            self._done = True

    def _end(self, response: Mapping[str, Any]) -> None:
        self._done = True
        self._usage = _usage(response.get("usage"))
        if isinstance(response.get("model"), str):
            self._model = response["model"]
        reason = (response.get("incomplete_details") or {}).get("reason")
        if reason is not None:
            self._finish = _INCOMPLETE.get(reason, "length")
        elif self._refusal:
            self._finish = "content_filter"
        else:
            self._finish = "tool_calls" if self._calls else "stop"

    def finish(self) -> StreamOutcome:
        """The outcome, in the Chat Completions decoder's own type (its events were given by `feed`)."""
        return StreamOutcome(self._finish, list(self._calls), self._usage, self._done, self._error, self._model, [], 0)
