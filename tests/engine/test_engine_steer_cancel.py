from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from fxengine import FxInputError, FxLimitError, Tool, ToolContext
from fxengine.persistence import MemoryPersistence
from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call

from .conftest import Diagnostics, next_event, run, text_of, wait_until

SCHEMA = {"type": "object", "properties": {}}


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


@pytest.mark.parametrize("leave", ["break", "exception", "async with"])
async def test_leaving_the_events_early_cancels_the_turn_and_closes_the_request(
    model: ScriptedModel, make_engine: Any, leave: str, diagnostics: Diagnostics
) -> None:
    model.script(Reply(text("Writing a long "), hold("h"), text("essay")))
    engine = await make_engine()
    turn = engine.prompt("write an essay")
    if leave == "break":
        async for event in turn:
            assert event["delta"] == "Writing a long "
            break
    elif leave == "exception":
        with pytest.raises(LookupError):
            async for event in turn:
                raise LookupError(event["delta"])
    else:
        async with turn:
            await next_event(turn, "text_delta")
    result = await asyncio.wait_for(turn.result(), 5)
    assert result.stop_reason == "cancelled"
    model.release("h")  # the rest of the reply goes to a closed connection
    await wait_until(lambda: model.open_connections == 0)
    assert len(model.requests) == 1
    assert result.message_id == turn.turn_id
    if leave != "async with":  # the reader left: what it did not read is dropped, once
        assert len(diagnostics.of("output.discarded")) == 1


async def test_reading_to_the_end_or_awaiting_the_result_cancels_nothing(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("one")), Reply(text("two")))
    engine = await make_engine()
    async with engine.prompt("a") as turn:
        assert text_of([e async for e in turn]) == "one"
    assert (await turn.result()).stop_reason == "end_turn"
    turn = engine.prompt("b")
    events = aiter(turn)  # an iterator kept in hand may be left and taken up again
    async for event in events:
        break
    assert (await asyncio.wait_for(turn.result(), 5)).stop_reason == "end_turn"


async def test_a_turn_cancelled_before_its_first_step_opens_and_ends_in_the_journal(
    model: ScriptedModel, make_engine: Any
) -> None:
    """A cancel that lands before the turn's task ran (a worker taking a prompt whose cancel
    came first) still journals the start, so the end record closes that turn and a store
    consumes the prompt with it; no model request is made (§6)."""
    persistence = MemoryPersistence()
    engine = await make_engine(persistence=persistence)
    turn = engine.prompt("never asked", turn_id="turn-1")
    turn.cancel()
    events, result = await run(turn)
    assert result.stop_reason == "cancelled"
    assert [e["type"] for e in events if e["type"] in ("text_delta", "tool_start")] == []
    assert model.requests == []
    # Two appends: the start, then the end that closes it.
    assert [m for m in persistence.marks[0] if "start" in m] == [{"start": "turn-1"}], persistence.marks
    assert persistence.marks[1:] == [[{"end": True}]], persistence.marks
    # The engine goes on: the next prompt runs, after the cancelled one.
    _, after = await run(engine.prompt("asked"))
    assert after.stop_reason == "end_turn"
    assert [m["content"] for m in model.requests[0].body["messages"]] == ["never asked", "asked"]


async def _waits_for_the_signal(input: Any, ctx: ToolContext) -> str:
    # `asyncio.wait_for` on Python 3.11 returns the inner result when the task is
    # cancelled in the loop iteration the signal's wait finished in: the cancel is swallowed.
    try:
        await asyncio.wait_for(ctx.signal.wait(), timeout=5)
    except asyncio.TimeoutError:
        return "slept"
    return "aborted"


async def _catches_the_cancel(input: Any, ctx: ToolContext) -> str:
    try:
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        return "stopped"
    return "slept"


@pytest.mark.parametrize("execute", [_waits_for_the_signal, _catches_the_cancel], ids=["wait_for", "catches"])
@pytest.mark.parametrize("order", ["steer-then-cancel", "cancel-then-steer", "cancel"])
async def test_a_cancel_a_tool_swallows_still_ends_the_turn_with_no_further_request(
    model: ScriptedModel, make_engine: Any, order: str, execute: Any
) -> None:
    """A tool that is not idempotent runs alone, in the turn's own task, so the cancel's
    `CancelledError` reaches the tool, which may swallow it. The turn still ends `cancelled`
    at once: no further model request, no further call, and the steer is not placed."""
    model.script(*[Reply(tool_call(f"t{i}", "wait", {})) for i in range(8)], Reply(text("done")))
    engine = await make_engine(tools=[Tool("wait", "w", SCHEMA, idempotent=False, execute=execute)])
    turn = engine.prompt("go")
    await asyncio.wait_for(next_event(turn, "tool_start"), 5)
    started = time.monotonic()
    if order == "steer-then-cancel":
        turn.steer("and then", id="steer-1")
        turn.cancel()
    else:
        turn.cancel()
        if order == "cancel-then-steer":
            with pytest.raises(FxInputError) as refused:
                turn.steer("and then", id="steer-1")
            assert refused.value.code == "FX_TURN_ENDED"
    rest, result = await run(turn, timeout_s=5)
    assert result.stop_reason == "cancelled"
    assert time.monotonic() - started < 1.0
    assert [e["type"] for e in rest if e["type"] in ("tool_start", "tool_end", "user_message")] == []
    assert len(model.requests) == 1
