from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from fxengine import FxInputError, FxLimitError, Tool, ToolContext
from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call

from .conftest import run, text_of

SCHEMA = {"type": "object", "properties": {}}


async def next_event(turn: Any, kind: str) -> dict[str, Any]:
    async for event in turn:
        if event["type"] == kind:
            return event
    raise AssertionError(f"no {kind}")


async def test_a_steer_mid_stream_cuts_the_reply_and_the_turn_goes_on(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("Writing a long "), hold("h"), text("essay")), Reply(text("Short, then.")))
    engine = await make_engine()
    turn = engine.prompt("write an essay")
    first = await asyncio.wait_for(next_event(turn, "text_delta"), 5)
    assert first["delta"] == "Writing a long "
    turn.steer("make it short", id="steer-1")
    rest, result = await run(turn)
    model.release("h")
    assert result.stop_reason == "end_turn"
    assert rest[0] == {"type": "user_message", "text": "make it short", "id": "steer-1"}
    assert text_of(rest) == "Short, then." and all(e["step"] == 2 for e in rest if e["type"] == "text_delta")
    messages = model.requests[1].body["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "write an essay"), ("assistant", "Writing a long "), ("user", "make it short")]


async def test_a_steer_during_a_tool_waits_for_the_tool(model: ScriptedModel, make_engine: Any) -> None:
    gate = asyncio.Event()
    finished: list[bool] = []

    async def slow(input: Any, ctx: ToolContext) -> str:
        await gate.wait()
        finished.append(not ctx.signal.aborted)
        return "slow result"

    model.script(Reply(tool_call("t1", "slow", {})), Reply(text("noted")))
    engine = await make_engine(tools=[Tool("slow", "s", SCHEMA, idempotent=True, execute=slow)])
    turn = engine.prompt("go")
    await asyncio.wait_for(next_event(turn, "tool_start"), 5)
    turn.steer("also check the weather")
    gate.set()
    rest, result = await run(turn)
    assert finished == [True]
    assert [e["type"] for e in rest[:2]] == ["tool_end", "user_message"]
    assert rest[0]["content"] == "slow result"
    messages = model.requests[1].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages[-1]["content"] == "also check the weather"
    assert result.stop_reason == "end_turn"


async def test_cancel_during_the_stream(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("partial "), hold("h"), text("never")), Reply(text("next")))
    engine = await make_engine()
    turn = engine.prompt("q")
    await asyncio.wait_for(next_event(turn, "text_delta"), 5)
    started = time.monotonic()
    turn.cancel()
    _, result = await run(turn)
    assert result.stop_reason == "cancelled"
    assert time.monotonic() - started < 1.0
    model.release("h")
    assert len(model.requests) == 1  # no retry after a cancel
    # the engine goes on; the history keeps what was shown
    await run(engine.prompt("again"))
    contents = [m["content"] for m in model.requests[1].body["messages"]]
    assert contents == ["q", "partial ", "again"]


async def test_cancel_during_tools_aborts_their_signal_and_stops_waiting(model: ScriptedModel, make_engine: Any) -> None:
    aborted = asyncio.Event()
    reasons: list[str | None] = []
    stuck_release = threading.Event()

    async def watcher(input: Any, ctx: ToolContext) -> str:
        reasons.append(await ctx.signal.wait())
        aborted.set()
        return "late"

    def stuck(input: Any, ctx: ToolContext) -> str:
        stuck_release.wait(5)  # ignores the signal: the turn must not wait for it
        return "late"

    tools = [Tool("watcher", "w", SCHEMA, idempotent=True, execute=watcher),
             Tool("stuck", "s", SCHEMA, idempotent=True, execute=stuck)]
    model.script(Reply(tool_call("a", "watcher", {}), tool_call("b", "stuck", {})), Reply(text("after")))
    engine = await make_engine(tools=tools)
    turn = engine.prompt("go")
    await asyncio.wait_for(next_event(turn, "tool_start"), 5)
    started = time.monotonic()
    turn.cancel()
    result = await asyncio.wait_for(turn.result(), 2)
    assert result.stop_reason == "cancelled"
    assert time.monotonic() - started < 1.0
    await asyncio.wait_for(aborted.wait(), 2)
    assert reasons == ["cancelled"]
    stuck_release.set()
    # the calls the cancel left unanswered are answered in the history
    await run(engine.prompt("next"))
    tools_msgs = [m for m in model.requests[1].body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools_msgs] == ["a", "b"]
    assert all("ended before" in m["content"] for m in tools_msgs)


async def test_steer_limits_and_a_steer_after_the_end(model: ScriptedModel, make_engine: Any) -> None:
    gate = asyncio.Event()

    async def wait(input: Any, ctx: ToolContext) -> str:
        await gate.wait()
        return "ok"

    model.script(Reply(tool_call("t", "wait", {})), Reply(text("done")))
    engine = await make_engine(tools=[Tool("wait", "w", SCHEMA, idempotent=True, execute=wait)])
    turn = engine.prompt("go")
    await asyncio.wait_for(next_event(turn, "tool_start"), 5)
    with pytest.raises(FxLimitError) as big:
        turn.steer("x" * (64 * 1024 + 1))
    assert big.value.code == "FX_LIMIT_STEER_SIZE"
    with pytest.raises(FxInputError):
        turn.steer("   ")
    for i in range(64):
        turn.steer(f"s{i}")
    with pytest.raises(FxLimitError) as full:
        turn.steer("one too many")
    assert full.value.code == "FX_LIMIT_STEER_QUEUE"
    gate.set()
    events, result = await run(turn)
    assert len([e for e in events if e["type"] == "user_message"]) == 64
    assert result.stop_reason == "end_turn"
    with pytest.raises(FxInputError) as ended:
        turn.steer("too late")
    assert ended.value.code == "FX_TURN_ENDED"


async def test_one_prompt_at_a_time(model: ScriptedModel, make_engine: Any) -> None:
    from fxengine import FxError

    model.script(Reply(text("a"), hold("h")))
    engine = await make_engine()
    turn = engine.prompt("one")
    with pytest.raises(FxError) as running:
        engine.prompt("two")
    assert running.value.code == "FX_TURN_RUNNING"
    turn.cancel()
    model.release("h")
    assert (await turn.result()).stop_reason == "cancelled"
