"""A scripted Chat Completions server for tests, demos and benchmarks (no network needed).

    with ScriptedModel() as model:
        model.script(Reply(text("Hel", "lo"), usage(10, 2)))
        engine = await create_engine(model=model.model_id, provider=model.provider)

See docs/testing.md.
"""

from __future__ import annotations

from .demo import demo_responder
from .script import Reply, cut, delay, hold, http_error, reasoning, text, tool_call, usage
from .server import RecordedRequest, Responder, ScriptedModel

__all__ = [
    # server
    "RecordedRequest",
    "Responder",
    "ScriptedModel",
    # replies and their parts
    "Reply",
    "cut",
    "delay",
    "hold",
    "http_error",
    "reasoning",
    "text",
    "tool_call",
    "usage",
    # responders
    "demo_responder",
]
