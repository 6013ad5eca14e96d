"""Typed answers on the wire (`fxengine.output`): what a Chat Completions request (a custom
provider, AI Gateway) and a Responses request (the ChatGPT plan's Codex API) carry for
each mode, the mode `auto` picks from each provider's catalog, and a `final_result` call
decoded from streams in each provider's own shape."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from fxengine import FxInputError, create_engine
from fxengine.output import FINAL_RESULT_TOOL
from fxengine.providers import chatgpt
from fxengine.providers.base import WIRE_CHAT, WIRE_RESPONSES, ModelEntry
from fxengine.providers.oauth import OAuthConfig
from fxengine.testing import Reply, ScriptedModel, text, tool_call
from fxengine.tools import tool
from fxengine.turn import TurnResult
from tests.engine.test_provider_streams import RawModel
from tests.providers.conftest import CredentialStore
from tests.providers.fakes import FakePlan

TIMEOUT_S = 10.0


class Invoice(BaseModel):
    number: str
    total: float


class Query(BaseModel):
    q: str


INVOICE = {"number": "A-17", "total": 42.5}


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as server:
        yield server


@pytest.fixture
def raw() -> Iterator[RawModel]:
    server = RawModel()
    yield server
    server.close()


async def typed_turn(model: Any, output_type: object, **options: Any) -> TurnResult[Any]:
    """One typed turn's result, the engine closed after it."""
    engine = await create_engine(model, output_type=output_type, **options)
    try:
        return await asyncio.wait_for(engine.prompt("extract it").result(), TIMEOUT_S)
    finally:
        await engine.close()


def scripted_provider(model: ScriptedModel, **entry: Any) -> dict[str, Any]:
    """The scripted server as a custom provider, its model's catalog entry updated with `entry`."""
    provider = dict(model.provider)
    models: dict[str, Any] = provider["models"]  # type: ignore[assignment]
    provider["models"] = {model.model_id: {**models[model.model_id], **entry}}
    return provider


# --- Chat Completions: a custom provider


async def test_chat_completions_native_sends_a_json_schema_response_format(model: ScriptedModel) -> None:
    model.script(Reply(text(json.dumps(INVOICE))))
    result = await typed_turn(model.model_id, Invoice, provider=scripted_provider(model, supports_structured_output=True))

    assert result.output == Invoice(**INVOICE)
    body = model.requests[0].body
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Invoice", "schema": Invoice.model_json_schema(), "strict": False},
    }
    assert "tools" not in body


async def test_chat_completions_tool_mode_adds_final_result_to_the_tools(model: ScriptedModel) -> None:
    @tool(idempotent=True)
    def lookup(q: str) -> str:
        """Look something up."""
        return q

    model.script(Reply(tool_call("call_1", FINAL_RESULT_TOOL, INVOICE)))
    result = await typed_turn(model.model_id, Invoice, provider=model.provider, tools=[lookup])

    assert result.output == Invoice(**INVOICE)
    body = model.requests[0].body
    assert "response_format" not in body
    assert [t["function"]["name"] for t in body["tools"]] == ["lookup", FINAL_RESULT_TOOL]
    final = body["tools"][1]
    assert final["type"] == "function"
    assert final["function"]["parameters"] == Invoice.model_json_schema()
    assert "Invoice" in final["function"]["description"]


@pytest.mark.parametrize(("entry", "native"), [
    ({}, False),
    ({"supports_structured_output": False}, False),
    ({"supports_structured_output": True}, True),
])
async def test_a_custom_providers_catalog_picks_the_mode(model: ScriptedModel, entry: dict[str, Any],
                                                         native: bool) -> None:
    model.script(Reply(text(json.dumps(INVOICE))) if native else Reply(tool_call("c", FINAL_RESULT_TOOL, INVOICE)))
    result = await typed_turn(model.model_id, Invoice, provider=scripted_provider(model, **entry))

    assert result.output == Invoice(**INVOICE)
    body = model.requests[0].body
    assert ("response_format" in body) is native
    assert (FINAL_RESULT_TOOL in [t["function"]["name"] for t in body.get("tools") or []]) is not native


async def test_a_custom_providers_flag_must_be_a_boolean(model: ScriptedModel) -> None:
    with pytest.raises(FxInputError) as info:
        await create_engine(model.model_id, provider=scripted_provider(model, supports_structured_output="yes"),
                            output_type=Invoice)
    assert info.value.code == "FX_PROVIDER_INVALID"


# --- Chat Completions: AI Gateway


