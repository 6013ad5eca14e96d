"""Typed answers: a turn whose answer is an object of a given type (docs/design.md §6 "Typed answers").

    engine = await create_engine(..., output_type=Invoice)
    result = await engine.prompt("Extract the invoice in this mail: ...").result()
    result.output                            # Invoice(number=..., total=...)

The type is anything pydantic validates (a `BaseModel`, a dataclass, a `TypedDict`, a
union of them) or plain `str` (the answer's text, as an untyped turn has it). The model is
asked for the object one of two ways (`OutputMode`):

- ``"native"``: the request carries a JSON-schema response format (Chat Completions
  `response_format`, Responses `text.format`); the answer's text is the object.
- ``"tool"``: the request offers one more tool, `final_result`, whose arguments are the
  object; the engine answers that call itself, and a valid one ends the turn.

``"auto"`` (the default) takes native where the model's catalog entry says it supports a
response format (`ModelEntry.supports_structured_output`) or takes no tools, else the
tool, which any model that calls tools can use. A schema whose root is not an object is wrapped as
``{"response": <it>}`` both ways (a response format and tool arguments must be objects).

Each answer is judged here (`Output.judge`) and the verdict is journaled with the response
(an `output` record): a valid answer ends the turn `end_turn` with the object; an invalid
one goes back to the model with pydantic's errors (as the final-result call's result, or
as a user message) and the model tries again, up to `retries` times; past that the turn
ends `error` `FX_OUTPUT_INVALID` with the last errors. A crash resumes from the verdict: a
valid answer is never asked for again, and a retry carries the errors it was given.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast

from pydantic import TypeAdapter, ValidationError
from pydantic.errors import PydanticUserError

from .codes import Code
from .errors import FxInputError
from .limits import JSONValue
from .providers import ModelSpec

__all__ = [
    "DEFAULT_OUTPUT_RETRIES",
    "FINAL_RESULT_TOOL",
    "MAX_OUTPUT_RETRIES",
    "Output",
    "OutputMode",
    "Verdict",
    "output_type_name",
    "resolve_output_type",
]

T = TypeVar("T")
OutputMode = Literal["auto", "native", "tool"]
MODES: tuple[str, ...] = ("auto", "native", "tool")
FINAL_RESULT_TOOL = "final_result"
DEFAULT_OUTPUT_RETRIES = 1
MAX_OUTPUT_RETRIES = 10
ERRORS_MAX_CHARS = 4000  # of the validation errors sent back to the model (and kept in the end's error)
_WRAP_KEY = "response"
_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]")
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*)\n\s*```$", re.DOTALL)


def output_type_name(output_type: object) -> str | None:
    """``"module:qualname"`` of a class another process can import by that name, else None
    (a union, a class defined in a function, a builtin)."""
    module = getattr(output_type, "__module__", None)
    qualname = getattr(output_type, "__qualname__", None)
    if not isinstance(output_type, type) or not isinstance(module, str) or not isinstance(qualname, str):
        return None
    if module in ("builtins", "__main__") or "<" in qualname:
        return None
    try:
        found = resolve_output_type(f"{module}:{qualname}")
    except FxInputError:
        return None
    return f"{module}:{qualname}" if found is output_type else None


def resolve_output_type(name: str) -> object:
    """The type named ``"module:qualname"`` (imported here; `FX_OUTPUT_TYPE_INVALID` if it
    cannot be)."""
    module_name, _, qualname = name.partition(":")
    if not module_name or not qualname:
        raise FxInputError(f"output type {name!r} is not of the form 'module:Name'", code=Code.OUTPUT_TYPE_INVALID)
    try:
        found: object = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise FxInputError(f"output type {name!r} cannot be imported here ({type(exc).__name__}: {exc})",
                           code=Code.OUTPUT_TYPE_INVALID) from None
    return found


@dataclass(frozen=True)
class Verdict:
    """What an answer was found to be: `value` (the object as JSON) when valid, else the
    errors and the text the model reads to try again."""

    value: JSONValue = None
    errors: list[dict[str, object]] | None = None
    retry: str = ""

    @property
    def ok(self) -> bool:
        return self.errors is None


class Output(Generic[T]):
    """How a turn's answer is asked for and checked: the type, the mode and the retries.

    Raises (on construction) `FX_OUTPUT_TYPE_INVALID` for a type pydantic cannot validate
    or describe, `FX_INVALID_INPUT` for a bad mode or retry count.
    """

    def __init__(self, output_type: type[T] | object, *, mode: str = "auto",
                 retries: int = DEFAULT_OUTPUT_RETRIES) -> None:
        if isinstance(output_type, str):
            output_type = resolve_output_type(output_type)
        if mode not in MODES:
            raise FxInputError(f"output_mode must be one of {', '.join(MODES)}, not {mode!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_OUTPUT_RETRIES:
            raise FxInputError(f"output_retries must be an integer from 0 to {MAX_OUTPUT_RETRIES}")
        self.type = output_type
        self.mode = mode
        self.retries = retries
        self.name = output_type_name(output_type)
        self.text = output_type is str
        self._adapter, schema = _described(output_type)
        title = schema.get("title") if isinstance(schema.get("title"), str) else getattr(output_type, "__name__", "")
        self.title = _SCHEMA_NAME.sub("_", str(title or "response"))[:64] or "response"
        self.wrapped = schema.get("type") != "object"
        self.schema: dict[str, Any] = _wrap(schema) if self.wrapped else schema

    def __repr__(self) -> str:
        return f"<Output {self.name or self.title} mode={self.mode} retries={self.retries}>"

    def mode_for(self, spec: ModelSpec) -> Literal["native", "tool"]:
        """The mode a request to `spec`'s model uses (``"auto"`` resolved by its catalog entry)."""
        if self.mode == "native":
            return "native"
        if self.mode == "tool":
            return "tool"
        entry = spec.entry
        # A model that takes no tools can only be asked natively.
        native = entry is not None and (entry.supports_structured_output or not entry.supports_tools)
        return "native" if native else "tool"

    def tool(self) -> dict[str, object]:
        """The final-result tool, in the Chat Completions `tools` shape."""
        return {"type": "function", "function": {
            "name": FINAL_RESULT_TOOL,
            "description": f"Give the final answer: call this once, with the {self.title} object as its arguments.",
            "parameters": self.schema}}

    def response_format(self) -> dict[str, object]:
        """The Chat Completions `response_format` asking for the object."""
        # Not strict: a pydantic schema is rarely in the subset strict mode takes (every
        # property required, no defaults); the validation below is the check.
        return {"type": "json_schema", "json_schema": {"name": self.title, "schema": self.schema, "strict": False}}

    def judge(self, answer: str, *, by_tool: bool) -> Verdict:
        """The verdict on an answer: the text of a native answer, or a final-result call's
        arguments (`by_tool`)."""
        raw = answer.strip()
        fenced = _FENCE.match(raw) if not by_tool else None
        try:
            data: object = json.loads(fenced.group(1) if fenced else raw)
        except ValueError as exc:
            return self._invalid([{"type": "json_invalid", "loc": [], "msg": f"not JSON: {exc}"}], by_tool)
        if self.wrapped:
            if not isinstance(data, Mapping) or _WRAP_KEY not in data:
                return self._invalid([{"type": "missing", "loc": [_WRAP_KEY], "msg": "Field required"}], by_tool)
            data = data[_WRAP_KEY]
        try:
            value = self._adapter.validate_python(data)
        except ValidationError as exc:
            return self._invalid([_error(e) for e in exc.errors(include_url=False, include_context=False)], by_tool)
        return Verdict(value=cast(JSONValue, self._adapter.dump_python(value, mode="json")))

    def text_answer(self) -> Verdict:
        """The verdict on an answer in text when the final-result tool was asked for."""
        return Verdict(errors=[{"type": "no_final_result", "loc": [], "msg": "answered in text"}],
                       retry=f"Give your answer by calling the {FINAL_RESULT_TOOL} tool with the {self.title} object "
                             "as its arguments; an answer in text is not taken.")

    def load(self, value: object) -> T:
        """The object of a valid answer's JSON (`Verdict.value`, a `turn_end`'s `output`)."""
        return cast(T, self._adapter.validate_python(value))

    def _invalid(self, errors: list[dict[str, object]], by_tool: bool) -> Verdict:
        listed = json.dumps(errors, ensure_ascii=False, default=str)
        if len(listed) > ERRORS_MAX_CHARS:
            listed = listed[:ERRORS_MAX_CHARS] + " ..."
        where = "The arguments did not" if by_tool else "Your answer did not"
        retry = f"{where} validate as {self.title}: {listed}\nFix the errors and answer again."
        return Verdict(errors=errors, retry=retry)


