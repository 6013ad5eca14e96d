from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx

from fxengine import MemoryPersistence, Tool, create_engine, tool
from fxengine.testing import Reply, ScriptedModel, delay, reasoning, text, tool_call, usage

from .conftest import Diagnostics, run, text_of, wait_until

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


@tool(idempotent=True)
def lookup(query: str) -> str:
    """Looks a query up."""
    return f"found {query}"


async def test_a_two_step_tool_turn_streams_runs_the_tool_and_answers(model: ScriptedModel, make_engine: Any) -> None:
    model.script(
        Reply(text("Let me ", "check."), tool_call("call_1", "lookup", {"query": "lisbon"}, pieces=3), usage(10, 4)),
        Reply(text("It is ", "sunny."), usage(20, 3, cache_read_tokens=5)),
    )
    engine = await make_engine(tools=[lookup], instructions="Be brief.")
    events, result = await run(engine.prompt("Weather in Lisbon?"))

    assert [e["type"] for e in events] == [
        "text_delta", "text_delta", "tool_start", "tool_end", "text_delta", "text_delta"]
    assert text_of(events) == "Let me check.It is sunny."
    assert events[2] == {"type": "tool_start", "id": "call_1", "name": "lookup", "input": {"query": "lisbon"}, "step": 1}
    assert events[3]["content"] == "found lisbon" and events[3]["isError"] is False
    assert [e["step"] for e in events if e["type"] == "text_delta"] == [1, 1, 2, 2]
    assert result.stop_reason == "end_turn" and result.error is None
    assert result.usage == {"inputTokens": 30, "outputTokens": 7, "cacheReadTokens": 5}

    first, second = (r.body for r in model.requests)
    assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
    assert first["messages"][0] == {"role": "system", "content": "Be brief."}
    assert first["tools"][0]["function"]["name"] == "lookup"
    assert first["tools"][0]["function"]["parameters"]["required"] == ["query"]
    assert second["messages"][-2]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"query":"lisbon"}'}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "found lisbon"}


