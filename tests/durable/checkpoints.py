"""Helpers of the checkpoint export tests: a session's turns, and what an engine restored
from its export sends the model next."""

from __future__ import annotations

import uuid
from typing import Any

from fxengine import create_engine
from fxengine.testing import Reply, ScriptedModel, tool_call
from tests.durable import conftest
from tests.durable.tooling import provider, tools


def responder(request: Any) -> Reply:
    """The durable tests' scripted model, plus `lookup:<q>`: one call of the `lookup` tool
    (an effect-free tool call), then "done"."""
    role, last = conftest.last_message_text(request)
    if role == "user" and last.startswith("lookup:"):
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "lookup", {"q": last[7:]}))
    return conftest.responder(request)


def said(message: dict[str, Any]) -> tuple[str, str]:
    """(role, text) of a chat message; an assistant tool call reads as `call:<name>`."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = message.get("tool_calls") or []
    if calls:
        return message["role"], "+".join(f"call:{c['function']['name']}" for c in calls)
    return message["role"], content or ""


# The conversation of `lookup:bob` then `hello`: the tool call, its result, both answers.
EXPECTED = [
    ("user", "lookup:bob"),
    ("assistant", "call:lookup"),
    ("tool", "found:bob"),
    ("assistant", "done"),
    ("user", "hello"),
    ("assistant", "echo:hello"),
]


async def next_request_after(data: bytes, model: ScriptedModel, text: str) -> list[tuple[str, str]]:
    """Restores an engine from checkpoint `data`, prompts `text`, and returns the messages
    of the request it sent the scripted model."""
    engine = await create_engine("scripted", provider=provider(model.base_url), tools=tools(), api_key="test-key",
                                 checkpoint=data)
    try:
        before = len(model.requests)
        result = await engine.prompt(text).result()
        assert result.stop_reason == "end_turn", result
        mine = [r for r in model.requests[before:] if said(r.body["messages"][-1]) == ("user", text)]
        assert len(mine) == 1, [said(m) for r in model.requests[before:] for m in r.body["messages"]]
        return [said(m) for m in mine[0].body["messages"] if m.get("role") != "system"]
    finally:
        await engine.close()
