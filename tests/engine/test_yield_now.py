"""`Turn.yield_now()`: a clean stop before the next model request (warm shutdown, §6-§7)."""

from __future__ import annotations

import asyncio
from typing import Any

from fxengine import MemoryPersistence
from fxengine.models.openai_chat import RESUME_NOTICE
from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call

from .conftest import run, text_of, wait_until
from .test_resume import Effects


async def test_a_streaming_request_finishes_then_the_turn_yields_before_the_next(
    model: ScriptedModel, make_engine: Any
) -> None:
    effects = Effects()
    effects.block = False
    tools = [effects.tool("read", idempotent=True)]
    store = MemoryPersistence()
    model.script(Reply(text("looking "), hold("h"), tool_call("r", "read", {})), Reply(text("after the yield")))
    first = await make_engine(tools=tools, persistence=store)
    turn = first.prompt("go", turn_id="y1")
    await asyncio.to_thread(model.wait_held, "h")
    turn.yield_now()
    model.release("h")
    events, result = await run(turn)
    assert result.stop_reason == "yielded" and not result.detached
    assert len(model.requests) == 1
    assert effects.runs == [("read", "y1:1:r")]  # the response's call ran; no second request
    assert text_of(events) == "looking " and [e["type"] for e in events][-1] == "tool_end"
    flat = [m for marks in store.marks for m in marks]
    assert {"yield": True} in flat
    assert first.open_turn is not None and first.open_turn["yielded"]
    assert first.recorded_steps("y1") == {1} and first.in_flight is None  # nothing to retract
    second = await make_engine(tools=tools, persistence=store)
    resumed = second.resume()
    assert resumed is not None and resumed.retract_candidates == []
    events, result = await run(resumed)
    assert result.stop_reason == "end_turn" and text_of(events) == "after the yield"
    assert RESUME_NOTICE not in str(model.requests[-1].body["messages"])
    assert effects.runs == [("read", "y1:1:r")]


async def test_before_the_first_request_nothing_is_sent(model: ScriptedModel, make_engine: Any) -> None:
    store = MemoryPersistence()
    model.script(Reply(text("answered later")))
    first = await make_engine(persistence=store)
    turn = first.prompt("q", turn_id="y2")
    turn.yield_now()
    _, result = await run(turn)
    assert result.stop_reason == "yielded"
    assert model.requests == []
    second = await make_engine(persistence=store)
    resumed = second.resume()
    assert resumed is not None
    events, result = await run(resumed)
    assert result.stop_reason == "end_turn" and text_of(events) == "answered later"


async def test_running_tools_finish_first(model: ScriptedModel, make_engine: Any) -> None:
    effects = Effects()
    tools = [effects.tool("send", idempotent=False)]
    model.script(Reply(tool_call("c1", "send", {"to": "bob"})), Reply(text("never asked")))
    engine = await make_engine(tools=tools, persistence=MemoryPersistence())
    turn = engine.prompt("send", turn_id="y3")
    await asyncio.wait_for(effects.started.wait(), 5)
    turn.yield_now()
    effects.release.set()
    events, result = await run(turn)
    assert result.stop_reason == "yielded"
    assert [(e["type"], e.get("isError")) for e in events if e["type"] == "tool_end"] == [("tool_end", False)]
    assert len(model.requests) == 1


async def test_a_turn_that_needs_no_other_request_ends_as_usual(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("part "), hold("h2"), text("whole")))
    engine = await make_engine(persistence=MemoryPersistence())
    turn = engine.prompt("q", turn_id="y4")
    await asyncio.to_thread(model.wait_held, "h2")
    turn.yield_now()
    model.release("h2")
    events, result = await run(turn)
    assert result.stop_reason == "end_turn" and text_of(events) == "part whole"
    turn.yield_now()  # after the end: no effect
    assert (await turn.result()).stop_reason == "end_turn" and engine.open_turn is None
    await wait_until(lambda: turn.done)
