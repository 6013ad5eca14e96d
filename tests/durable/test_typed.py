"""Typed answers of durable turns (docs/design.md §4 "Typed answers"), on the embedded
store (the production Lua on fakeredis) and a real Redis, with in-process workers.

An agent's `output_type` (or a prompt's own, imported on the worker by its stored name)
makes each turn's answer an object: the model answers by calling `final_result` (tool
mode) or in JSON text (native mode); an answer that does not validate goes back to it
with the errors, at most `output_retries` times, then the turn ends `error`
`FX_OUTPUT_INVALID`. The answer is on the `turn_end` line as JSON and in
`TurnResult.output` as an instance of the type. The real-worker and kill -9 tests are in
tests/durable/test_typed_celery.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pydantic import BaseModel

from fxengine import Tool, ToolContext
from fxengine.errors import FxInputError
from fxengine.output import Output
from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call
from fxworker import Agent, Settings, embedded
from fxworker.embedded import InProcessWaker
from fxworker.errors import FxUnknownSessionError
from fxworker.store import embedded_store, redis_store
from fxworker.store.types import DELEGATED_LEVEL, TYPED_LEVEL, Claim, Newer
from tests.durable.conftest import stored_lines, system_text
from tests.durable.tooling import provider
from tests.durable.typed_models import Invoice, Receipt
from tests.support.redis_server import delete_prefix

pytestmark = pytest.mark.timeout(60)

TURN_S = 15.0
# What the engine writes into a conversation (retries, a resume): never a turn's prompt.
ENGINE_TEXTS = ("Your answer did not validate", "Give your answer by calling", "Resuming from")
ERRORS_MARK = "did not validate as"


# ------------------------------------------------------------------------ the model


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def prompt_of(request: Any) -> str:
    """The prompt of the turn a recorded request belongs to (the last user message the
    engine did not write itself)."""
    for message in reversed(request.body.get("messages") or []):
        if message.get("role") == "user" and not _content(message).startswith(ENGINE_TEXTS):
            return _content(message)
    return ""


def turn_messages(request: Any) -> list[dict[str, Any]]:
    """The messages after the turn's prompt."""
    messages = request.body.get("messages") or []
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user" and not _content(messages[i]).startswith(ENGINE_TEXTS):
            return messages[i + 1:]
    return []


def told_errors(request: Any) -> list[str]:
    """The validation errors the model is shown in this turn (a final-result call's result,
    or a user message in native mode)."""
    return [_content(m) for m in turn_messages(request) if ERRORS_MARK in _content(m)]


def tool_names(request: Any) -> list[str]:
    return [t["function"]["name"] for t in request.body.get("tools") or []]


def wrapped(request: Any) -> bool:
    """Whether the request's schema wraps the type as `{"response": ...}` (a union's root
    is not an object)."""
    if "response_format" in request.body:
        schema = request.body["response_format"]["json_schema"]["schema"]
    else:
        schema = next((t["function"]["parameters"] for t in request.body.get("tools") or []
                       if t["function"]["name"] == "final_result"), {})
    return list(schema.get("properties") or {}) == ["response"]


def answer(request: Any, obj: dict[str, Any], *also: Any) -> Reply:
    """`obj` as the request asks for it: JSON text for a response format, else a call of
    `final_result` (and the parts `also` after it, in the same response: other calls, a
    hold before its end)."""
    if wrapped(request):
        obj = {"response": obj}
    if "response_format" in request.body:
        return Reply(text(json.dumps(obj)))
    return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "final_result", obj), *also)


def responder(request: Any) -> Reply:
    """Driven by the agent (its instructions) and the turn's prompt `<kind>:<arg>`:

    - triage: calls `billing` with the prompt's `<arg>`; after the result, `answer: <it>`
      (typed: the receipt `{shop: triage, items: [<it>]}`);
    - `valid:<n>`: the invoice `{number: n, total: 42}`;
    - `fix:<n>`: `{number: n}` (no total) until the model was shown errors, then `{n, 7}`;
    - `bad:<n>`: `{number: n}`, every time;
    - `badheld:<n>`: as `bad`, after a `hold(<n>)` once the model was shown errors twice;
    - `receipt:<shop>`: the receipt `{shop, items: [tea, cake]}`;
    - `heldreceipt:<shop>`: that receipt, after a `hold(<shop>)`;
    - `heldvalid:<n>`: "thinking ", a `hold(<n>)`, then the invoice;
    - `chat:<n>`: text (no final result) until told to call it, then the invoice;
    - `garbled:<n>`: final-result arguments that are not JSON, then the invoice;
    - `note:<n>` / `badnote:<n>`: the invoice (without its total) and a call of `note` in
      one response; after the note's result, the invoice;
    - anything else: an untyped turn's `echo:<prompt>`, a typed one's invoice of that number.
    """
    prompt = prompt_of(request)
    if "You are triage." in system_text(request):
        results = [_content(m) for m in turn_messages(request) if m.get("role") == "tool"]
        if results and "final_result" in tool_names(request):  # a prompt that typed its own turn
            return answer(request, {"shop": "triage", "items": results})
        if results:
            return Reply(text("answer: " + results[-1]))
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "billing", {"input": prompt.partition(":")[2]}))
    kind, _, arg = prompt.partition(":")
    typed = "response_format" in request.body or "final_result" in tool_names(request)
    if kind == "fix":
        return answer(request, {"number": arg, "total": 7} if told_errors(request) else {"number": arg})
    if kind == "bad":
        return answer(request, {"number": arg})
    if kind == "badheld":
        return answer(request, {"number": arg}, *([hold(arg)] if len(told_errors(request)) == 2 else []))
    if kind == "receipt":
        return answer(request, {"shop": arg, "items": ["tea", "cake"]})
    if kind == "heldvalid":
        return Reply(text("thinking "), hold(arg), *answer(request, {"number": arg, "total": 42}).parts)
    if kind == "heldreceipt":
        return Reply(hold(arg), *answer(request, {"shop": arg, "items": ["tea", "cake"]}).parts)
    if kind == "chat":
        told = any(_content(m).startswith("Give your answer by calling") for m in turn_messages(request))
        return answer(request, {"number": arg, "total": 3}) if told else Reply(text(f"The invoice is {arg}."))
    if kind == "garbled":
        if told_errors(request):
            return answer(request, {"number": arg, "total": 5})
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "final_result", '{"number": "' + arg))
    if kind in ("note", "badnote"):
        if any(m.get("role") == "tool" and m.get("name", "note") == "note" and _content(m).startswith("noted")
               for m in turn_messages(request)):
            return answer(request, {"number": arg, "total": 9})
        note = tool_call(f"call_{uuid.uuid4().hex[:8]}", "note", {"text": arg})
        return answer(request, {"number": arg, "total": 8} if kind == "note" else {"number": arg}, note)
    if kind == "valid" or typed:
        return answer(request, {"number": arg or prompt, "total": 42})
    return Reply(text("echo:" + prompt))


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


