"""Typed answers (`fxengine.output`) through the engine, against the scripted model server:
the final-result tool and the native response format, retries with the validation errors,
the types an answer may have, bad options, a repeated turn id, typed turns resumed from
their journaled verdicts (after a crash, a yield, a park), and the journal's batch
versions."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict  # pydantic takes typing's only from Python 3.12

from fxengine import FxInputError, MemoryPersistence, Tool, ToolContext, approve
from fxengine.journal.codec import decode_record
from fxengine.journal.records import decode_batch
from fxengine.models.openai_chat import RESUME_NOTICE
from fxengine.output import FINAL_RESULT_TOOL
from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call

from .conftest import run

TIMEOUT_S = 10.0


class Invoice(BaseModel):
    number: str
    total: float


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Address(TypedDict):
    city: str
    zip: str


class Cat(BaseModel):
    meows: int


class Dog(BaseModel):
    barks: int


INVOICE = {"number": "A-17", "total": 42.5}


def native_provider(model: ScriptedModel, *, structured: bool = True) -> dict[str, Any]:
    """The scripted model's provider, its catalog entry saying it takes a response format."""
    provider = dict(model.provider)
    models: dict[str, Any] = provider["models"]  # type: ignore[assignment]
    provider["models"] = {model.model_id: {**models[model.model_id], "supports_structured_output": structured}}
    return provider


def tool_names(request: Any) -> list[str]:
    return [t["function"]["name"] for t in request.body.get("tools") or []]


def final_result_tool(request: Any) -> dict[str, Any]:
    (tool,) = [t for t in request.body["tools"] if t["function"]["name"] == FINAL_RESULT_TOOL]
    return tool


def tool_messages(request: Any) -> list[dict[str, Any]]:
    return [m for m in request.body["messages"] if m["role"] == "tool"]


def first_asks(model: ScriptedModel) -> int:
    """How many requests carried only the prompt (the turn's first ask)."""
    return sum(1 for r in model.requests if [m["role"] for m in r.body["messages"]] == ["user"])