@pytest.mark.parametrize(("entry", "native"), [
    ({"tags": ["tool-use"]}, False),
    ({"tags": ["tool-use", "structured-outputs"]}, True),
    ({"tags": ["structured-outputs"], "supports_structured_output": False}, False),  # the boolean wins
    ({"supports_structured_output": True}, True),
])
async def test_the_gateway_catalog_picks_the_mode(model: ScriptedModel, monkeypatch: pytest.MonkeyPatch,
                                                  entry: dict[str, Any], native: bool) -> None:
    monkeypatch.setenv("AI_GATEWAY_BASE_URL", model.base_url)
    catalog = {"data": [{"id": "openai/gpt-5", "type": "language", "context_window": 400_000, **entry}]}
    model.script(Reply(text(json.dumps(INVOICE))) if native else Reply(tool_call("c", FINAL_RESULT_TOOL, INVOICE)))
    result = await typed_turn("openai/gpt-5", Invoice, api_key="gw-key", model_catalog=catalog)

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(**INVOICE)
    body = model.requests[0].body
    assert body["model"] == "openai/gpt-5"
    if native:
        assert body["response_format"]["type"] == "json_schema"
        assert body["response_format"]["json_schema"]["schema"] == Invoice.model_json_schema()
        assert "tools" not in body
    else:
        assert "response_format" not in body
        assert [t["function"]["name"] for t in body["tools"]] == [FINAL_RESULT_TOOL]


# --- the Responses wire: the ChatGPT plan (Codex)


def codex(plan: FakePlan, config: OAuthConfig, *, models: dict[str, ModelEntry] | None = None) -> Any:
    store = CredentialStore(plan.seed_credentials())
    return chatgpt.provider(credentials=store.load, on_credentials=store.save, oauth_config=config,
                            base_url=f"{plan.url}/backend-api/codex", models=models)


async def test_codex_without_structured_output_asks_by_the_final_result_tool(
        plan: FakePlan, chatgpt_config: OAuthConfig) -> None:
    """The plan's API calls the first tool it is offered (`final_result`) with {"q": "x"}."""
    result = await typed_turn("gpt-5-codex", Query, provider=codex(plan, chatgpt_config), session_id="s-1")

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Query(q="x")
    (call,) = plan.api_calls
    body = call["body"]
    assert "text" not in body
    assert body["tools"] == [{"type": "function", "name": FINAL_RESULT_TOOL,
                              "description": body["tools"][0]["description"],
                              "parameters": Query.model_json_schema()}]


async def test_codex_with_structured_output_asks_by_text_format(plan: FakePlan, chatgpt_config: OAuthConfig) -> None:
    """The plan's API answers in plain text, which is not JSON: the retry carries the errors."""
    models = {"gpt-5-codex": ModelEntry(supports_structured_output=True)}
    result = await typed_turn("gpt-5-codex", Query, provider=codex(plan, chatgpt_config, models=models),
                              session_id="s-2")

    assert result.stop_reason == "error"
    assert result.error is not None and result.error["code"] == "FX_OUTPUT_INVALID"
    assert [e["type"] for e in result.error["errors"]] == ["json_invalid"]
    first, second = plan.api_calls
    assert first["body"]["text"] == {"format": {"type": "json_schema", "name": "Query",
                                                "schema": Query.model_json_schema(), "strict": False}}
    assert "tools" not in first["body"]
    retry = second["body"]["input"][-1]
    assert retry["role"] == "user" and "did not validate as Query" in retry["content"][0]["text"]
    assert second["body"]["text"] == first["body"]["text"]


# --- final_result decoded from each provider's stream shape


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **top: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1733400000, "model": "gpt-4.1-2025-04-14",
            "system_fingerprint": "fp_1", "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                      "finish_reason": finish}], **top}


def openai_chat_final_result(arguments: str) -> list[dict[str, Any] | str]:
    """OpenAI's Chat Completions shape of one tool call: id, type and name first, then the
    arguments in pieces, `finish_reason: tool_calls`, a usage chunk, `[DONE]`."""
    pieces = [arguments[i:i + 9] for i in range(0, len(arguments), 9)]
    return [
        chat_chunk({"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": "call_Zx1", "type": "function", "function": {"name": FINAL_RESULT_TOOL, "arguments": ""}}],
            "refusal": None}),
        *(chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}) for piece in pieces),
        chat_chunk({}, "tool_calls"),
        {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1733400000, "model": "gpt-4.1-2025-04-14",
         "choices": [], "usage": {"prompt_tokens": 80, "completion_tokens": 19, "total_tokens": 99}},
        "[DONE]",
    ]


