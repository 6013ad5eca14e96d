"""MCP tools for an engine or an agent: `create_mcp_adapter(session, prefix=...)`.

    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            mcp = await create_mcp_adapter(session, prefix="github_", idempotent={"get_issue": True})
            engine = await create_engine(model, tools=mcp.tools, instructions=mcp.instructions)

The adapter lists the server's tools once, over the official `mcp` SDK's `ClientSession`
(any object with its `list_tools()` and `call_tool(name, arguments)` will do), and makes
each a `Tool` that calls the server. The caller owns the connection: it opens the session,
handles its auth, and closes it after the agent; `McpAdapter.close()` only stops the tools
from calling it.

Every MCP tool is `idempotent=False` (a server's hints are not to be trusted), so after a
crash its call is answered as possibly run instead of being sent twice; name the tools you
know are safe to repeat in `idempotent=`. Needs the `mcp` extra (``pip install
fxworker[mcp]``) only for pages past the first of a tool listing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .errors import FxToolDefinitionError
from .tools.definition import Tool, ToolContext
from .tools.runner import TOOL_RESULT_IMAGES_MAX

if TYPE_CHECKING:
    from mcp.types import PaginatedRequestParams

LIST_PAGES_MAX = 100


class McpSession(Protocol):
    """What the adapter uses of an MCP session: the SDK's `ClientSession`, or a fake.

    Each answer is an SDK result (a pydantic model) or its wire dict.
    """

    async def list_tools(self, *, params: PaginatedRequestParams | None = None) -> object: ...

    async def call_tool(self, name: str, arguments: dict[str, object] | None = None) -> object: ...


@dataclass
class McpAdapter:
    """The tools of one MCP server, and its instructions.

    Attributes:
        tools: one `Tool` per server tool, named `prefix + name`.
        instructions: the server's instructions (from its initialize result), or "".
        names: tool name as the model sees it → the server's own name.
    """

    tools: list[Tool]
    instructions: str
    names: dict[str, str] = field(default_factory=dict)
    closed: bool = False

    async def close(self) -> None:
        """Stops the adapter's tools from calling the server (a call then fails); the
        connection itself is the caller's to close."""
        self.closed = True


def _dump(value: Any) -> dict[str, Any]:
    """An SDK object (pydantic, camelCase on the wire) or a dict, as a plain wire dict."""
    if isinstance(value, Mapping):
        return dict(value)
    dumped: dict[str, Any] = value.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def _server_instructions(session: McpSession) -> str:
    text = getattr(session, "instructions", None)
    if text is None:
        result = getattr(session, "initialize_result", None)
        text = getattr(result, "instructions", None) if result is not None else None
    return text if isinstance(text, str) else ""


async def _list_tools(session: McpSession) -> list[dict[str, Any]]:
    """Every tool of the server, following `nextCursor` pages."""
    listed: list[dict[str, Any]] = []
    page = _dump(await session.list_tools())
    for _ in range(LIST_PAGES_MAX):
        listed += [_dump(t) for t in page.get("tools") or []]
        cursor = page.get("nextCursor")
        if not cursor:
            return listed
        try:
            from mcp.types import PaginatedRequestParams
        except ImportError as exc:
            raise ImportError("fxengine.mcp needs the mcp SDK: pip install 'fxworker[mcp]'") from exc
        page = _dump(await session.list_tools(params=PaginatedRequestParams(cursor=cursor)))
    raise FxToolDefinitionError(f"the MCP server's tool listing runs past {LIST_PAGES_MAX} pages")


def _overrides(idempotent: Mapping[str, bool] | Iterable[str] | None) -> dict[str, bool]:
    if idempotent is None:
        return {}
    if isinstance(idempotent, Mapping):
        out = dict(idempotent)
    elif isinstance(idempotent, (str, bytes)):
        raise FxToolDefinitionError("idempotent= takes a dict of tool name → bool, or a list of tool names")
    else:
        out = {name: True for name in idempotent}
    for name, flag in out.items():
        if not isinstance(name, str) or not isinstance(flag, bool):
            raise FxToolDefinitionError(f"idempotent= maps tool names to True or False, got {name!r}: {flag!r}")
    return out


