"""Steers and cancels sent back to back to a running turn (§6, §11.5), on the embedded
store (the same Lua) with an in-process worker.

A steer handed to a turn that ends without placing it (no `user_message`, no `accepted`
mark) still waits in the store: it runs as the next turn, before the prompts accepted
after it, and each input ends once."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fxengine.testing import Reply, ScriptedModel, text, tool_call
from fxengine.tools import Tool
from fxworker import Agent
from tests.durable.conftest import embedded_agent, last_message_text, stored_lines, wait_idle

IDLE_TIMEOUT_S = 10.0

# Set by the `wait` tool as it starts (it runs on the embedded worker's thread).
_started = threading.Event()


async def _wait(input: Any, ctx: Any) -> str:
    _started.set()
    await ctx.signal.wait()  # until the turn is cancelled
    return "aborted"


def _responder(request: Any) -> Reply:
    """`wait` calls the `wait` tool; after a tool result, "done"; anything else, "echo:<text>"."""
    role, last = last_message_text(request)
    if role == "tool":
        return Reply(text("done"))
    if last == "wait":
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "wait", {}))
    return Reply(text("echo:", last))


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = _responder
        yield m


@pytest.fixture
def agent(model: ScriptedModel) -> Iterator[Agent]:
    tools = [Tool("wait", "Waits until the turn is cancelled.", {"type": "object", "properties": {}},
                  idempotent=True, execute=_wait)]
    _started.clear()
    with embedded_agent(model, agent_tools=tools) as a:
        yield a


async def test_steers_a_cancelled_turn_never_placed_run_next_before_later_prompts(agent: Agent) -> None:
    session = agent.session()
    first = await session.prompt("wait", message_id="p1")
    assert await asyncio.to_thread(_started.wait, IDLE_TIMEOUT_S)
    # Back to back while the tool runs: the steers are handed to p1's turn (they wait for
    # the tool), the prompts wait behind it, and the cancel ends p1 before it placed them.
    await session.steer("x2", message_id="x2")
    await session.steer("x3", message_id="x3")
    await session.prompt("p2", message_id="p2")
    await session.prompt("p3", message_id="p3")
    assert await first.cancel()
    assert (await asyncio.wait_for(first.result(), IDLE_TIMEOUT_S)).stop_reason == "cancelled"
    await wait_idle(agent, session.id, timeout_s=IDLE_TIMEOUT_S)
    lines = await stored_lines(agent, session.id)
    starts = [line["messageId"] for line in lines if line["type"] == "turn_start"]
    ends = [(line["messageId"], line["stopReason"]) for line in lines if line["type"] == "turn_end"]
    # One turn at a time, in acceptance order: x2 runs next (x3 joins it), then p2, then p3.
    assert starts == ["p1", "x2", "p2", "p3"], lines
    assert ends == [("p1", "cancelled"), ("x2", "end_turn"), ("p2", "end_turn"), ("p3", "end_turn")], lines
    joined = [(i, line) for i, line in enumerate(lines) if line["type"] == "user_message" and line.get("id") == "x3"]
    assert len(joined) == 1 and joined[0][1]["messageId"] == "x2", lines
