"""`@tool(idempotent=...)`: a `Tool` from a typed function, its schema derived by pydantic."""

from __future__ import annotations

import enum
import inspect
import typing
from collections.abc import Callable
from typing import Any, overload

import pydantic

from ..errors import FxToolDefinitionError
from .definition import ApprovalFn, Tool, ToolContext

class _Missing(enum.Enum):
    """`idempotent` not given (it has no default: every tool must say)."""

    MISSING = enum.auto()


_MISSING = _Missing.MISSING


def _is_ctx(name: str, annotation: object) -> bool:
    return name == "ctx" or annotation is ToolContext


def _build(fn: Callable[..., object], *, idempotent: bool, writes: bool | None, name: str | None,
           description: str | None, approval: bool | ApprovalFn, external: bool) -> Tool:
    tool_name = name or fn.__name__
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # an unresolvable annotation is a definition error, not a crash later
        raise FxToolDefinitionError(f"tool {tool_name}: cannot read its type hints ({exc})") from exc
    fields: dict[str, Any] = {}  # name -> (annotation, default), as pydantic takes them
    ctx_param: str | None = None
    for param in inspect.signature(fn).parameters.values():
        annotation = hints.get(param.name, Any)  # unannotated: any JSON value
        if _is_ctx(param.name, annotation):
            ctx_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise FxToolDefinitionError(f"tool {tool_name}: *args and **kwargs have no schema")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    model = pydantic.create_model(f"{tool_name}_input", **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)

    def arguments(input: object, ctx: ToolContext) -> dict[str, object]:
        validated = model.model_validate(input if input is not None else {})
        kwargs = {key: getattr(validated, key) for key in fields}
        if ctx_param is not None:
            kwargs[ctx_param] = ctx
        return kwargs

    execute: Callable[[object, ToolContext], object]
    if inspect.iscoroutinefunction(fn):

        async def execute_async(input: object, ctx: ToolContext) -> object:
            result: object = await fn(**arguments(input, ctx))
            return result

        execute = execute_async
    else:

        def execute_sync(input: object, ctx: ToolContext) -> object:
            return fn(**arguments(input, ctx))

        execute = execute_sync
    doc = description if description is not None else inspect.cleandoc(fn.__doc__ or "")
    return Tool(tool_name, doc, schema, idempotent, writes, execute, approval=approval, external=external)


@overload
def tool(fn: Callable[..., object], *, idempotent: bool = ..., writes: bool | None = ..., name: str | None = ...,
         description: str | None = ..., approval: bool | ApprovalFn = ..., external: bool = ...) -> Tool: ...
@overload
def tool(fn: None = None, *, idempotent: bool = ..., writes: bool | None = ..., name: str | None = ...,
         description: str | None = ..., approval: bool | ApprovalFn = ...,
         external: bool = ...) -> Callable[[Callable[..., object]], Tool]: ...
def tool(
    fn: Callable[..., object] | None = None,
    *,
    idempotent: bool | _Missing = _MISSING,
    writes: bool | None = None,
    name: str | None = None,
    description: str | None = None,
    approval: bool | ApprovalFn = False,
    external: bool = False,
) -> Tool | Callable[[Callable[..., object]], Tool]:
    """Makes a `Tool` of a function; its parameters become the input schema.

    A parameter named `ctx` (or annotated `ToolContext`) receives the call's context.
    The docstring is the description unless `description` is given. `approval=True` (or
    `approval=fn(input, ctx) -> bool`) makes a call wait for a person's decision;
    `external=True` declares a tool the client runs: the signature gives its schema and
    the body is never run here (docs/design.md §6, paused turns).

        @tool(idempotent=True)
        async def lookup(query: str, limit: int = 5) -> list[str]:
            \"\"\"Searches the catalog.\"\"\"

    Raises:
        FxToolDefinitionError: `idempotent` is not given, or the signature has no schema.
    """
    if idempotent is _MISSING:
        raise FxToolDefinitionError("@tool needs idempotent=True or idempotent=False")

    flag = idempotent

    def wrap(f: Callable[..., object]) -> Tool:
        return _build(f, idempotent=flag, writes=writes, name=name, description=description, approval=approval,
                      external=external)

    return wrap(fn) if fn is not None else wrap