class Counter:
    """A tool that counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def tool(self) -> Tool:
        def execute(input: dict[str, Any], ctx: ToolContext) -> str:
            self.runs += 1
            return "looked up"

        return Tool("lookup", "Look something up.", {"type": "object", "properties": {"q": {"type": "string"}}},
                    idempotent=True, execute=execute)


# --- tool mode


async def test_a_valid_final_result_ends_the_turn_with_the_object(model: ScriptedModel, make_engine: Any) -> None:
    sink: list[dict[str, Any]] = []
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, INVOICE)))
    engine = await make_engine(output_type=Invoice, output_mode="tool", event_sink=sink.append)

    events, result = await run(engine.prompt("extract it"))

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(number="A-17", total=42.5)
    assert isinstance(result.output, Invoice)
    assert len(model.requests) == 1
    tool = final_result_tool(model.requests[0])
    assert tool["function"]["parameters"] == Invoice.model_json_schema()
    assert "response_format" not in model.requests[0].body
    (end,) = [e for e in sink if e["type"] == "turn_end"]
    assert end["stopReason"] == "end_turn" and end["output"] == INVOICE
    json.dumps(end)  # the body is plain JSON
    ends = [e for e in events if e["type"] == "tool_end"]
    assert [(e["name"], e["isError"]) for e in ends] == [(FINAL_RESULT_TOOL, False)]


async def test_an_invalid_answer_goes_back_with_the_errors_and_the_correction_ends_it(
        model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, {"number": "A-17"})),
                 Reply(tool_call("c2", FINAL_RESULT_TOOL, INVOICE)))
    engine = await make_engine(output_type=Invoice, output_mode="tool")

    _, result = await run(engine.prompt("extract it"))

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(**INVOICE)
    assert len(model.requests) == 2
    (answer,) = tool_messages(model.requests[1])
    assert answer["tool_call_id"] == "c1"
    assert "total" in answer["content"] and "Field required" in answer["content"]
    assert "validate as Invoice" in answer["content"]


async def test_answers_invalid_past_the_retries_end_the_turn_in_error(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, {"number": "A-17"})),
                 Reply(tool_call("c2", FINAL_RESULT_TOOL, {"total": "lots"})))
    engine = await make_engine(output_type=Invoice, output_mode="tool", output_retries=1)

    _, result = await run(engine.prompt("extract it"))

    assert result.stop_reason == "error" and result.output is None
    assert result.error is not None and result.error["code"] == "FX_OUTPUT_INVALID"
    errors = result.error["errors"]
    assert isinstance(errors, list) and errors
    # the last answer's errors: `number` missing, `total` not a number
    assert {tuple(e["loc"]) for e in errors} == {("number",), ("total",)}
    assert "2 attempts" in result.error["message"]
    assert len(model.requests) == 2


async def test_no_retries_ends_in_error_after_one_request(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, {"number": "A-17"})))
    engine = await make_engine(output_type=Invoice, output_mode="tool", output_retries=0)

    _, result = await run(engine.prompt("extract it"))

    assert result.stop_reason == "error"
    assert result.error is not None and result.error["code"] == "FX_OUTPUT_INVALID"
    assert [e["loc"] for e in result.error["errors"]] == [["total"]]
    assert len(model.requests) == 1


async def test_an_answer_in_text_is_asked_again_by_the_tool(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text(json.dumps(INVOICE))), Reply(tool_call("c1", FINAL_RESULT_TOOL, INVOICE)))
    engine = await make_engine(output_type=Invoice, output_mode="tool")

    _, result = await run(engine.prompt("extract it"))

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(**INVOICE)
    assert len(model.requests) == 2
    last = model.requests[1].body["messages"][-1]
    assert last["role"] == "user" and FINAL_RESULT_TOOL in last["content"]
    assert "answer in text is not taken" in last["content"]


async def test_a_valid_answer_beside_another_call_ends_the_turn_without_running_it(
        model: ScriptedModel, make_engine: Any) -> None:
    counter = Counter()
    model.script(Reply(tool_call("c1", "lookup", {"q": "x"}), tool_call("c2", FINAL_RESULT_TOOL, INVOICE)))
    engine = await make_engine(output_type=Invoice, output_mode="tool", tools=[counter.tool()])

    events, result = await run(engine.prompt("extract it"))

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(**INVOICE)
    assert counter.runs == 0
    assert len(model.requests) == 1
    assert tool_names(model.requests[0]) == ["lookup", FINAL_RESULT_TOOL]
    ends = {e["id"]: e for e in events if e["type"] == "tool_end"}
    assert "Not run" in ends["c1"]["content"] and not ends["c2"]["isError"]


async def test_an_invalid_answer_beside_another_call_runs_the_call(model: ScriptedModel, make_engine: Any) -> None:
    counter = Counter()
    model.script(Reply(tool_call("c1", "lookup", {"q": "x"}), tool_call("c2", FINAL_RESULT_TOOL, {"number": "1"})),
                 Reply(tool_call("c3", FINAL_RESULT_TOOL, INVOICE)))
    engine = await make_engine(output_type=Invoice, output_mode="tool", tools=[counter.tool()])

    _, result = await run(engine.prompt("extract it"))

    assert result.stop_reason == "end_turn", result.error
    assert counter.runs == 1
    answers = {m["tool_call_id"]: m["content"] for m in tool_messages(model.requests[1])}
    assert answers["c1"] == "looked up" and "total" in answers["c2"]


# --- native mode


async def test_native_mode_asks_by_response_format(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("```json\n", json.dumps(INVOICE), "\n```")))
    engine = await make_engine(provider=native_provider(model), output_type=Invoice)  # auto

    _, result = await run(engine.prompt("extract it"))

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(**INVOICE)
    body = model.requests[0].body
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "Invoice", "schema": Invoice.model_json_schema(), "strict": False}}
    assert FINAL_RESULT_TOOL not in tool_names(model.requests[0])


async def test_native_mode_retries_with_a_user_message(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text('{"number": "A-17"}')), Reply(text(json.dumps(INVOICE))))
    engine = await make_engine(provider=native_provider(model), output_type=Invoice)

    _, result = await run(engine.prompt("extract it"))

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(**INVOICE)
    assert len(model.requests) == 2
    messages = model.requests[1].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert "Your answer did not validate as Invoice" in messages[-1]["content"]
    assert "total" in messages[-1]["content"]
    assert model.requests[1].body["response_format"] == model.requests[0].body["response_format"]


async def test_native_mode_answer_that_is_not_json(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("It is A-17, 42.50.")))
    engine = await make_engine(provider=native_provider(model), output_type=Invoice, output_retries=0)

    _, result = await run(engine.prompt("extract it"))

    assert result.stop_reason == "error"
    assert result.error is not None and result.error["code"] == "FX_OUTPUT_INVALID"
    assert [e["type"] for e in result.error["errors"]] == ["json_invalid"]


async def test_auto_without_catalog_support_uses_the_tool(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, INVOICE)))
    engine = await make_engine(provider=native_provider(model, structured=False), output_type=Invoice)

    _, result = await run(engine.prompt("extract it"))

    assert result.output == Invoice(**INVOICE)
    assert FINAL_RESULT_TOOL in tool_names(model.requests[0])
    assert "response_format" not in model.requests[0].body


async def test_native_forced_on_a_model_without_catalog_support(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text(json.dumps(INVOICE))))
    engine = await make_engine(output_type=Invoice, output_mode="native")

    _, result = await run(engine.prompt("extract it"))

    assert result.output == Invoice(**INVOICE)
    assert "response_format" in model.requests[0].body


# --- types


async def test_a_dataclass_answer(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, {"x": 1, "y": 2})))
    engine = await make_engine(output_type=Point, output_mode="tool")

    _, result = await run(engine.prompt("where"))

    assert result.output == Point(1, 2)
    schema = final_result_tool(model.requests[0])["function"]["parameters"]
    assert schema["type"] == "object" and set(schema["required"]) == {"x", "y"}


async def test_a_typed_dict_answer(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, {"city": "Oslo", "zip": "0150"})))
    engine = await make_engine(output_type=Address, output_mode="tool")

    _, result = await run(engine.prompt("where"))

    assert result.output == {"city": "Oslo", "zip": "0150"}


async def test_a_union_is_wrapped_as_response(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, {"barks": 3})),  # not wrapped: refused
                 Reply(tool_call("c2", FINAL_RESULT_TOOL, {"response": {"barks": 3}})))
    engine = await make_engine(output_mode="tool")

    _, result = await run(engine.prompt("which pet", output_type=Cat | Dog))  # type: ignore[arg-type]

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Dog(barks=3)
    schema = final_result_tool(model.requests[0])["function"]["parameters"]
    assert schema["type"] == "object" and schema["required"] == ["response"]
    assert schema["properties"]["response"] == {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]}
    assert set(schema["$defs"]) == {"Cat", "Dog"}
    (answer,) = tool_messages(model.requests[1])
    assert '"response"' in answer["content"]


async def test_a_union_answer_natively(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text(json.dumps({"response": {"meows": 2}}))))
    engine = await make_engine(provider=native_provider(model))

    _, result = await run(engine.prompt("which pet", output_type=Cat | Dog))  # type: ignore[arg-type]

    assert result.output == Cat(meows=2)
    schema = model.requests[0].body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["response"] and set(schema["$defs"]) == {"Cat", "Dog"}


async def test_str_is_the_final_text(model: ScriptedModel, make_engine: Any) -> None:
    sink: list[dict[str, Any]] = []
    model.script(Reply(text("Just ", "text.")))
    engine = await make_engine(provider=native_provider(model), output_type=str, event_sink=sink.append)

    _, result = await run(engine.prompt("say it"))

    assert result.stop_reason == "end_turn" and result.output == "Just text."
    body = model.requests[0].body
    assert "response_format" not in body and FINAL_RESULT_TOOL not in tool_names(model.requests[0])
    (end,) = [e for e in sink if e["type"] == "turn_end"]
    assert end["output"] == "Just text."


async def test_a_type_named_module_colon_name(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, INVOICE)))
    engine = await make_engine(output_type=f"{__name__}:Invoice", output_mode="tool")

    _, result = await run(engine.prompt("extract it"))

    assert isinstance(result.output, Invoice) and result.output == Invoice(**INVOICE)
    assert engine.output is not None and engine.output.name == f"{__name__}:Invoice"


async def test_a_prompt_types_its_own_turn(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("plain")), Reply(tool_call("c1", FINAL_RESULT_TOOL, {"x": 3, "y": 4})))
    engine = await make_engine(output_mode="tool")

    _, untyped = await run(engine.prompt("hello"))
    _, typed = await run(engine.prompt("where", output_type=Point))

    assert untyped.output is None and untyped.stop_reason == "end_turn"
    assert typed.output == Point(3, 4)
    assert FINAL_RESULT_TOOL not in tool_names(model.requests[0])
    assert FINAL_RESULT_TOOL in tool_names(model.requests[1])


async def test_a_prompt_typed_turn_takes_the_engines_mode_and_retries(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text('{"x": 1}')), Reply(text('{"x": 1, "y": 2}')))
    engine = await make_engine(output_mode="native", output_retries=0)

    _, result = await run(engine.prompt("where", output_type=Point))

    assert "response_format" in model.requests[0].body  # native, as the engine was made
    assert result.stop_reason == "error" and len(model.requests) == 1  # no retry


# --- bad options


class Plain:
    def __init__(self, thing: object) -> None:
        self.thing = thing


@pytest.mark.parametrize("options", [{"output_mode": "x"}, {"output_retries": -1}, {"output_retries": 11},
                                     {"output_retries": True}, {"output_type": Invoice, "output_mode": "json"}])
async def test_bad_options_are_refused(model: ScriptedModel, make_engine: Any, options: dict[str, Any]) -> None:
    with pytest.raises(FxInputError) as info:
        await make_engine(**options)
    assert info.value.code == "FX_INVALID_INPUT"


@pytest.mark.parametrize("output_type", [Plain, "no_such_module_here:Thing", "nocolon", f"{__name__}:Missing"])
async def test_a_type_pydantic_cannot_take_is_refused(model: ScriptedModel, make_engine: Any,
                                                      output_type: object) -> None:
    with pytest.raises(FxInputError) as info:
        await make_engine(output_type=output_type)
    assert info.value.code == "FX_OUTPUT_TYPE_INVALID"


async def test_a_prompt_type_pydantic_cannot_take_is_refused(model: ScriptedModel, make_engine: Any) -> None:
    engine = await make_engine()
    with pytest.raises(FxInputError) as info:
        engine.prompt("x", output_type=Plain)
    assert info.value.code == "FX_OUTPUT_TYPE_INVALID"
    assert model.requests == []


async def test_a_user_tool_named_final_result_clashes_in_tool_mode(model: ScriptedModel, make_engine: Any) -> None:
    mine = Tool(FINAL_RESULT_TOOL, "mine", {"type": "object"}, idempotent=True, execute=lambda i, c: "x")
    with pytest.raises(FxInputError) as info:
        await make_engine(tools=[mine], output_type=Invoice, output_mode="tool")
    assert info.value.code == "FX_TOOL_INVALID"

    engine = await make_engine(tools=[mine], output_mode="tool")  # untyped: no clash
    with pytest.raises(FxInputError) as per_prompt:
        engine.prompt("x", output_type=Invoice)
    assert per_prompt.value.code == "FX_TOOL_INVALID"

    # native mode adds no tool, so the name is free
    await make_engine(tools=[mine], output_type=Invoice, output_mode="native")


# --- a repeated turn id


async def test_a_repeated_turn_id_answers_the_same_output(model: ScriptedModel, make_engine: Any) -> None:
    store = MemoryPersistence()
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, INVOICE)))
    engine = await make_engine(persistence=store, output_type=Invoice, output_mode="tool")
    _, first = await run(engine.prompt("extract it", turn_id="t1"))

    _, again = await run(engine.prompt("extract it", turn_id="t1"))

    assert again.repeated and not first.repeated
    assert again.stop_reason == "end_turn" and again.output == first.output == Invoice(**INVOICE)
    # and from the journal, by another engine
    other = await make_engine(persistence=store, output_type=Invoice, output_mode="tool")
    _, later = await run(other.prompt("extract it", turn_id="t1"))
    assert later.repeated and isinstance(later.output, Invoice) and later.output == Invoice(**INVOICE)
    assert len(model.requests) == 1


# --- crashes


async def crash(turn: Any) -> None:
    """The process running `turn` stops: nothing more of it is written."""
    turn.detach()
    result = await asyncio.wait_for(turn.result(), TIMEOUT_S)
    assert result.detached and result.stop_reason == "unknown"


@pytest.mark.parametrize("resumed_answer", ["valid", "invalid"])
async def test_a_crash_while_the_retry_is_asked_resumes_from_the_verdict(
        model: ScriptedModel, make_engine: Any, resumed_answer: str) -> None:
    store = MemoryPersistence()
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, {"number": "A-17"})),
                 Reply(hold("h"), tool_call("c2", FINAL_RESULT_TOOL, INVOICE)))
    first = await make_engine(persistence=store, output_type=Invoice, output_mode="tool", output_retries=1)
    turn = first.prompt("extract it", turn_id="t1")
    await asyncio.to_thread(model.wait_held, "h", TIMEOUT_S)
    await asyncio.wait_for(first.core.journal.flush(), TIMEOUT_S)
    await crash(turn)
    model.release("h")

    model.script(Reply(tool_call("c3", FINAL_RESULT_TOOL, INVOICE if resumed_answer == "valid" else {"total": 1})))
    second = await make_engine(persistence=store, output_type=Invoice, output_mode="tool", output_retries=1)
    resumed = second.resume()
    assert resumed is not None and resumed.turn_id == "t1"
    _, result = await run(resumed)

    assert len(model.requests) == 3
    assert first_asks(model) == 1  # the invalid answer's verdict was journaled: not asked again
    last = model.requests[2]
    (answer,) = tool_messages(last)
    assert answer["tool_call_id"] == "c1" and "total" in answer["content"] and "Field required" in answer["content"]
    assert last.body["messages"][-1] == {"role": "user", "content": RESUME_NOTICE}
    if resumed_answer == "valid":
        assert result.stop_reason == "end_turn", result.error
        assert result.output == Invoice(**INVOICE)
    else:
        # the retry before the crash counts: one more invalid answer is past output_retries=1
        assert result.stop_reason == "error"
        assert result.error is not None and result.error["code"] == "FX_OUTPUT_INVALID"
    assert second.open_turn is None


async def test_a_crash_in_native_mode_resumes_with_the_retry_message(model: ScriptedModel, make_engine: Any) -> None:
    store = MemoryPersistence()
    provider = native_provider(model)
    model.script(Reply(text('{"number": "A-17"}')), Reply(hold("h"), text(json.dumps(INVOICE))))
    first = await make_engine(provider=provider, persistence=store, output_type=Invoice)
    turn = first.prompt("extract it", turn_id="t1")
    await asyncio.to_thread(model.wait_held, "h", TIMEOUT_S)
    await asyncio.wait_for(first.core.journal.flush(), TIMEOUT_S)
    await crash(turn)
    model.release("h")

    model.script(Reply(text(json.dumps(INVOICE))))
    second = await make_engine(provider=provider, persistence=store, output_type=Invoice)
    resumed = second.resume()
    assert resumed is not None
    _, result = await run(resumed)

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(**INVOICE)
    assert len(model.requests) == 3 and first_asks(model) == 1
    messages = model.requests[2].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "user"]
    assert "did not validate as Invoice" in messages[2]["content"] and "total" in messages[2]["content"]
    assert messages[3]["content"] == RESUME_NOTICE
    assert "response_format" in model.requests[2].body


async def test_a_yielded_typed_turn_resumes_counting_its_retries(model: ScriptedModel, make_engine: Any) -> None:
    store = MemoryPersistence()
    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, {"number": "A-17"})))
    first = await make_engine(persistence=store, output_type=Invoice, output_mode="tool", output_retries=1)
    _, yielded = await run(first.prompt("extract it", turn_id="t1", yield_at=1))  # past: yields before the retry
    assert yielded.stop_reason == "yielded" and len(model.requests) == 1

    model.script(Reply(tool_call("c2", FINAL_RESULT_TOOL, {"number": "A-18"})))
    second = await make_engine(persistence=store, output_type=Invoice, output_mode="tool", output_retries=1)
    resumed = second.resume()
    assert resumed is not None
    _, result = await run(resumed)

    assert result.stop_reason == "error"
    assert result.error is not None and result.error["code"] == "FX_OUTPUT_INVALID"
    assert len(model.requests) == 2  # the answer before the yield was the one retry
    (answer,) = tool_messages(model.requests[1])
    assert answer["tool_call_id"] == "c1" and "total" in answer["content"]


async def test_a_parked_typed_turn_counts_its_retry_across_the_park(model: ScriptedModel, make_engine: Any) -> None:
    runs: list[object] = []
    refund = Tool("refund", "Refund.", {"type": "object"}, idempotent=False, approval=True,
                  execute=lambda input, ctx: runs.append(input) or "refunded")
    store = MemoryPersistence()
    model.script(Reply(tool_call("c1", "refund", {}), tool_call("f1", FINAL_RESULT_TOOL, {"number": "1"})),
                 Reply(tool_call("f2", FINAL_RESULT_TOOL, {"number": "2"})))
    first = await make_engine(persistence=store, tools=[refund], output_type=Invoice, output_mode="tool")
    _, parked = await run(first.prompt("refund and report", turn_id="t1"))
    assert parked.stop_reason == "paused" and len(model.requests) == 1

    second = await make_engine(persistence=store, tools=[refund], output_type=Invoice, output_mode="tool")
    _, result = await run(second.resume(decisions={"c1": approve()}))

    assert runs == [{}]
    assert result.stop_reason == "error"
    assert result.error is not None and result.error["code"] == "FX_OUTPUT_INVALID"
    assert len(model.requests) == 2  # the answer beside the parked call was the one retry
    answers = {m["tool_call_id"]: m["content"] for m in tool_messages(model.requests[1])}
    assert answers["c1"] == "refunded" and "total" in answers["f1"]


class EndLostStore(MemoryPersistence):
    """A store whose writer dies between a typed answer's verdict and its turn's end.

    The call storing step 2's request is held (after it is stored) until `let_go()`; while
    it is held the engine queues step 2's response and verdict behind it. The next call,
    holding that verdict, is stored and then fails as the process dies, so the `turn_end`
    committed after it is never written.
    """

    def __init__(self) -> None:
        super().__init__()
        self._held = asyncio.Event()
        self.lost = asyncio.Event()
        self.batches: list[list[str]] = []

    def let_go(self) -> None:
        self._held.set()

    async def append(self, **kwargs: Any) -> str:
        kinds = [kind for kind, _ in decode_batch(kwargs["data"])]
        self.batches.append(kinds)
        steps = [body.get("step") for kind, body in decode_batch(kwargs["data"]) if kind == "model_request"]
        cursor = await super().append(**kwargs)
        if 2 in steps:
            # A bare wait: `wait_for` would add a task, and its extra loop turns would let
            # the turn's end join the verdict's call.
            async with asyncio.timeout(TIMEOUT_S):
                await self._held.wait()
        elif "output" in kinds and len([b for b in self.batches if "output" in b]) == 2:
            self.lost.set()
            raise ConnectionError("the process died")
        return cursor


async def test_a_valid_answer_stored_without_its_end_ends_on_resume_without_a_request(
        model: ScriptedModel, make_engine: Any) -> None:
    store = EndLostStore()

    def sink(event: dict[str, Any]) -> None:
        if event["type"] == "tool_end" and event["name"] == FINAL_RESULT_TOOL and event["step"] == 2:
            store.let_go()  # the verdict is queued: the held call returns and takes it

    model.script(Reply(tool_call("c1", FINAL_RESULT_TOOL, {"number": "A-17"})),
                 Reply(tool_call("c2", FINAL_RESULT_TOOL, INVOICE)))
    first = await make_engine(persistence=store, output_type=Invoice, output_mode="tool", event_sink=sink)
    turn = first.prompt("extract it", turn_id="t1")
    await asyncio.wait_for(store.lost.wait(), TIMEOUT_S)
    turn.detach()
    await asyncio.wait_for(turn.result(), TIMEOUT_S)

    verdict_batch = [b for b in store.batches if "output" in b][-1]
    assert "turn_end" not in verdict_batch, store.batches  # the state this test is about
    assert not any("turn_end" in b for b in store.batches)
    assert len(model.requests) == 2

    second = await make_engine(persistence=store, output_type=Invoice, output_mode="tool")
    assert second.open_turn is not None and second.open_turn["turnId"] == "t1"
    resumed = second.resume()
    assert resumed is not None
    _, result = await run(resumed)

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(**INVOICE)
    assert len(model.requests) == 2  # the valid answer was not asked for again
    assert second.open_turn is None


# --- the journal's format versions


class KeepingStore(MemoryPersistence):
    """Keeps the bytes of every call (a checkpoint drops the stored records)."""

    def __init__(self) -> None:
        super().__init__()
        self.appended: list[bytes] = []

    async def append(self, **kwargs: Any) -> str:
        self.appended.append(kwargs["data"])
        return await super().append(**kwargs)


def batch_versions(data: list[bytes]) -> list[tuple[int, list[str]]]:
    """(format version, event kinds) of each stored batch."""
    out = []
    for raw in data:
        kind, body = decode_record(raw)
        assert kind == "batch"
        out.append((body["v"], [k for k, _ in decode_batch(raw)]))
    return out


async def test_a_batch_with_a_verdict_is_format_2_and_others_format_1(model: ScriptedModel, make_engine: Any) -> None:
    store = KeepingStore()
    model.script(Reply(text("plain")), Reply(tool_call("c1", FINAL_RESULT_TOOL, INVOICE)))
    engine = await make_engine(persistence=store, output_mode="tool")
    await run(engine.prompt("hello"))
    untyped = len(store.appended)
    _, result = await run(engine.prompt("extract it", output_type=Invoice))
    assert result.output == Invoice(**INVOICE)

    versions = batch_versions(store.appended)
    assert untyped >= 1 and all(v == 1 for v, _ in versions[:untyped])
    typed = versions[untyped:]
    assert [v for v, kinds in typed if "output" in kinds] == [2]
    assert all(v == 1 for v, kinds in typed if "output" not in kinds)
    assert any("output" not in kinds for _, kinds in typed)  # the turn's start, at least
    ends = [body for raw in store.appended for kind, body in decode_batch(raw) if kind == "turn_end"]
    assert "output" not in ends[0] and ends[1]["output"] == INVOICE
