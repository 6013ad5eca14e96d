"""fxengine.mcp: the tools of a real MCP server (the `mcp` SDK, over stdio) in an engine's turns."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fxengine.errors import FxToolDefinitionError
from fxengine.mcp import create_mcp_adapter, result_of
from fxengine.testing import Reply, ScriptedModel, text, tool_call
from tests.durable.mcp_client import McpConnection
from tests.durable.mcp_server import INSTRUCTIONS, PNG_1X1
from tests.engine.conftest import run

mcp = pytest.importorskip("mcp")


@pytest.fixture
async def session() -> AsyncIterator[Any]:
    """A `ClientSession` to the test server, started over stdio (no Redis: `charge` answers at once)."""
    connection = McpConnection({"REDIS_URL": ""})
    try:
        yield await connection.open()
    finally:
        await connection.close()


async def test_the_adapter_lists_the_servers_tools_prefixed_and_not_idempotent(session: Any) -> None:
    adapter = await create_mcp_adapter(session, prefix="orders_", idempotent={"lookup_order": True})
    by_name = {t.name: t for t in adapter.tools}
    assert set(by_name) == {"orders_lookup_order", "orders_snapshot", "orders_charge"}
    assert by_name["orders_lookup_order"].idempotent is True
    assert by_name["orders_charge"].idempotent is False and by_name["orders_charge"].needs_barrier
    assert by_name["orders_snapshot"].idempotent is False
    assert by_name["orders_lookup_order"].input_schema["properties"]["id"]["type"] == "string"
    assert adapter.instructions == INSTRUCTIONS
    assert adapter.names["orders_charge"] == "charge"


async def test_an_override_naming_no_tool_or_a_bad_name_is_refused(session: Any) -> None:
    with pytest.raises(FxToolDefinitionError) as refused:
        await create_mcp_adapter(session, idempotent={"lookup_ordr": True})
    assert refused.value.code == "FX_TOOL_INVALID" and "lookup_ordr" in refused.value.message
    with pytest.raises(FxToolDefinitionError) as bad:
        await create_mcp_adapter(session, prefix="a prefix with spaces ")
    assert bad.value.code == "FX_TOOL_INVALID" and "MCP tool" in bad.value.message


async def test_an_engine_calls_mcp_tools_and_sends_their_text_and_images(
    session: Any, model: ScriptedModel, make_engine: Any
) -> None:
    adapter = await create_mcp_adapter(session, prefix="orders_")
    model.script(
        Reply(tool_call("c1", "orders_lookup_order", {"id": "7"}), tool_call("c2", "orders_snapshot", {})),
        Reply(text("order 7 shipped")),
    )
    engine = await make_engine(tools=adapter.tools, instructions=adapter.instructions)
    events, result = await run(engine.prompt("where is order 7?"))
    assert result.stop_reason == "end_turn"
    ends = {e["id"]: e for e in events if e["type"] == "tool_end"}
    assert ends["c1"]["content"] == "order 7: shipped" and not ends["c1"]["isError"]
    assert ends["c2"]["content"] == "the warehouse"
    first, second = model.requests[0].body, model.requests[1].body
    assert first["messages"][0] == {"role": "system", "content": INSTRUCTIONS}
    assert {t["function"]["name"] for t in first["tools"]} == {"orders_lookup_order", "orders_snapshot", "orders_charge"}
    tool_messages = {m["tool_call_id"]: m["content"] for m in second["messages"] if m["role"] == "tool"}
    assert tool_messages == {"c1": "order 7: shipped", "c2": "the warehouse"}
    urls = [p["image_url"]["url"] for m in second["messages"] if m["role"] == "user" and isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "image_url"]
    assert urls == ["data:image/png;base64," + __import__("base64").b64encode(PNG_1X1).decode()]


async def test_a_closed_adapter_fails_its_calls_without_reaching_the_server(
    session: Any, model: ScriptedModel, make_engine: Any
) -> None:
    adapter = await create_mcp_adapter(session)
    await adapter.close()
    model.script(Reply(tool_call("c1", "lookup_order", {"id": "1"})), Reply(text("ok")))
    engine = await make_engine(tools=adapter.tools)
    events, _ = await run(engine.prompt("go"))
    end = next(e for e in events if e["type"] == "tool_end")
    assert end["isError"] and "closed" in end["content"]


def test_call_results_become_text_images_or_errors() -> None:
    png = __import__("base64").b64encode(PNG_1X1).decode()
    assert result_of({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}) == "a\nb"
    assert result_of({"content": [], "structuredContent": {"n": 1}}) == json.dumps({"n": 1}, separators=(",", ":"))
    typed = result_of({"content": [{"type": "image", "data": png, "mimeType": "image/png"}] * 9, "isError": False})
    assert isinstance(typed, dict) and len(typed["images"]) == 8 and "left out" in typed["text"]
    failed = result_of({"content": [{"type": "text", "text": "no such order"}], "isError": True})
    assert failed == {"type": "fx.tool-result", "text": "no such order", "images": [], "isError": True}
    linked = result_of({"content": [{"type": "resource_link", "uri": "file:///x", "name": "x"}]})
    assert linked == "[resource file:///x]"


async def test_a_provider_executed_tool_is_passed_through_beside_mcp_tools(
    session: Any, model: ScriptedModel, make_engine: Any
) -> None:
    adapter = await create_mcp_adapter(session, prefix="orders_")
    model.script(Reply(text("searched at the provider")))
    engine = await make_engine(tools=[*adapter.tools, {"name": "web_search", "provider_executed": True}])
    _, result = await run(engine.prompt("search the web"))
    assert result.stop_reason == "end_turn"
    tools = model.requests[0].body["tools"]
    assert {"type": "web_search"} in tools
    assert len([t for t in tools if t.get("type") == "function"]) == 3
    with pytest.raises(FxToolDefinitionError) as refused:
        await make_engine(tools=[{"name": "web_search"}])
    assert refused.value.code == "FX_TOOL_INVALID"
