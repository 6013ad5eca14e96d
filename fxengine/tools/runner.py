"""Runs the tool calls of one model response (docs/design.md §6).

Calls start in the order the model made them. Consecutive calls that do not write run
together, up to 16 at once; a writing call starts after every earlier call ended and
later calls wait for it. A call whose tool needs a barrier (not idempotent, or writes)
starts only once `wait_barrier()` returned: its intent (the model response) is durable.
Sync tools run on a shared thread pool so the event loop (which may carry 100+ turns)
never blocks on them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import functools
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypedDict

from ..limits import sniff_image_type
from .definition import Tool, ToolContext

MAX_CONCURRENT_CALLS = 16
TOOL_RESULT_IMAGES_MAX = 8
TOOL_RESULT_IMAGE_MAX_CHARS = 5 * 1024 * 1024  # base64 characters of one result image
TOOL_THREADS_MAX = 64
TOOL_RESULT_MAX_BYTES = 8 * 1024 * 1024

_executor: ThreadPoolExecutor | None = None


def _thread_pool() -> ThreadPoolExecutor:
    # asyncio's default executor has cpu_count + 4 threads: too few for 16 overlapping
    # sync calls on a small machine, so tools get their own pool.
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=TOOL_THREADS_MAX, thread_name_prefix="fx-tool")
    return _executor


def execution_id(session_id: str | None, turn_id: str, step: int, call_id: str) -> str:
    """A call's `ctx.execution_id`: `<session>:<turn>:<step>:<call id>` (no session: `<turn>:<step>:<call id>`).

    Built only from what the journal keeps, so every rerun of the call gets the same one.
    The session is part of it: turn ids are message ids, which the caller picks, so two
    sessions may run turns of the same id, and a service deduplicating on the execution
    id must not merge their calls.
    """
    if session_id is None:
        return f"{turn_id}:{step}:{call_id}"
    return f"{session_id}:{turn_id}:{step}:{call_id}"


class ToolCall(TypedDict):
    """A call as a model response carries it: `{id, name, arguments}` (the JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """One call of a response, as the runner gets it.

    `error` set means the call is answered with that error without running (unknown
    tool, arguments that are not a JSON object).
    """

    id: str
    name: str
    input: object  # the parsed arguments (an object), or their text when `error` is set
    execution_id: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """A call's result as the model will read it."""

    id: str
    name: str
    content: str
    is_error: bool
    images: list[dict[str, str]] = field(default_factory=list)


def parse_arguments(arguments: str) -> tuple[dict[str, object] | None, str | None]:
    """The call's input from its JSON arguments text, or an error message."""
    if not arguments.strip():
        return {}, None
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        return None, f"the tool call's arguments are not valid JSON ({exc})"
    if not isinstance(value, dict):
        return None, "the tool call's arguments must be a JSON object"
    return value, None


def _image(entry: object, index: int) -> dict[str, str]:
    if not isinstance(entry, Mapping):
        raise ValueError(f"tool result image {index} must be an object")
    data = entry.get("data")
    raw: bytes
    if isinstance(data, (bytes, bytearray)):
        raw = bytes(data)
    elif isinstance(data, str):
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"tool result image {index} is not base64") from None
    else:
        raise ValueError(f"tool result image {index} needs data")
    mime = sniff_image_type(raw)
    if mime is None:
        raise ValueError(f"tool result image {index} is not PNG, JPEG, GIF or WebP")
    claimed = entry.get("mimeType", entry.get("mime_type"))
    if claimed is not None and claimed != mime:
        raise ValueError(f"tool result image {index} claims {claimed!r} but its bytes are {mime}")
    data = base64.b64encode(raw).decode("ascii")
    if len(data) > TOOL_RESULT_IMAGE_MAX_CHARS:
        raise ValueError(f"tool result image {index} is over 5 MiB of base64")
    return {"mimeType": mime, "data": data}


TOOL_RESULT_TYPES = ("fx.tool-result", "libfx.tool-result")