async def test_a_second_prompt_carries_the_history(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("one")), Reply(text("two")))
    engine = await make_engine()
    await run(engine.prompt("first"))
    await run(engine.prompt("second"))
    messages = model.requests[1].body["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [("user", "first"), ("assistant", "one"), ("user", "second")]


async def test_reasoning_deltas_are_events(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(reasoning("think", "ing"), text("answer"), usage(3, 4, reasoning_tokens=2)))
    engine = await make_engine()
    events, result = await run(engine.prompt("q"))
    assert [(e["type"], e["delta"]) for e in events] == [
        ("reasoning_delta", "think"), ("reasoning_delta", "ing"), ("text_delta", "answer")]
    assert result.usage == {"inputTokens": 3, "outputTokens": 4, "reasoningTokens": 2}


async def test_stop_reasons_of_the_model(model: ScriptedModel, make_engine: Any) -> None:
    engine = await make_engine(tools=[lookup])
    model.script(Reply(text("cut"), finish_reason="length"))
    assert (await run(engine.prompt("a")))[1].stop_reason == "max_output_tokens"
    model.script(Reply(text(""), finish_reason="content_filter"))
    assert (await run(engine.prompt("b")))[1].stop_reason == "refused"


async def test_max_model_turns_stops_a_tool_loop(model: ScriptedModel, make_engine: Any) -> None:
    model.responder = lambda request: Reply(tool_call(f"c{len(request.body['messages'])}", "lookup", {"query": "again"}))
    engine = await make_engine(tools=[lookup], max_model_turns=3)
    events, result = await run(engine.prompt("loop"))
    assert result.stop_reason == "max_model_turns"
    assert len(model.requests) == 3
    assert len([e for e in events if e["type"] == "tool_end"]) == 3


async def test_a_provider_error_ends_the_turn_with_error(model: ScriptedModel, make_engine: Any) -> None:
    from fxengine.testing import http_error

    model.script(http_error(400, "bad request: no such field"))
    engine = await make_engine()
    _, result = await run(engine.prompt("q"))
    assert result.stop_reason == "error"
    assert result.error is not None and result.error["code"] == "FX_PROVIDER_REJECTED"
    assert "no such field" in result.error["message"]
    # the engine stays usable
    model.script(Reply(text("fine")))
    assert (await run(engine.prompt("again")))[1].stop_reason == "end_turn"


async def test_tool_results_json_images_errors_and_bad_calls(model: ScriptedModel, make_engine: Any) -> None:
    def as_json(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"n": input["n"], "ok": True}

    async def picture(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"type": "fx.tool-result", "text": "a picture", "images": [{"data": base64.b64encode(PNG).decode()}]}

    def broken(input: dict[str, Any], ctx: Any) -> str:
        raise RuntimeError("the disk is on fire")

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    tools = [
        Tool("as_json", "JSON", schema, idempotent=True, execute=as_json),
        Tool("picture", "image", schema, idempotent=True, execute=picture),
        Tool("broken", "raises", schema, idempotent=True, execute=broken),
    ]
    model.script(
        Reply(
            tool_call("a", "as_json", {"n": 2}),
            tool_call("b", "picture", {}),
            tool_call("c", "broken", {}),
            tool_call("d", "nonexistent", {}),
            tool_call("e", "as_json", "{not json"),
        ),
        Reply(text("ok")),
    )
    engine = await make_engine(tools=tools)
    events, result = await run(engine.prompt("go"))
    ends = {e["id"]: e for e in events if e["type"] == "tool_end"}
    assert json.loads(ends["a"]["content"]) == {"n": 2, "ok": True} and not ends["a"]["isError"]
    assert ends["b"]["content"] == "a picture" and not ends["b"]["isError"]
    assert ends["c"] == {**ends["c"], "isError": True, "content": "the disk is on fire"}
    assert ends["d"]["isError"] and "unknown tool" in ends["d"]["content"]
    assert ends["e"]["isError"] and "not valid JSON" in ends["e"]["content"]
    assert result.stop_reason == "end_turn"
    messages = model.requests[1].body["messages"]
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ["a", "b", "c", "d", "e"]
    image_parts = [p for m in messages if m["role"] == "user" and isinstance(m["content"], list) for p in m["content"]
                   if p["type"] == "image_url"]
    assert image_parts[0]["image_url"]["url"].startswith("data:image/png;base64,")


async def test_tool_ctx_carries_session_context_epoch_and_execution_id(model: ScriptedModel, make_engine: Any) -> None:
    seen: list[Any] = []

    @tool(idempotent=False)
    def record(note: str, ctx: Any) -> str:
        """Records the context."""
        seen.append((note, ctx.execution_id, ctx.session_id, ctx.context, ctx.epoch, ctx.signal.aborted))
        return "ok"

    model.script(Reply(tool_call("call_9", "record", {"note": "n"})), Reply(text("done")))
    engine = await make_engine(tools=[record], session_id="ses_1", context={"user": 7}, epoch=4)
    turn = engine.prompt("go", turn_id="turn_a")
    await run(turn)
    assert seen == [("n", "ses_1:turn_a:1:call_9", "ses_1", {"user": 7}, 4, False)]


async def test_a_checkpoint_restores_the_conversation(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("remembered")), Reply(text("yes")))
    engine = await make_engine()
    await run(engine.prompt("remember 42"))
    data = engine.checkpoint()
    assert isinstance(data, bytes) and len(data) < 4 * 1024 * 1024
    restored = await make_engine(checkpoint=data)
    await run(restored.prompt("what number?"))
    contents = [m["content"] for m in model.requests[1].body["messages"]]
    assert contents == ["remember 42", "remembered", "what number?"]


async def test_event_sink_gets_every_event_in_order(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("a", "b"), tool_call("c", "lookup", {"query": "q"})), Reply(text("c")))
    sunk: list[dict[str, Any]] = []
    engine = await make_engine(tools=[lookup], event_sink=sunk.append)
    turn = engine.prompt("q")
    events, result = await run(turn)
    # The turn's events, then its end (which iteration does not yield).
    assert sunk[:-1] == events and len(events) == 5
    assert sunk[-1] == {"type": "turn_end", "turnId": turn.turn_id, "stopReason": "end_turn", "usage": result.usage}


async def test_a_failing_event_sink_is_a_ui_error_and_the_turn_goes_on(model: ScriptedModel, make_engine: Any,
                                                                       diagnostics: Diagnostics) -> None:
    model.script(Reply(text("fine")))

    def sink(event: dict[str, Any]) -> None:
        raise OSError("the UI store is away")

    engine = await make_engine(event_sink=sink)
    events, result = await run(engine.prompt("q"))
    assert result.stop_reason == "end_turn" and text_of(events) == "fine"
    assert diagnostics.of("ui.error") and diagnostics.of("ui.error")[0]["error"] == "OSError"


async def test_event_sink_hears_a_yield_before_the_yield_record_is_appended(
    model: ScriptedModel, make_engine: Any
) -> None:
    model.script(Reply(tool_call("c", "lookup", {"query": "q"})), Reply(text("after")))
    order: list[str] = []
    sunk: list[dict[str, Any]] = []

    class OrderedPersistence(MemoryPersistence):
        """A store that notes each append's marks (a `Persistence` of the test's own)."""

        async def append(self, **kwargs: Any) -> str:
            order.append("append:" + ",".join(sorted(k for m in kwargs["marks"] for k in m)))
            return await super().append(**kwargs)

    def sink(event: dict[str, Any]) -> None:
        sunk.append(event)
        order.append(f"sink:{event['type']}")

    journal = OrderedPersistence()
    engine = await make_engine(tools=[lookup], event_sink=sink, persistence=journal)
    turn = engine.prompt("q", yield_at=0)
    _, result = await run(turn)
    assert result.stop_reason == "yielded"
    assert sunk[-1] == {"type": "turn_yield", "turnId": turn.turn_id}
    yield_append = next(i for i, o in enumerate(order) if o.startswith("append:") and "yield" in o)
    assert order.index("sink:turn_yield") < yield_append


