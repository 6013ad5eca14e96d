"""The model-facing events a turn yields, declared and built in `fxengine.lines` (`ModelEvent`,
`MODEL_EVENT_TYPES`, one function each) and named here for the engine; docs/design.md §4:

    {"type": "text_delta", "delta", "step"}
    {"type": "reasoning_delta", "delta", "step"}
    {"type": "tool_start", "id", "name", "input" | ("inputPreview", "inputTruncated"), "step"}
    {"type": "tool_end", "id", "name", "isError", "content"?, "step"}
    {"type": "user_message", "text", "id"}
    {"type": "approval_request", "id", "name", "kind": "approval" | "external",
     "input" | ("inputPreview", "inputTruncated"), "step"}
    {"type": "approval_decision", "id", "name", "decision": "approve" | "deny" | "result",
     "by"?, "reason"?, "step"}

Diagnostics (`transport.*`, `tool.rerun`, `checkpoint.*`, `output.backpressure`) go to
`on_event` instead and are never stored.
"""

from __future__ import annotations

from collections.abc import Mapping

from .lines import MODEL_EVENT_TYPES as MODEL_EVENT_TYPES
from .lines import approval_decision as approval_decision
from .lines import approval_request as approval_request
from .lines import EndBody as EndBody
from .lines import Event as Event
from .lines import ModelEvent as ModelEvent
from .lines import ModelEventType as EventType
from .lines import end_body as end_body
from .lines import reasoning_delta as reasoning_delta
from .lines import text_delta as text_delta
from .lines import tool_end as tool_end
from .lines import tool_start as tool_start
from .lines import user_message as user_message


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