def result_of(raw: Any) -> dict[str, Any] | str:
    """A `CallToolResult` as a tool return value: text, or ``fx.tool-result`` with images.

    Text blocks are joined by newlines; image blocks become images (up to 8, the rest
    named in the text); embedded text resources are inlined, other resources and links are
    named by URI; structured content with no text is sent as JSON.
    """
    result = _dump(raw)
    texts: list[str] = []
    images: list[dict[str, str]] = []
    for block in result.get("content") or []:
        block = _dump(block)
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "image" and len(images) < TOOL_RESULT_IMAGES_MAX:
            images.append({"data": block.get("data", ""), "mimeType": block.get("mimeType", "")})
        elif kind == "image":
            texts.append(f"[an image past the first {TOOL_RESULT_IMAGES_MAX} was left out]")
        elif kind == "resource":
            resource = _dump(block.get("resource") or {})
            texts.append(resource["text"] if "text" in resource else f"[resource {resource.get('uri', '')}]")
        elif kind == "resource_link":
            texts.append(f"[resource {block.get('uri', '')}]")
        else:
            texts.append(f"[{kind} content]")
    structured = result.get("structuredContent")
    if not texts and structured is not None:
        texts.append(json.dumps(structured, ensure_ascii=False, separators=(",", ":")))
    text = "\n".join(texts)
    is_error = bool(result.get("isError"))
    if images or is_error:
        return {"type": "fx.tool-result", "text": text, "images": images, "isError": is_error}
    return text


def _tool(session: McpSession, adapter: McpAdapter, spec: dict[str, Any], name: str, idempotent: bool) -> Tool:
    server_name = spec["name"]

    async def execute(input: object, ctx: ToolContext) -> object:
        if adapter.closed:
            raise RuntimeError(f"the MCP adapter of {name} is closed")
        arguments = input if isinstance(input, dict) else {}  # the call's input is an object
        return result_of(await session.call_tool(server_name, arguments))

    schema = dict(spec.get("inputSchema") or {"type": "object"})
    schema.setdefault("type", "object")
    description = spec.get("description") or spec.get("title") or ""
    try:
        return Tool(name, description, schema, idempotent=idempotent, execute=execute)
    except FxToolDefinitionError as exc:
        raise FxToolDefinitionError(f"MCP tool {server_name!r}: {exc}") from exc


async def create_mcp_adapter(
    session: McpSession,
    *,
    prefix: str = "",
    idempotent: Mapping[str, bool] | Iterable[str] | None = None,
    instructions: str | None = None,
) -> McpAdapter:
    """Lists the server's tools and returns them as `Tool`s, with its instructions.

    Args:
        session: an initialized `mcp.ClientSession` (the caller keeps and closes it).
        prefix: put before every tool name (``"github_"``), so two servers' tools differ.
        idempotent: tools safe to run twice, by the server's name or the prefixed one
            (``{"get_issue": True}`` or ``["get_issue"]``); every other tool is
            `idempotent=False`.
        instructions: overrides the server's instructions.

    Raises:
        FxToolDefinitionError: a tool name that is not 1 to 64 of letters, digits, `_`
            and `-` once prefixed, two tools of one name, or `idempotent` naming no tool
            of the server (`FX_TOOL_INVALID`).
    """
    if not isinstance(prefix, str):
        raise FxToolDefinitionError("prefix must be a string")
    overrides = _overrides(idempotent)
    adapter = McpAdapter(tools=[], instructions=instructions if instructions is not None else _server_instructions(session))
    for spec in await _list_tools(session):
        server_name = str(spec.get("name", ""))
        name = prefix + server_name
        if name in adapter.names:
            raise FxToolDefinitionError(f"the MCP server lists two tools named {server_name!r}")
        flag = overrides.pop(name, None)
        server_flag = overrides.pop(server_name, None)
        safe = flag if flag is not None else bool(server_flag)
        adapter.tools.append(_tool(session, adapter, spec, name, safe))
        adapter.names[name] = server_name
    if overrides:
        raise FxToolDefinitionError(f"idempotent= names no tool of this MCP server: {', '.join(sorted(overrides))}")
    return adapter