def format_result(value: object) -> tuple[str, list[dict[str, str]], bool]:
    """(content, images, is_error) of a tool's return value.

    A string is sent as is; ``{"type": "fx.tool-result", "text", "images", "isError"?}``
    carries images (``"libfx.tool-result"``, libfx's tag, is the same); anything else is
    sent as JSON (`None` becomes ``"null"``).
    """
    if isinstance(value, str):
        return value, [], False
    if isinstance(value, Mapping) and value.get("type") in TOOL_RESULT_TYPES:
        text = value.get("text") or ""
        if not isinstance(text, str):
            raise ValueError("fx.tool-result text must be a string")
        images_in = value.get("images") or []
        if len(images_in) > TOOL_RESULT_IMAGES_MAX:
            raise ValueError(f"a tool result carries at most {TOOL_RESULT_IMAGES_MAX} images")
        images = [_image(entry, i) for i, entry in enumerate(images_in)]
        return text, images, bool(value.get("isError", False))
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")), [], False


async def execute_call(tool: Tool, call: PlannedCall, ctx: ToolContext) -> ToolOutcome:
    """Runs one call; a raised error (or a bad return value) becomes a failed result."""
    try:
        if tool.execute is None:  # an external tool: only a submitted result answers it
            return ToolOutcome(call.id, call.name, f"Tool {call.name} runs at the client, not here", True)
        if inspect.iscoroutinefunction(tool.execute):
            value = await tool.execute(call.input, ctx)
        else:
            loop = asyncio.get_running_loop()
            run = functools.partial(contextvars.copy_context().run, tool.execute, call.input, ctx)
            value = await loop.run_in_executor(_thread_pool(), run)
            if inspect.isawaitable(value):
                value = await value
        content, images, is_error = format_result(value)
        size = len(content.encode("utf-8", "surrogatepass")) + sum(len(i["data"]) for i in images)
        if size > TOOL_RESULT_MAX_BYTES:
            return ToolOutcome(call.id, call.name, f"Tool {call.name} returned {size} bytes, over the 8 MiB limit", True)
        return ToolOutcome(call.id, call.name, content, is_error, images)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        message = str(exc) or f"Tool {call.name} failed without a message"
        return ToolOutcome(call.id, call.name, message, True)


async def run_calls(
    calls: list[PlannedCall],
    *,
    tools: Mapping[str, Tool],
    make_ctx: Callable[[PlannedCall], ToolContext],
    on_start: Callable[[PlannedCall], Awaitable[None]],
    on_end: Callable[[PlannedCall, ToolOutcome], Awaitable[None]],
    wait_barrier: Callable[[], Awaitable[None]],
    max_concurrency: int = MAX_CONCURRENT_CALLS,
) -> dict[str, ToolOutcome]:
    """Runs `calls` and returns their outcomes by call id.

    `on_end` runs as each call finishes (so its result is recorded then); an exception
    from a callback stops every call. Cancelling the caller cancels the running calls
    and stops waiting for sync ones (their late results are dropped).
    """
    outcomes: dict[str, ToolOutcome] = {}
    gate = asyncio.Semaphore(max_concurrency)

    async def one(call: PlannedCall) -> None:
        async with gate:
            tool = tools.get(call.name)
            await on_start(call)
            if call.error is not None or tool is None:
                outcome = ToolOutcome(call.id, call.name, call.error or f"unknown tool {call.name}", True)
            else:
                outcome = await execute_call(tool, call, make_ctx(call))
        outcomes[call.id] = outcome
        await on_end(call, outcome)

    async with asyncio.TaskGroup() as group:
        running: list[asyncio.Task[None]] = []
        for call in calls:
            tool = tools.get(call.name)
            runnable = call.error is None and tool is not None
            if runnable and tool is not None and tool.runs_alone:
                if running:
                    await asyncio.wait(running)
                    running.clear()
                await wait_barrier()
                await one(call)
                continue
            if runnable and tool is not None and tool.needs_barrier:
                await wait_barrier()
            running.append(group.create_task(one(call)))
    return outcomes
