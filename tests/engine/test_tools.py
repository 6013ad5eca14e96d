from __future__ import annotations

import base64
from typing import Any

import pytest

from fxengine import FxToolDefinitionError, Tool, ToolContext, tool
from fxengine.tools import check_tools, format_result

SCHEMA = {"type": "object", "properties": {}}


def noop(input: Any, ctx: ToolContext) -> str:
    return "ok"


def test_idempotent_is_required_and_writes_defaults_to_its_opposite() -> None:
    with pytest.raises(FxToolDefinitionError) as missing:
        Tool("t", "d", SCHEMA, None, execute=noop)  # type: ignore[arg-type]
    assert missing.value.code == "FX_TOOL_INVALID"
    assert Tool("a", "d", SCHEMA, idempotent=True, execute=noop).writes is False
    assert Tool("b", "d", SCHEMA, idempotent=False, execute=noop).writes is True
    relaxed = Tool("c", "d", SCHEMA, idempotent=False, writes=False, execute=noop)
    assert relaxed.needs_barrier and not relaxed.runs_alone
    safe_writer = Tool("e", "d", SCHEMA, idempotent=True, writes=True, execute=noop)
    assert safe_writer.needs_barrier and safe_writer.runs_alone


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "has space"},
        {"name": "x" * 65},
        {"input_schema": {"type": "string"}},
        {"execute": None},
        {"writes": "yes"},
    ],
)
def test_malformed_tools_are_refused(kwargs: dict[str, Any]) -> None:
    options: dict[str, Any] = {"name": "t", "description": "d", "input_schema": SCHEMA, "idempotent": True,
                               "execute": noop, **kwargs}
    with pytest.raises(FxToolDefinitionError):
        Tool(**options)


def test_tool_sets_are_checked() -> None:
    a = Tool("a", "d", SCHEMA, idempotent=True, execute=noop)
    assert list(check_tools({"a": a})) == ["a"]
    with pytest.raises(FxToolDefinitionError, match="two tools"):
        check_tools([a, a])
    with pytest.raises(FxToolDefinitionError, match="at most 64"):
        check_tools([Tool(f"t{i}", "d", SCHEMA, idempotent=True, execute=noop) for i in range(65)])
    with pytest.raises(FxToolDefinitionError, match="not a Tool"):
        check_tools([{"name": "a"}])


def test_tools_declare_approval_and_external() -> None:
    assert Tool("a", "d", SCHEMA, idempotent=True, execute=noop).approval is False
    assert Tool("b", "d", SCHEMA, idempotent=False, execute=noop, approval=True).approval is True
    client = Tool("c", "d", SCHEMA, idempotent=False, external=True)
    assert client.external and client.execute is None
    for bad in ({"approval": "yes"}, {"external": 1}, {"external": True, "approval": True}):
        with pytest.raises(FxToolDefinitionError) as refused:
            Tool("d", "d", SCHEMA, idempotent=True, execute=noop, **bad)
        assert refused.value.code == "FX_TOOL_INVALID"
    with pytest.raises(FxToolDefinitionError):
        Tool("e", "d", SCHEMA, idempotent=True)  # only an external tool goes without execute

    @tool(idempotent=False, approval=lambda input, ctx: input["amount"] > 100)
    def refund(amount: int) -> str:
        """Refunds."""
        return "ok"

    assert callable(refund.approval) and not refund.external

    @tool(idempotent=False, external=True)
    def pick_file(pattern: str) -> str:
        """Lets the user pick a file on their machine."""
        raise AssertionError("an external tool's body never runs")

    assert pick_file.external and pick_file.execute is None
    assert pick_file.input_schema["required"] == ["pattern"]


def test_the_decorator_derives_the_schema_with_pydantic() -> None:
    @tool(idempotent=True)
    def search(query: str, limit: int = 5, ctx: ToolContext | None = None) -> list[str]:
        """Searches the catalog."""
        return [query] * limit

    assert search.name == "search" and search.description == "Searches the catalog."
    assert search.idempotent and search.writes is False
    schema = search.input_schema
    assert schema["type"] == "object" and schema["required"] == ["query"]
    assert schema["properties"]["query"]["type"] == "string"
    assert schema["properties"]["limit"] == {"default": 5, "title": "Limit", "type": "integer"}


def test_the_decorator_requires_idempotent() -> None:
    with pytest.raises(FxToolDefinitionError, match="idempotent"):

        @tool
        def bare(x: int) -> int:
            return x

    with pytest.raises(FxToolDefinitionError, match="idempotent"):
        tool(name="x")


def test_the_decorator_validates_input() -> None:
    @tool(idempotent=False, name="send_mail", description="Sends mail.")
    def send(to: str, count: int) -> str:
        return f"{to}:{count}"

    assert send.name == "send_mail" and send.writes is True
    assert send.execute is not None
    assert send.execute({"to": "a", "count": "3"}, None) == "a:3"  # type: ignore[arg-type]
    with pytest.raises(Exception, match="count"):
        send.execute({"to": "a"}, None)  # type: ignore[arg-type]


def test_results_are_strings_json_or_typed() -> None:
    assert format_result("as is") == ("as is", [], False)
    assert format_result({"b": 1, "a": [1, 2]}) == ('{"b":1,"a":[1,2]}', [], False)
    assert format_result(None) == ("null", [], False)
    typed = format_result({"type": "fx.tool-result", "text": "t", "images": [], "isError": True})
    assert typed == ("t", [], True)
    image = {"data": base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32).decode(), "mimeType": "image/png"}
    assert format_result({"type": "libfx.tool-result", "text": "t", "images": [image]}) == (
        format_result({"type": "fx.tool-result", "text": "t", "images": [image]}))  # libfx's tag
    with pytest.raises(ValueError, match="at most 8"):
        format_result({"type": "fx.tool-result", "text": "t", "images": [{"data": ""}] * 9})
    with pytest.raises(TypeError):
        format_result(object())
