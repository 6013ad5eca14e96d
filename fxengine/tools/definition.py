"""What a tool is (docs/design.md §6): its description for the model, its effects, its `ctx`."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import FxToolDefinitionError
from ..limits import JSONValue

_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")
TOOLS_MAX = 64

# `execute(input, ctx)`: the call's input (its JSON arguments, an object) and context in,
# the result out (or an awaitable of it); see `runner.format_result`.
Execute = Callable[[object, "ToolContext"], object]
# `approval(input, ctx)`: whether this call waits for a person's decision (a bool, or an
# awaitable of one); the input is the call's parsed arguments.
ApprovalFn = Callable[[dict[str, object], "ToolContext"], object]


class Signal:
    """Aborts when the turn is cancelled (or stops for good); handed to tools as `ctx.signal`.

    `aborted` and `reason` are plain attributes, safe to read from a tool running in a
    thread; `await wait()` returns once aborted; `wait_blocking(timeout_s)` is the
    thread-side twin.
    """

    def __init__(self) -> None:
        self.aborted = False
        self.reason: str | None = None
        self._event = asyncio.Event()
        self._thread_event = threading.Event()

    def __repr__(self) -> str:
        return f"<Signal aborted={self.aborted} reason={self.reason!r}>"

    def abort(self, reason: str = "cancelled") -> None:
        """Aborts once; later calls keep the first reason. Call from the engine's loop."""
        if self.aborted:
            return
        self.aborted = True
        self.reason = reason
        self._event.set()
        self._thread_event.set()

    async def wait(self) -> str | None:
        """Returns the reason once the signal aborts."""
        await self._event.wait()
        return self.reason

    def wait_blocking(self, timeout_s: float | None = None) -> bool:
        """Blocks a thread until aborted or `timeout_s` passed; True when aborted."""
        return self._thread_event.wait(timeout_s)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What `execute(input, ctx)` gets besides the input.

    Attributes:
        signal: aborts when the turn is cancelled.
        execution_id: the call's id, the same on every rerun of that call and unique
            across sessions: `<session>:<turn>:<step>:<call id>` (`runner.execution_id`).
        session_id: the session (or None for an engine alone).
        context: the JSON context handed to the engine.
        epoch: the lease epoch of the process running the call (a fencing token), or None.
    """

    signal: Signal
    execution_id: str
    session_id: str | None = None
    context: JSONValue = None
    epoch: int | None = None


@dataclass(frozen=True)
class Tool:
    """A tool the model may call.

    Args:
        name: 1 to 64 of letters, digits, `_` and `-`.
        description: what the model reads.
        input_schema: a JSON schema of type object.
        idempotent: required; True when running the call twice is safe, so a call cut
            off by a crash runs again under the same `execution_id`.
        writes: defaults to `not idempotent`; a writing call runs alone.
        execute: `execute(input, ctx)`, sync (run in a thread) or async.
        provider_executed: the provider runs it (AI Gateway's `web_search`); it is passed
            through in the request and never runs here (`provider_tool`).
        options: for a provider-executed tool, the settings passed with it.
        approval: True when every call waits for a person's decision before it runs, or
            `approval(input, ctx) -> bool` to ask only for some calls (a refund above a
            limit); a call that waits parks its turn `paused` (docs/design.md §6).
        external: the client runs it: no `execute` here, and its result is the one a
            client submits (`engine.resume(decisions=...)`); a call parks its turn too.
    """

    name: str
    description: str
    input_schema: Mapping[str, object]
    idempotent: bool
    writes: bool | None = None
    execute: Execute | None = field(default=None, repr=False)
    provider_executed: bool = False
    options: Mapping[str, object] = field(default_factory=dict)
    approval: bool | ApprovalFn = field(default=False, repr=False)
    external: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise FxToolDefinitionError(f"tool name {self.name!r} must be 1 to 64 of letters, digits, '_' or '-'")
        if not isinstance(self.idempotent, bool):
            raise FxToolDefinitionError(f"tool {self.name} must set idempotent=True or False")
        if self.writes is None:
            object.__setattr__(self, "writes", not self.idempotent)
        elif not isinstance(self.writes, bool):
            raise FxToolDefinitionError(f"tool {self.name}: writes must be a bool")
        if not isinstance(self.description, str):
            raise FxToolDefinitionError(f"tool {self.name}: description must be a string")
        schema = self.input_schema
        if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
            raise FxToolDefinitionError(f"tool {self.name}: input_schema must be a JSON schema of type object")
        self._check_waiting()
        if self.external:
            object.__setattr__(self, "execute", None)  # answered only by a submitted result
        elif not callable(self.execute):
            raise FxToolDefinitionError(f"tool {self.name}: execute must be callable")

    def _check_waiting(self) -> None:
        """`approval` and `external`: what makes a call of this tool wait for a decision."""
        if not isinstance(self.approval, bool) and not callable(self.approval):
            raise FxToolDefinitionError(f"tool {self.name}: approval must be a bool or a function (input, ctx) -> bool")
        if not isinstance(self.external, bool):
            raise FxToolDefinitionError(f"tool {self.name}: external must be a bool")
        if self.external and (self.approval is not False or self.provider_executed):
            raise FxToolDefinitionError(
                f"tool {self.name}: an external tool's submitted result is its decision (no approval, not provider-run)")

    @property
    def needs_barrier(self) -> bool:
        """True when the call may start only after its intent is durably recorded."""
        return not self.idempotent or bool(self.writes)

    @property
    def runs_alone(self) -> bool:
        """True when the call overlaps no other call of its response."""
        return bool(self.writes)

    def describe(self) -> dict[str, object]:
        """The tool as a Chat Completions `tools` entry (``{"type": <name>, **options}`` for
        a provider-executed one)."""
        if self.provider_executed:
            return {"type": self.name, **self.options}
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.input_schema)},
        }


def _runs_at_provider(input: object, ctx: ToolContext) -> object:
    raise RuntimeError("this tool runs at the model provider, not in this process")


def provider_tool(name: str, **options: object) -> Tool:
    """A tool the provider runs, such as AI Gateway's web search (``provider_tool("web_search")``).

    It goes to the model in the request's `tools` as ``{"type": name, **options}``; a call
    of it that reaches this process anyway is answered as an error, never run.
    """
    return Tool(name, "", {"type": "object"}, idempotent=True, writes=False, execute=_runs_at_provider,
                provider_executed=True, options=dict(options))


def _from_mapping(spec: Mapping[str, object]) -> Tool:
    """A tool given as a dict: only ``{"name", "provider_executed": True, **options}``."""
    options = dict(spec)
    name = options.pop("name", None)
    flag = options.pop("provider_executed", options.pop("providerExecuted", None))
    if flag is not True or not isinstance(name, str):
        raise FxToolDefinitionError(
            f"{spec!r} is not a Tool: a dict tool is {{'name', 'provider_executed': True}} (else use Tool or @tool)")
    return provider_tool(name, **options)


def check_tools(tools: Iterable[object] | Mapping[str, object] | None) -> dict[str, Tool]:
    """Validates a tool list (or a dict keyed by name) and returns it keyed by name.

    An item is a `Tool`, or ``{"name": "web_search", "provider_executed": True}`` for a
    tool the provider runs (`provider_tool`).
    """
    if tools is None:
        return {}
    items = list(tools.values()) if isinstance(tools, Mapping) else list(tools)
    if len(items) > TOOLS_MAX:
        raise FxToolDefinitionError(f"at most {TOOLS_MAX} tools")
    out: dict[str, Tool] = {}
    for item in items:
        if isinstance(item, Mapping):
            item = _from_mapping(item)
        if not isinstance(item, Tool):
            raise FxToolDefinitionError(f"{item!r} is not a Tool (use Tool(...) or @tool(idempotent=...))")
        if item.name in out:
            raise FxToolDefinitionError(f"two tools are named {item.name}")
        out[item.name] = item
    return out
