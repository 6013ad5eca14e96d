"""Tools: the definition (`Tool`, `ToolContext`, `Signal`, `provider_tool`), `@tool`, and the call runner."""

from __future__ import annotations

from .decorator import tool
from .definition import Signal, Tool, ToolContext, check_tools, provider_tool
from .runner import MAX_CONCURRENT_CALLS, PlannedCall, ToolOutcome, format_result, run_calls

__all__ = [
    "MAX_CONCURRENT_CALLS",
    "PlannedCall",
    "Signal",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "check_tools",
    "format_result",
    "provider_tool",
    "run_calls",
    "tool",
]