_DESCRIBED: dict[object, tuple[TypeAdapter[Any], dict[str, Any]]] = {}
_DESCRIBED_MAX = 256


def _described(output_type: object) -> tuple[TypeAdapter[Any], dict[str, Any]]:
    """pydantic's validator and JSON schema of a type, built once per type (an engine is
    made per claim on the workers; building them costs more than the turn's judging)."""
    try:
        found = _DESCRIBED.get(output_type)
    except TypeError:  # an unhashable type: described each time
        found = None
    if found is not None:
        return found
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(cast("type[Any]", output_type))
        schema = adapter.json_schema() if output_type is not str else {"type": "string"}
    except (PydanticUserError, TypeError, ValueError) as exc:
        raise FxInputError(f"output_type {output_type!r} cannot be an answer's type: {exc}",
                           code=Code.OUTPUT_TYPE_INVALID) from None
    try:
        if len(_DESCRIBED) < _DESCRIBED_MAX:
            _DESCRIBED[output_type] = (adapter, schema)
    except TypeError:
        pass
    return adapter, schema


def _wrap(schema: dict[str, Any]) -> dict[str, Any]:
    """`{"response": schema}` as an object schema; its `$defs` stay at the root, where its
    references point."""
    inner = dict(schema)
    defs = inner.pop("$defs", None)
    wrapped: dict[str, Any] = {"type": "object", "properties": {_WRAP_KEY: inner}, "required": [_WRAP_KEY]}
    if defs is not None:
        wrapped["$defs"] = defs
    return wrapped


def _error(error: Mapping[str, Any]) -> dict[str, object]:
    """One pydantic error as the model reads it: its type, where, and what (not its input)."""
    return {"type": error.get("type"), "loc": list(error.get("loc") or ()), "msg": error.get("msg")}


def error_body(output: Output[Any], verdict: Verdict, attempts: int) -> dict[str, object]:
    """The `error` of a turn whose answers never validated (`FX_OUTPUT_INVALID`)."""
    listed = json.dumps(verdict.errors or [], ensure_ascii=False, default=str)[:ERRORS_MAX_CHARS]
    return {"code": Code.OUTPUT_INVALID,
            "message": f"the model's answer did not validate as {output.name or output.title} "
                       f"after {attempts} attempt{'s' if attempts != 1 else ''}: {listed}",
            "errors": list(verdict.errors or [])}