async def test_an_unread_turn_finishes_when_its_result_is_awaited(model: ScriptedModel, make_engine: Any,
                                                                  diagnostics: Diagnostics) -> None:
    model.script(Reply(text(*["x"] * 600)))
    engine = await make_engine()
    turn = engine.prompt("q")
    # nobody reads: production pauses at the bound ...
    await wait_until(lambda: bool(diagnostics.of("output.backpressure")))
    assert diagnostics.of("output.backpressure")[0]["bufferedEvents"] == 256
    assert not turn.done
    # ... and awaiting the result lifts it
    result = await asyncio.wait_for(turn.result(), 10)
    assert result.stop_reason == "end_turn"
    events = [e async for e in turn]
    assert len(events) == 600  # lossless


async def test_a_slow_reader_pauses_the_stream_without_loss(model: ScriptedModel, make_engine: Any,
                                                            diagnostics: Diagnostics) -> None:
    model.script(Reply(text(*[str(i % 10) for i in range(1000)])))
    engine = await make_engine()
    turn = engine.prompt("q")
    got = []
    async for event in turn:
        got.append(event["delta"])
        if len(got) == 1:
            # The reader stops after one event: the turn fills its buffer and pauses,
            # and says so, before the rest of the stream is taken.
            deadline = asyncio.get_running_loop().time() + 5
            while not diagnostics.of("output.backpressure"):
                assert asyncio.get_running_loop().time() < deadline, "the turn never paused"
                await asyncio.sleep(0.005)
    assert "".join(got) == "".join(str(i % 10) for i in range(1000))
    (paused,) = diagnostics.of("output.backpressure")
    assert paused["bufferedEvents"] >= 256 or paused["bufferedBytes"] >= 1024 * 1024


async def test_transport_diagnostics(model: ScriptedModel, make_engine: Any, diagnostics: Diagnostics) -> None:
    model.script(Reply(text("a"), delay(300), text("b"), delay(300), text("c")))
    engine = await make_engine()
    await run(engine.prompt("q"))
    kinds = [e["type"] for e in diagnostics if e["type"].startswith("transport.")]
    assert kinds[0] == "transport.start"
    response = diagnostics.of("transport.response")[0]
    assert response["status"] == 200 and isinstance(response["elapsedMs"], int)
    activity = diagnostics.of("transport.activity")
    assert 1 <= len(activity) <= 3 and all(a["totalBytes"] > 0 for a in activity)


async def test_many_engines_share_one_client_on_one_loop(model: ScriptedModel) -> None:
    model.responder = lambda request: Reply(text("hi ", request.body["messages"][-1]["content"]), delay(50), text("!"))
    async with httpx.AsyncClient() as client:
        engines = [await create_engine(model.model_id, provider=model.provider, http_client=client) for _ in range(40)]
        turns = [e.prompt(f"n{i}") for i, e in enumerate(engines)]
        outcomes = await asyncio.wait_for(asyncio.gather(*(run(t) for t in turns)), 15)
        assert [text_of(events) for events, _ in outcomes] == [f"hi n{i}!" for i in range(40)]
        for engine in engines:
            await engine.close()
        assert not client.is_closed


async def test_a_settled_checkpoint_is_the_state_through_the_record_on_its_way(
    model: ScriptedModel, make_engine: Any
) -> None:
    """`settled_checkpoint()`, asked as each record is appended: None while a turn is open,
    and as the turn's end record goes, exactly what `checkpoint()` gives after the turn
    (a store may keep it instead of the records, fxworker's release at rest does)."""
    model.script(Reply(tool_call("c", "lookup", {"query": "q"})), Reply(text("done")))
    asked: list[tuple[list[str], bytes | None]] = []
    engine: Any = None

    class AskingPersistence(MemoryPersistence):
        async def append(self, **kwargs: Any) -> str:
            asked.append((sorted(k for m in kwargs["marks"] for k in m), engine.settled_checkpoint()))
            return await super().append(**kwargs)

    engine = await make_engine(tools=[lookup], persistence=AskingPersistence())
    await run(engine.prompt("q"))
    *during, (end_marks, at_end) = asked
    assert "end" in end_marks and during and all(data is None for _, data in during)
    assert at_end == engine.checkpoint()
    restored = await make_engine(tools=[lookup], checkpoint=at_end)
    assert restored.checkpoint() == at_end