def openai_responses_final_result(arguments: str) -> list[dict[str, Any]]:
    """OpenAI's Responses shape of one function call: the item added with empty arguments,
    argument deltas, their done, the item done, `response.completed`."""
    item = {"id": "fc_68a1", "type": "function_call", "status": "completed", "arguments": arguments,
            "call_id": "call_Rk2", "name": FINAL_RESULT_TOOL}
    pieces = [arguments[i:i + 9] for i in range(0, len(arguments), 9)]
    return [
        {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_68a1", "status": "in_progress"}},
        {"type": "response.in_progress", "sequence_number": 1, "response": {"id": "resp_68a1", "status": "in_progress"}},
        {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
         "item": {**item, "status": "in_progress", "arguments": ""}},
        *({"type": "response.function_call_arguments.delta", "sequence_number": 3 + n, "item_id": "fc_68a1",
           "output_index": 0, "delta": piece} for n, piece in enumerate(pieces)),
        {"type": "response.function_call_arguments.done", "sequence_number": 3 + len(pieces), "item_id": "fc_68a1",
         "output_index": 0, "arguments": arguments},
        {"type": "response.output_item.done", "sequence_number": 4 + len(pieces), "output_index": 0, "item": item},
        {"type": "response.completed", "sequence_number": 5 + len(pieces), "response": {
            "id": "resp_68a1", "status": "completed", "model": "gpt-5-codex", "output": [item],
            "usage": {"input_tokens": 80, "output_tokens": 19, "total_tokens": 99}}},
    ]


async def raw_turn(raw: RawModel, wire: str, output_type: object, *, structured: bool = False) -> TurnResult[Any]:
    provider = raw.provider(wire)
    if structured:
        provider = dataclasses.replace(provider, models={"raw-model": ModelEntry(supports_structured_output=True)})
    async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S)) as client:
        return await typed_turn("raw-model", output_type, provider=provider, http_client=client)


async def test_a_final_result_call_in_openai_chat_completions_shape(raw: RawModel) -> None:
    raw.sse(*openai_chat_final_result(json.dumps(INVOICE)))

    result = await raw_turn(raw, WIRE_CHAT, Invoice)

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(**INVOICE)
    assert len(raw.requests) == 1
    assert [t["function"]["name"] for t in raw.requests[0]["tools"]] == [FINAL_RESULT_TOOL]


async def test_a_final_result_call_in_openai_responses_shape(raw: RawModel) -> None:
    raw.sse(*openai_responses_final_result(json.dumps(INVOICE)))

    result = await raw_turn(raw, WIRE_RESPONSES, Invoice)

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(**INVOICE)
    assert len(raw.requests) == 1
    assert [t["name"] for t in raw.requests[0]["tools"]] == [FINAL_RESULT_TOOL]


async def test_an_invalid_final_result_goes_back_as_the_calls_output_on_the_responses_wire(raw: RawModel) -> None:
    raw.sse(*openai_responses_final_result(json.dumps({"number": "A-17"})))
    raw.sse(*openai_responses_final_result(json.dumps(INVOICE)))

    result = await raw_turn(raw, WIRE_RESPONSES, Invoice)

    assert result.output == Invoice(**INVOICE)
    items = raw.requests[1]["input"]
    (output,) = [item for item in items if item["type"] == "function_call_output"]
    assert output["call_id"] == "call_Rk2" and "total" in output["output"] and "Field required" in output["output"]
    assert {"type": "function_call", "call_id": "call_Rk2", "name": FINAL_RESULT_TOOL,
            "arguments": json.dumps({"number": "A-17"})} in items


async def test_a_native_answer_in_openai_responses_shape(raw: RawModel) -> None:
    answer = json.dumps(INVOICE)
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": answer, "annotations": []}]}
    raw.sse(
        {"type": "response.created", "response": {"id": "resp_2", "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": [], "status": "in_progress"}},
        {"type": "response.content_part.added", "output_index": 0, "content_index": 0,
         "part": {"type": "output_text", "text": "", "annotations": []}},
        *({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": answer[i:i + 7]}
          for i in range(0, len(answer), 7)),
        {"type": "response.output_text.done", "output_index": 0, "content_index": 0, "text": answer},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": {"id": "resp_2", "status": "completed", "model": "gpt-5",
                                                    "output": [item], "usage": {"input_tokens": 5, "output_tokens": 9}}},
    )

    result = await raw_turn(raw, WIRE_RESPONSES, Invoice, structured=True)

    assert result.stop_reason == "end_turn", result.error
    assert result.output == Invoice(**INVOICE)
    body = raw.requests[0]
    assert body["text"]["format"]["type"] == "json_schema" and body["text"]["format"]["name"] == "Invoice"
    assert "tools" not in body