def asked(model: ScriptedModel, prompt: str) -> list[Any]:
    """The model requests of the turns whose prompt is `prompt`, in order."""
    return [r for r in model.requests if prompt_of(r) == prompt]


def tag() -> str:
    return uuid.uuid4().hex[:8]


# ------------------------------------------------------------------------ the agents


class Typed:
    """One store and its agents: `invoicer` (answers an `Invoice`), `patient` (the same,
    two retries), `plain` (untyped), `native` (an `Invoice` by response format),
    `structured` (auto mode on a model whose catalog entry takes a response format),
    `noter` (an `Invoice`, with a tool `note` whose runs are in `notes`), `either` (an
    `Invoice` or a `Receipt`), `texter` (`str`), `billing` (an `Invoice`) and `triage`
    (untyped, delegating to `billing`)."""

    def __init__(self, agents: dict[str, Agent], prefix: str, notes: list[str]) -> None:
        self.agents = agents
        self.prefix = prefix
        self.notes = notes

    def __getattr__(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def store(self) -> Any:
        return self.agents["plain"].store


@contextmanager
def make_typed(model: ScriptedModel, url: str | None, *, workers: int = 2) -> Iterator[Typed]:
    prefix = f"fxe{uuid.uuid4().hex[:8]}"
    store = redis_store(url, prefix=prefix) if url else embedded_store(prefix=prefix)
    common: dict[str, Any] = dict(model="scripted", provider=provider(model.base_url), api_key="test-key",
                                  store=store, waker=InProcessWaker(start_workers=False),
                                  settings=Settings(lease_s=2.0, reserve_s=4.0, sweep_s=0.5))
    structured_provider = provider(model.base_url)
    structured_provider["models"] = {"scripted": {**structured_provider["models"]["scripted"],
                                                  "supports_structured_output": True}}
    notes: list[str] = []

    def note(input: Any, ctx: ToolContext) -> str:
        notes.append(ctx.execution_id)
        return f"noted {input['text']}"

    note_tool = Tool("note", "Notes something down.", {"type": "object", "properties": {"text": {"type": "string"}}},
                     idempotent=False, execute=note)
    billing = Agent("billing", instructions="You are billing.", output_type=Invoice, **common)
    agents = [
        Agent("invoicer", instructions="You are invoicer.", output_type=Invoice, **common),
        Agent("patient", instructions="You are patient.", output_type=Invoice, output_retries=2, **common),
        Agent("plain", instructions="You are plain.", **common),
        Agent("native", instructions="You are native.", output_type=Invoice, output_mode="native", **common),
        Agent("structured", instructions="You are structured.", output_type=Invoice,
              **{**common, "provider": structured_provider}),
        Agent("noter", instructions="You are noter.", output_type=Invoice, tools=[note_tool], **common),
        Agent("either", instructions="You are either.", output_type=Invoice | Receipt, **common),
        Agent("texter", instructions="You are texter.", output_type=str, **common),
        billing,
        Agent("triage", instructions="You are triage.", tools=[billing.as_tool()], **common),
    ]
    if workers:
        embedded.start_embedded_workers(workers)
    try:
        yield Typed({a.name: a for a in agents}, prefix, notes)
    finally:
        embedded.stop_embedded_workers()
        for a in agents:
            a.close()
        if url:
            delete_prefix(url, prefix)


@pytest.fixture(params=["fakeredis", "redis"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("redis_url") if request.param == "redis" else None


@pytest.fixture
def typed(store_url: str | None, model: ScriptedModel) -> Iterator[Typed]:
    with make_typed(model, store_url) as t:
        yield t


def of_type(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["type"] == kind]


def final_results(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `tool_end` lines of `final_result` calls (each answer in tool mode has one)."""
    return [line for line in of_type(lines, "tool_end") if line["name"] == "final_result"]


async def _lines_until(agent: Agent, session_id: str, cond: Any) -> list[dict[str, Any]]:
    """The session's stored lines once `cond(lines)` holds (polled every 20 ms)."""
    while not cond(lines := await stored_lines(agent, session_id)):
        await asyncio.sleep(0.02)
    return lines


async def wait_end(agent: Agent, session_id: str, message_id: str) -> dict[str, Any]:
    """The `turn_end` line of `message_id`, once stored (the store is polled every 20 ms)."""
    async def ended() -> dict[str, Any]:
        while True:
            for line in await stored_lines(agent, session_id):
                if line["type"] == "turn_end" and line.get("messageId") == message_id:
                    return line
            await asyncio.sleep(0.02)
    return await asyncio.wait_for(ended(), TURN_S)


# ------------------------------------------------------------------------ tests


async def test_an_agents_type_answers_with_the_object_on_the_first_try(typed: Typed, model: ScriptedModel) -> None:
    session = typed.invoicer.session()
    prompt = f"valid:A-{tag()}"
    turn = await session.prompt(prompt)
    result = await asyncio.wait_for(turn.result(), TURN_S)
    number = prompt[6:]
    assert result.stop_reason == "end_turn", result
    assert isinstance(result.output, Invoice) and result.output == Invoice(number=number, total=42)
    lines = await stored_lines(typed.invoicer, session.id)
    [end] = of_type(lines, "turn_end")
    assert end["output"] == {"number": number, "total": 42} and "error" not in end
    assert [(t["isError"], t["content"]) for t in final_results(lines)] == [(False, "Final result taken.")]
    [request] = asked(model, prompt)
    [final] = [t for t in request.body["tools"] if t["function"]["name"] == "final_result"]
    assert final["function"]["parameters"] == Output(Invoice).schema
    assert "response_format" not in request.body


async def test_a_typed_input_is_stored_with_its_type_by_name_and_needs_the_typed_level(
        store_url: str | None, model: ScriptedModel) -> None:
    """Stored before any worker runs: the agent's type as `@agent`, a prompt's own by its
    import path, each with its mode and retries; meta `newer` is `TYPED_LEVEL`, so a
    process that reads only delegated turns (level 3) takes nothing, and this release's
    claim takes both. Once let go, workers run both."""
    with make_typed(model, store_url, workers=0) as typed:
        session = typed.patient.session()
        own, agents = f"receipt:R-{tag()}", f"valid:B-{tag()}"
        first = await session.prompt(agents)
        second = await session.prompt(own, output_type=Receipt)
        store = typed.store
        state = await store.state(session.id)
        assert state is not None and state.newer == TYPED_LEVEL and state.pending == 2, state
        older = await store.claim(session.id, holder="old", lease_ms=2000, only_work=True, reads=DELEGATED_LEVEL)
        assert isinstance(older, Newer) and older.level == TYPED_LEVEL
        claim = await store.claim(session.id, holder="peek", lease_ms=2000, only_work=True)
        assert isinstance(claim, Claim)
        assert [(i.message_id, i.settings) for i in claim.pending] == [
            (first.message_id, {"output": {"v": 1, "type": "@agent", "mode": "auto", "retries": 2}}),
            (second.message_id, {"output": {"v": 1, "type": "tests.durable.typed_models:Receipt", "mode": "auto",
                                            "retries": 2}}),
        ]
        await store.release(session.id, claim.epoch, cutoff=False)
        embedded.start_embedded_workers(1)
        typed.patient.wake(session.id, reason="test")
        one = await asyncio.wait_for(first.result(), TURN_S)
        two = await asyncio.wait_for(second.result(), TURN_S)
        assert isinstance(one.output, Invoice) and one.output.number == agents[6:]
        assert isinstance(two.output, Receipt) and two.output == Receipt(shop=own[8:], items=["tea", "cake"])
        assert [len(asked(model, p)) for p in (agents, own)] == [1, 1]


async def test_a_prompts_own_type_overrides_the_agents_and_types_an_untyped_agent(
        typed: Typed, model: ScriptedModel) -> None:
    plain = typed.plain.session()
    shop = f"Cafe{tag()}"
    result = await asyncio.wait_for((await plain.prompt(f"receipt:{shop}", output_type=Receipt)).result(), TURN_S)
    assert result.stop_reason == "end_turn", result
    assert isinstance(result.output, Receipt) and result.output == Receipt(shop=shop, items=["tea", "cake"])
    [request] = asked(model, f"receipt:{shop}")
    [final] = [t for t in request.body["tools"] if t["function"]["name"] == "final_result"]
    assert final["function"]["parameters"] == Output(Receipt).schema
    # The next prompt of the same session, without one, is untyped again.
    untyped = f"hello {tag()}"
    after = await asyncio.wait_for((await plain.prompt(untyped)).result(), TURN_S)
    assert after.stop_reason == "end_turn" and after.output is None
    [request] = asked(model, untyped)
    assert "final_result" not in tool_names(request) and "response_format" not in request.body
    ends = of_type(await stored_lines(typed.plain, plain.id), "turn_end")
    assert [("output" in end) for end in ends] == [True, False]

    invoicer = typed.invoicer.session()
    shop = f"Deli{tag()}"
    result = await asyncio.wait_for((await invoicer.prompt(f"receipt:{shop}", output_type=Receipt)).result(), TURN_S)
    assert isinstance(result.output, Receipt) and result.output.shop == shop
    [request] = asked(model, f"receipt:{shop}")
    assert tool_names(request).count("final_result") == 1  # the prompt's type, not the agent's beside it
    [final] = [t for t in request.body["tools"] if t["function"]["name"] == "final_result"]
    assert final["function"]["parameters"] == Output(Receipt).schema


async def test_an_invalid_answer_goes_back_with_its_errors_and_the_corrected_one_ends_the_turn(
        typed: Typed, model: ScriptedModel) -> None:
    session = typed.invoicer.session()
    prompt = f"fix:C-{tag()}"
    result = await asyncio.wait_for((await session.prompt(prompt)).result(), TURN_S)
    assert result.stop_reason == "end_turn", result
    assert result.output == Invoice(number=prompt[4:], total=7)
    first, second = asked(model, prompt)
    assert told_errors(first) == []
    [errors] = told_errors(second)
    assert '"missing"' in errors and '"total"' in errors, errors
    [call] = [c for m in turn_messages(second) if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    [result_message] = [m for m in turn_messages(second) if m.get("role") == "tool"]
    assert call["function"]["name"] == "final_result" and result_message["tool_call_id"] == call["id"]
    assert result_message["content"] == errors
    lines = await stored_lines(typed.invoicer, session.id)
    assert [t["isError"] for t in final_results(lines)] == [True, False]
    [end] = of_type(lines, "turn_end")
    assert end["output"] == {"number": prompt[4:], "total": 7}


@pytest.mark.parametrize("agent,attempts", [("invoicer", 2), ("patient", 3)])
async def test_answers_invalid_past_the_retries_end_the_turn_fx_output_invalid(
        typed: Typed, model: ScriptedModel, agent: str, attempts: int) -> None:
    session = typed.agents[agent].session()
    prompt = f"bad:D-{tag()}"
    result = await asyncio.wait_for((await session.prompt(prompt)).result(), TURN_S)
    assert result.stop_reason == "error" and result.output is None, result
    assert result.error is not None and result.error["code"] == "FX_OUTPUT_INVALID", result.error
    requests = asked(model, prompt)
    assert len(requests) == attempts, "one answer, then one per retry"
    assert [len(told_errors(r)) for r in requests] == list(range(attempts))
    lines = await stored_lines(typed.agents[agent], session.id)
    [end] = of_type(lines, "turn_end")
    assert end["stopReason"] == "error" and end["error"]["code"] == "FX_OUTPUT_INVALID" and "output" not in end
    assert end["error"]["errors"] == [{"type": "missing", "loc": ["total"], "msg": "Field required"}]
    assert f"after {attempts} attempts" in end["error"]["message"], end["error"]
    assert [t["isError"] for t in final_results(lines)] == [True] * attempts


@pytest.mark.parametrize("kind", ["function-local", "union"])
async def test_a_type_a_worker_cannot_import_is_refused_at_the_prompt_and_nothing_is_stored(
        typed: Typed, model: ScriptedModel, kind: str) -> None:
    class Inner(BaseModel):
        name: str

    output_type: Any = Inner if kind == "function-local" else Invoice | Receipt
    session = typed.plain.session()
    with pytest.raises(FxInputError) as refused:
        await session.prompt(f"refused {tag()}", output_type=output_type)
    assert refused.value.code == "FX_OUTPUT_TYPE_INVALID"
    with pytest.raises(FxUnknownSessionError):
        await session.state()  # no session was made
    # On a session with a turn behind it: nothing more is stored, nothing runs.
    assert (await asyncio.wait_for((await session.prompt(f"first {tag()}")).result(), TURN_S)).stop_reason == "end_turn"
    before = await session.state()
    lines_before = await stored_lines(typed.plain, session.id)
    prompt = f"refused {tag()}"
    with pytest.raises(FxInputError) as refused:
        await session.prompt(prompt, output_type=output_type)
    assert refused.value.code == "FX_OUTPUT_TYPE_INVALID"
    after = await typed.store.state(session.id)
    assert after is not None and after.pending == 0 and after.status == "idle"
    assert (await session.state()) == before
    assert await stored_lines(typed.plain, session.id) == lines_before
    assert asked(model, prompt) == []


@pytest.mark.parametrize("stored", [
    {"v": 1, "type": "tests.durable.typed_models:Missing", "mode": "auto", "retries": 1},
    {"v": 1, "type": "@agent", "mode": "auto", "retries": 1},
    {"v": 1, "type": "tests.durable.typed_models:Invoice", "mode": "sideways", "retries": 1},
    {"v": 1, "type": "no-colon", "mode": "auto", "retries": 1},
], ids=["missing-class", "agent-without-type", "bad-mode", "not-module-name"])
async def test_a_stored_type_that_does_not_import_here_ends_its_turn_once_and_the_session_goes_on(
        typed: Typed, model: ScriptedModel, stored: dict[str, Any]) -> None:
    """An input stored by another web (a newer agents module: a type this worker cannot
    import, `@agent` for an agent that has no type here, a malformed record) ends `error`
    `FX_OUTPUT_TYPE_INVALID` before any model request, once; the next prompt runs."""
    from fxworker.ids import new_message_id

    plain = typed.plain
    session = plain.session()
    prompt = f"stored {tag()}"
    message_id = new_message_id()
    accepted = await plain.store.accept(
        session.id, agent="plain", kind="prompt", message_id=message_id, input=prompt,
        settings={"output": stored}, needs=TYPED_LEVEL)
    assert not accepted.repeated
    plain.wake(session.id, reason="test")
    end = await wait_end(plain, session.id, message_id)
    assert end["stopReason"] == "error" and end["error"]["code"] == "FX_OUTPUT_TYPE_INVALID", end
    assert "output" not in end
    assert asked(model, prompt) == []
    after = f"after {tag()}"
    result = await asyncio.wait_for((await session.prompt(after)).result(), TURN_S)
    assert result.stop_reason == "end_turn" and result.output is None, result
    lines = await stored_lines(plain, session.id)
    assert [(line["messageId"], line["stopReason"]) for line in of_type(lines, "turn_end")] == [
        (message_id, "error"), (result.message_id, "end_turn")]
    # Ended unstarted (as a refused delegation is): a turn_end, no turn_start.
    assert [line["messageId"] for line in of_type(lines, "turn_start")] == [result.message_id]
    state = await plain.store.state(session.id)
    assert state is not None and state.status == "idle" and state.pending == 0
    assert state.epoch <= 3, f"one claim per prompt (and at most one more), not a loop: epoch {state.epoch}"
    assert len(asked(model, after)) == 1


def test_the_blocking_twin_answers_with_the_object(store_url: str | None, model: ScriptedModel) -> None:
    with make_typed(model, store_url) as typed:
        session = typed.plain.blocking_session()
        shop = f"Shop{tag()}"
        turn = session.prompt(f"receipt:{shop}", output_type=Receipt)
        result = turn.result()
        assert result.stop_reason == "end_turn", result
        assert isinstance(result.output, Receipt) and result.output == Receipt(shop=shop, items=["tea", "cake"])
        again = session.prompt(f"receipt:{shop}", message_id=turn.message_id, output_type=Receipt).result()
        assert again.repeated and again.output == result.output and isinstance(again.output, Receipt)
        invoiced = typed.invoicer.blocking_session().prompt(f"valid:S-{shop}").result()
        assert isinstance(invoiced.output, Invoice) and invoiced.output.number == f"S-{shop}"
        assert len(asked(model, f"receipt:{shop}")) == 1


async def test_a_repeated_message_id_answers_with_the_same_object(typed: Typed, model: ScriptedModel) -> None:
    session = typed.invoicer.session()
    prompt = f"fix:E-{tag()}"
    turn = await session.prompt(prompt)
    first = await asyncio.wait_for(turn.result(), TURN_S)
    assert first.stop_reason == "end_turn" and isinstance(first.output, Invoice)
    again_turn = await session.prompt(prompt, message_id=turn.message_id)
    again = await asyncio.wait_for(again_turn.result(), TURN_S)
    assert again.repeated and again.stop_reason == "end_turn"
    assert isinstance(again.output, Invoice) and again.output == first.output
    assert len(asked(model, prompt)) == 2, "the repeat asked the model nothing"
    # A fresh object for the same session id reads it the same way.
    other = typed.invoicer.session(session.id)
    third = await asyncio.wait_for((await other.prompt(prompt, message_id=turn.message_id)).result(), TURN_S)
    assert third.repeated and third.output == first.output
    assert len(of_type(await stored_lines(typed.invoicer, session.id), "turn_end")) == 1


@pytest.mark.parametrize("agent", ["native", "structured"])
async def test_native_mode_asks_by_response_format_and_corrects_in_text(
        typed: Typed, model: ScriptedModel, agent: str) -> None:
    """`output_mode="native"`, or auto on a model whose catalog entry has
    `supports_structured_output`: the request carries a JSON-schema `response_format` and
    no `final_result` tool; the answer's text is the object; errors go back as a user
    message."""
    session = typed.agents[agent].session()
    prompt = f"fix:N-{tag()}"
    result = await asyncio.wait_for((await session.prompt(prompt)).result(), TURN_S)
    assert result.stop_reason == "end_turn", result
    assert result.output == Invoice(number=prompt[4:], total=7)
    first, second = asked(model, prompt)
    for request in (first, second):
        assert "final_result" not in tool_names(request)
        response_format = request.body["response_format"]
        assert response_format["type"] == "json_schema"
        assert response_format["json_schema"]["schema"] == Output(Invoice).schema
    assert told_errors(first) == []
    [retry] = [m for m in turn_messages(second) if ERRORS_MARK in _content(m)]
    assert retry["role"] == "user" and '"total"' in _content(retry)
    lines = await stored_lines(typed.agents[agent], session.id)
    assert final_results(lines) == []
    [end] = of_type(lines, "turn_end")
    assert end["output"] == {"number": prompt[4:], "total": 7}


async def test_a_typed_child_answers_its_parent_with_the_objects_json(typed: Typed, model: ScriptedModel) -> None:
    session = typed.triage.session()
    number = f"F-{tag()}"
    result = await asyncio.wait_for((await session.prompt(f"ask:valid:{number}")).result(), TURN_S)
    assert result.stop_reason == "end_turn", result
    assert result.output is None  # the parent is untyped
    lines = await stored_lines(typed.triage, session.id)
    [start] = of_type(lines, "delegate_start")
    [delegate_end] = of_type(lines, "delegate_end")
    assert delegate_end["stopReason"] == "end_turn", delegate_end
    expected = json.dumps({"number": number, "total": 42}, separators=(",", ":"))
    parent_asks = asked(model, f"ask:valid:{number}")
    assert len(parent_asks) == 2
    [tool_message] = [m for m in turn_messages(parent_asks[1]) if m.get("role") == "tool"]
    assert tool_message["content"] == expected
    assert "".join(line["delta"] for line in of_type(lines, "text_delta")) == "answer: " + expected
    child_lines = await stored_lines(typed.billing, start["sessionId"])
    [child_end] = of_type(child_lines, "turn_end")
    assert child_end["output"] == {"number": number, "total": 42}


@pytest.mark.parametrize("kind,retry", [
    ("chat", "Give your answer by calling the final_result tool"),
    ("garbled", "The arguments did not validate as Invoice"),
])
async def test_an_answer_in_text_or_in_arguments_that_are_not_json_is_asked_for_again(
        typed: Typed, model: ScriptedModel, kind: str, retry: str) -> None:
    """In tool mode, an answer in text (no final-result call) goes back as a user message
    asking for the call; final-result arguments that are not JSON go back as that call's
    result (`json_invalid`). Either counts as a retry; the next answer ends the turn."""
    session = typed.invoicer.session()
    prompt = f"{kind}:G-{tag()}"
    result = await asyncio.wait_for((await session.prompt(prompt)).result(), TURN_S)
    assert result.stop_reason == "end_turn", result
    assert isinstance(result.output, Invoice) and result.output.number == prompt.partition(":")[2]
    first, second = asked(model, prompt)
    shown = [m for m in turn_messages(second) if _content(m).startswith(retry)]
    assert len(shown) == 1, turn_messages(second)
    assert shown[0]["role"] == ("user" if kind == "chat" else "tool")
    if kind == "garbled":
        assert '"json_invalid"' in _content(shown[0])
    lines = await stored_lines(typed.invoicer, session.id)
    [end] = of_type(lines, "turn_end")
    assert end["output"] == result.output.model_dump()


async def test_a_valid_final_result_ends_the_turn_and_the_calls_beside_it_do_not_run(
        typed: Typed, model: ScriptedModel) -> None:
    session = typed.noter.session()
    prompt = f"note:H-{tag()}"
    result = await asyncio.wait_for((await session.prompt(prompt)).result(), TURN_S)
    assert result.stop_reason == "end_turn" and result.output == Invoice(number=prompt[5:], total=8), result
    assert typed.notes == [], "the note was not run: the answer ended the turn"
    assert len(asked(model, prompt)) == 1
    lines = await stored_lines(typed.noter, session.id)
    ends = {line["name"]: line for line in of_type(lines, "tool_end")}
    assert ends["note"]["content"] == "Not run: the final result was given in the same response."
    assert ends["final_result"]["isError"] is False


async def test_an_invalid_final_result_lets_the_calls_beside_it_run_and_asks_again(
        typed: Typed, model: ScriptedModel) -> None:
    session = typed.noter.session()
    prompt = f"badnote:I-{tag()}"
    result = await asyncio.wait_for((await session.prompt(prompt)).result(), TURN_S)
    assert result.stop_reason == "end_turn" and result.output == Invoice(number=prompt[8:], total=9), result
    assert len(typed.notes) == 1, "the note ran once"
    first, second = asked(model, prompt)
    results = {m["tool_call_id"]: _content(m) for m in turn_messages(second) if m.get("role") == "tool"}
    assert sorted(results.values(), key=lambda c: c.startswith("noted")) == [
        told_errors(second)[0], f"noted {prompt[8:]}"]


async def test_a_union_on_the_agent_is_asked_for_wrapped_and_answers_either_type(
        typed: Typed, model: ScriptedModel) -> None:
    session = typed.either.session()
    number, shop = f"J-{tag()}", f"Bar{tag()}"
    one = await asyncio.wait_for((await session.prompt(f"valid:{number}")).result(), TURN_S)
    two = await asyncio.wait_for((await session.prompt(f"receipt:{shop}")).result(), TURN_S)
    assert isinstance(one.output, Invoice) and one.output.number == number, one
    assert isinstance(two.output, Receipt) and two.output.shop == shop, two
    [request] = asked(model, f"valid:{number}")
    [final] = [t for t in request.body["tools"] if t["function"]["name"] == "final_result"]
    assert final["function"]["parameters"]["required"] == ["response"]
    ends = of_type(await stored_lines(typed.either, session.id), "turn_end")
    assert [end["output"] for end in ends] == [{"number": number, "total": 42},
                                               {"shop": shop, "items": ["tea", "cake"]}]


async def test_an_agent_typed_str_answers_with_its_text(typed: Typed, model: ScriptedModel) -> None:
    session = typed.texter.session()
    prompt = f"hello {tag()}"
    result = await asyncio.wait_for((await session.prompt(prompt)).result(), TURN_S)
    assert result.stop_reason == "end_turn" and result.output == f"echo:{prompt}", result
    [request] = asked(model, prompt)
    assert "final_result" not in tool_names(request) and "response_format" not in request.body
    [end] = of_type(await stored_lines(typed.texter, session.id), "turn_end")
    assert end["output"] == f"echo:{prompt}"


async def test_a_turn_followed_by_resume_reads_the_prompts_own_type(
        store_url: str | None, model: ScriptedModel) -> None:
    """`Session.resume()` (a client that reconnects) of a turn whose prompt gave its own
    type, continued by another worker after its first one died: its answer is read as
    that type, as the prompt's own turn reads it."""
    with make_typed(model, store_url, workers=1) as typed:
        session = typed.invoicer.session()
        shop = f"Inn{tag()}"
        turn = await session.prompt(f"heldreceipt:{shop}", output_type=Receipt)
        try:
            await asyncio.wait_for(asyncio.to_thread(model.wait_held, shop, timeout_s=TURN_S), TURN_S + 1)
            resumed = await typed.invoicer.session(session.id).resume()
            embedded.kill_embedded_worker(0, replace=True)
        finally:
            model.release(shop)
        first = await asyncio.wait_for(turn.result(), TURN_S)
        assert first.stop_reason == "end_turn", first
        assert isinstance(first.output, Receipt) and first.output.shop == shop
        result = await asyncio.wait_for(resumed.result(), TURN_S)
        assert result.stop_reason == "end_turn" and result.message_id == first.message_id, result
        assert result.output == first.output and isinstance(result.output, Receipt), result.output


async def test_an_output_of_a_newer_version_is_left_for_a_newer_process(typed: Typed) -> None:
    """An input whose `output` a newer release wrote (`v` 2): this release cannot tell
    how to type its answer, so it leaves it (meta `newer`), nothing ended, the prompt
    still pending."""
    from fxworker.ids import new_message_id
    from fxworker.store.types import LAYOUT_LEVEL

    plain = typed.plain
    session_id = plain.new_session_id()
    message_id = new_message_id()
    await plain.store.accept(session_id, agent="plain", kind="prompt", message_id=message_id, input="later",
                             settings={"output": {"v": 2, "type": "@agent", "mode": "auto", "retries": 1}},
                             needs=TYPED_LEVEL)
    plain.wake(session_id, reason="test")

    async def let_go() -> Any:
        while True:
            state = await plain.store.state(session_id)
            if state.newer is not None and state.lease_holder is None and state.epoch > 0:
                return state
            await asyncio.sleep(0.02)
    state = await asyncio.wait_for(let_go(), TURN_S)
    assert state.newer == LAYOUT_LEVEL + 1 and state.status == "waiting" and state.pending == 1, state
    assert [line for line in await stored_lines(plain, session_id) if line.get("messageId") == message_id] == []


async def test_an_open_turn_whose_type_no_longer_imports_where_it_resumes_ends_once(
        store_url: str | None, model: ScriptedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt's own type imported where the turn started; its worker dies mid-turn and
    the worker that takes it over cannot import the type (deployed without it): the open
    turn ends `error` `FX_OUTPUT_TYPE_INVALID` once, with no model request, and the
    session's next prompt runs."""
    from tests.durable import typed_models

    with make_typed(model, store_url, workers=1) as typed:
        session = typed.plain.session()
        shop = f"Gone{tag()}"
        prompt = f"heldreceipt:{shop}"
        turn = await session.prompt(prompt, output_type=Receipt)
        try:
            await asyncio.wait_for(asyncio.to_thread(model.wait_held, shop, timeout_s=TURN_S), TURN_S + 1)
            monkeypatch.delattr(typed_models, "Receipt")
            embedded.kill_embedded_worker(0, replace=True)
        finally:
            model.release(shop)
        result = await asyncio.wait_for(turn.result(), TURN_S)
        assert result.stop_reason == "error" and result.error is not None, result
        assert result.error["code"] == "FX_OUTPUT_TYPE_INVALID", result.error
        assert len(asked(model, prompt)) == 1, "the turn was not asked for again"
        next_turn = await asyncio.wait_for((await session.prompt(f"after {tag()}")).result(), TURN_S)
        assert next_turn.stop_reason == "end_turn", next_turn
        lines = await stored_lines(typed.plain, session.id)
        assert [(line["messageId"], line["stopReason"]) for line in of_type(lines, "turn_end")] == [
            (turn.message_id, "error"), (next_turn.message_id, "end_turn")]


async def test_a_steer_while_the_answer_streams_is_answered_by_the_next_object(
        typed: Typed, model: ScriptedModel) -> None:
    """A steer cuts the streaming answer short (its `user_message` line is stored before
    the held answer goes on): the cut answer is not judged, the model is asked again with
    the steer, and that answer is the turn's object."""
    session = typed.invoicer.session()
    held = f"L-{tag()}"
    steer = f"valid:M-{tag()}"
    turn = await session.prompt(f"heldvalid:{held}")
    try:
        await asyncio.wait_for(asyncio.to_thread(model.wait_held, held, timeout_s=TURN_S), TURN_S + 1)
        accepted = await session.steer(steer)
        await asyncio.wait_for(_lines_until(typed.invoicer, session.id, lambda ls: any(
            line["type"] == "user_message" and line["id"] == accepted.message_id for line in ls)), TURN_S)
        result = await asyncio.wait_for(turn.result(), TURN_S)
    finally:
        model.release(held)
    assert result.stop_reason == "end_turn", result
    assert result.output == Invoice(number=steer[6:], total=42), result.output
    assert len(asked(model, f"heldvalid:{held}")) == 1 and len(asked(model, steer)) == 1
    lines = await stored_lines(typed.invoicer, session.id)
    [end] = of_type(lines, "turn_end")
    assert end["output"] == {"number": steer[6:], "total": 42}
    assert [t["isError"] for t in final_results(lines)] == [False], "only the steered answer was judged"


async def test_a_cancelled_typed_turn_has_no_output(typed: Typed, model: ScriptedModel) -> None:
    session = typed.invoicer.session()
    held = f"O-{tag()}"
    turn = await session.prompt(f"heldvalid:{held}")
    try:
        await asyncio.wait_for(asyncio.to_thread(model.wait_held, held, timeout_s=TURN_S), TURN_S + 1)
        assert await turn.cancel()
        result = await asyncio.wait_for(turn.result(), TURN_S)
    finally:
        model.release(held)
    assert result.stop_reason == "cancelled" and result.output is None, result
    [end] = of_type(await stored_lines(typed.invoicer, session.id), "turn_end")
    assert "output" not in end


async def test_a_typed_child_that_never_validates_answers_its_parent_with_the_error(
        typed: Typed, model: ScriptedModel) -> None:
    session = typed.triage.session()
    number = f"P-{tag()}"
    result = await asyncio.wait_for((await session.prompt(f"ask:bad:{number}")).result(), TURN_S)
    assert result.stop_reason == "end_turn", result  # the parent read the error and answered
    lines = await stored_lines(typed.triage, session.id)
    [delegate_end] = of_type(lines, "delegate_end")
    assert delegate_end["stopReason"] == "error" and delegate_end["error"]["code"] == "FX_OUTPUT_INVALID"
    [_, after] = asked(model, f"ask:bad:{number}")
    [tool_message] = [m for m in turn_messages(after) if m.get("role") == "tool"]
    assert "FX_OUTPUT_INVALID" in _content(tool_message), tool_message
    assert len(asked(model, f"bad:{number}")) == 2  # the child's answer and its one retry


async def test_a_final_result_tool_of_the_agents_own_clashes_unless_native(
        store_url: str | None, model: ScriptedModel) -> None:
    """A tool named `final_result` is refused (`FX_TOOL_INVALID`) beside a typed answer in
    tool mode: on the Agent, or at a prompt that types its turn (nothing stored); native
    mode does not add the tool, so it may be the agent's own."""
    from fxworker.errors import FxConfigError

    own = Tool("final_result", "The agent's own.", {"type": "object", "properties": {}}, idempotent=True,
               execute=lambda input, ctx: "own")
    prefix = f"fxe{uuid.uuid4().hex[:8]}"
    store = redis_store(store_url, prefix=prefix) if store_url else embedded_store(prefix=prefix)
    common: dict[str, Any] = dict(model="scripted", provider=provider(model.base_url), api_key="test-key",
                                  store=store, waker=InProcessWaker(start_workers=False), tools=[own])
    with pytest.raises((FxInputError, FxConfigError)) as refused:
        Agent("clash", output_type=Invoice, **common)
    assert refused.value.code == "FX_TOOL_INVALID"
    untyped = Agent("clash", **common)
    native = Agent("clash-native", output_type=Invoice, output_mode="native", **common)
    try:
        session = untyped.session()
        with pytest.raises(FxInputError) as refused:
            await session.prompt("x", output_type=Invoice)
        assert refused.value.code == "FX_TOOL_INVALID"
        with pytest.raises(FxUnknownSessionError):
            await session.state()
        assert native.output is not None and native.output.mode == "native"
    finally:
        untyped.close()
        native.close()
        if store_url:
            delete_prefix(store_url, prefix)


async def test_a_class_defined_in_a_function_may_type_the_agent(store_url: str | None, model: ScriptedModel) -> None:
    """The agent's own type is stored as `@agent`, never by name: any class pydantic
    validates will do there, one defined in a function too (the worker's agent holds it)."""
    class Local(BaseModel):
        number: str
        total: int

    prefix = f"fxe{uuid.uuid4().hex[:8]}"
    store = redis_store(store_url, prefix=prefix) if store_url else embedded_store(prefix=prefix)
    local = Agent("local", instructions="You are local.", output_type=Local, model="scripted",
                  provider=provider(model.base_url), api_key="test-key", store=store,
                  waker=InProcessWaker(start_workers=False), settings=Settings(lease_s=2.0, reserve_s=4.0, sweep_s=0.5))
    embedded.start_embedded_workers(1)
    try:
        number = f"Q-{tag()}"
        result = await asyncio.wait_for((await local.session().prompt(f"valid:{number}")).result(), TURN_S)
        assert result.stop_reason == "end_turn" and isinstance(result.output, Local), result
        assert result.output.number == number
    finally:
        embedded.stop_embedded_workers()
        local.close()
        if store_url:
            delete_prefix(store_url, prefix)


async def test_a_prompts_own_type_holds_across_the_park_on_its_children(typed: Typed, model: ScriptedModel) -> None:
    """A prompt that types its own turn on an untyped agent that delegates: the turn parks
    on its child (its input may go to rest with its log) and resumes on the child's
    answer still typed: the model is asked for a `Receipt` again, and it is the output."""
    session = typed.triage.session()
    number = f"T-{tag()}"
    result = await asyncio.wait_for(
        (await session.prompt(f"ask:valid:{number}", output_type=Receipt)).result(), TURN_S)
    assert result.stop_reason == "end_turn", result
    child_answer = json.dumps({"number": number, "total": 42}, separators=(",", ":"))
    assert result.output == Receipt(shop="triage", items=[child_answer]), result.output
    before, after = asked(model, f"ask:valid:{number}")
    assert "final_result" in tool_names(before) and "final_result" in tool_names(after)
    lines = await stored_lines(typed.triage, session.id)
    assert len(of_type(lines, "turn_pause")) == 1
    [end] = of_type(lines, "turn_end")
    assert end["output"] == {"shop": "triage", "items": [child_answer]}


async def test_the_retries_are_counted_across_a_worker_that_dies(store_url: str | None, model: ScriptedModel) -> None:
    """Two retries; the worker dies while the model gives its third answer (the second
    retry). The worker that takes over counts the two verdicts in the journal: it asks
    the second retry again (not the first request, nor the first retry), and once that
    answer does not validate either the turn ends FX_OUTPUT_INVALID, three attempts in all."""
    with make_typed(model, store_url, workers=1) as typed:
        session = typed.patient.session()
        number = f"U-{tag()}"
        prompt = f"badheld:{number}"
        turn = await session.prompt(prompt)
        try:
            await asyncio.wait_for(asyncio.to_thread(model.wait_held, number, timeout_s=TURN_S), TURN_S + 1)
            await asyncio.wait_for(_lines_until(typed.patient, session.id, lambda ls: len(final_results(ls)) == 2),
                                   TURN_S)  # the second verdict is stored (in the append of the held request)
            embedded.kill_embedded_worker(0, replace=True)
        finally:
            model.release(number)
        result = await asyncio.wait_for(turn.result(), TURN_S)
        assert result.stop_reason == "error" and result.error is not None, result
        assert result.error["code"] == "FX_OUTPUT_INVALID" and "after 3 attempts" in str(result.error["message"])
        assert [len(told_errors(r)) for r in asked(model, prompt)] == [0, 1, 2, 2]
        lines = await stored_lines(typed.patient, session.id)
        assert len(of_type(lines, "turn_end")) == 1
        assert [line["interrupted"] for line in of_type(lines, "turn_resume")] == [True]


async def test_a_turn_followed_after_a_steer_reads_the_prompts_own_type(typed: Typed, model: ScriptedModel) -> None:
    """`Session.follow(accepted)` of a steer into a turn whose prompt gave its own type:
    the answer is read as that type, as the prompt's own turn reads it."""
    session = typed.plain.session()
    shop = f"Pub{tag()}"
    turn = await session.prompt(f"heldreceipt:{shop}", output_type=Receipt)
    try:
        await asyncio.wait_for(asyncio.to_thread(model.wait_held, shop, timeout_s=TURN_S), TURN_S + 1)
        accepted = await session.steer(f"receipt:{shop}-2")
        followed = session.follow(accepted)
        await asyncio.wait_for(_lines_until(typed.plain, session.id, lambda ls: any(
            line["type"] == "user_message" and line["id"] == accepted.message_id for line in ls)), TURN_S)
    finally:
        model.release(shop)
    first = await asyncio.wait_for(turn.result(), TURN_S)
    assert isinstance(first.output, Receipt) and first.output.shop == f"{shop}-2", first
    result = await asyncio.wait_for(followed.result(), TURN_S)
    assert result.message_id == first.message_id
    assert result.output == first.output and isinstance(result.output, Receipt), result.output
