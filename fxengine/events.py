"""The model-facing events a turn yields, built in the wire shape that `fxengine.lines` declares
(`ModelEvent`, `MODEL_EVENT_TYPES`; docs/design.md §4, camelCase):

    {"type": "text_delta", "delta", "step"}
    {"type": "reasoning_delta", "delta", "step"}
    {"type": "tool_start", "id", "name", "input" | ("inputPreview", "inputTruncated"), "step"}
    {"type": "tool_end", "id", "name", "isError", "content"?, "step"}
    {"type": "user_message", "text", "id"}

Diagnostics (`transport.*`, `tool.rerun`, `checkpoint.*`, `output.backpressure`) go to
`on_event` instead and are never stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .limits import TOOL_INPUT_PREVIEW_MAX_BYTES
from .lines import MODEL_EVENT_TYPES as MODEL_EVENT_TYPES
from .lines import EndBody as EndBody
from .lines import ModelEvent as ModelEvent
from .lines import ModelEventType as EventType
from .lines import end_body as end_body

# What the engine's event buffer and sink carry: a `ModelEvent` as these functions build it,
# and the turn's end (`turn_end` / `turn_yield` with `turnId`, `EngineCore.report_end`).
Event = dict[str, Any]


def text_delta(delta: str, step: int) -> Event:
    return {"type": "text_delta", "delta": delta, "step": step}


def reasoning_delta(delta: str, step: int) -> Event:
    return {"type": "reasoning_delta", "delta": delta, "step": step}


def tool_start(call_id: str, name: str, input: object, step: int) -> Event:
    """A `tool_start`; an input over 64 KiB of JSON becomes a truncated preview."""
    encoded = json.dumps(input, ensure_ascii=False, separators=(",", ":"))
    if len(encoded.encode("utf-8")) <= TOOL_INPUT_PREVIEW_MAX_BYTES:
        return {"type": "tool_start", "id": call_id, "name": name, "input": input, "step": step}
    preview = encoded.encode("utf-8")[:TOOL_INPUT_PREVIEW_MAX_BYTES].decode("utf-8", "ignore")
    return {"type": "tool_start", "id": call_id, "name": name, "inputPreview": preview, "inputTruncated": True, "step": step}


def tool_end(call_id: str, name: str, *, is_error: bool, content: str | None, step: int) -> Event:
    event: Event = {"type": "tool_end", "id": call_id, "name": name, "isError": is_error, "step": step}
    if content is not None:
        event["content"] = content
    return event


def user_message(text: str, message_id: str) -> Event:
    return {"type": "user_message", "text": text, "id": message_id}


def event_size(event: Mapping[str, object]) -> int:
    """A cheap estimate of an event's encoded size, for backpressure accounting."""
    size = 48
    for key in ("delta", "text", "content", "inputPreview"):
        value = event.get(key)
        if isinstance(value, str):
            size += len(value)
    if "input" in event:
        size += 64
    return size
