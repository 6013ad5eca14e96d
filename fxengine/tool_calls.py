"""The tool calls of one turn: a model response's calls run, and a resumed turn's calls decided.

`ToolCalls` runs a response's calls through `tools.runner.run_calls` and records each
result as it comes (docs/design.md §6); on resume it decides each call the crashed turn
left running: run it again (an idempotent tool, or `on_ambiguous` answered "rerun") or
answer it as ambiguous. While calls run it knows which (`in_flight`). It stops no turn by
itself: the runner's halt check runs before each call starts and after the calls end.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict

from . import events as ev
from . import tracing
from .persistence import Mark
from .tools.definition import Signal, ToolContext
from .tools.runner import PlannedCall, ToolCall, ToolOutcome, execution_id, parse_arguments, run_calls
from .turn import EventBuffer

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .core import EngineCore

AMBIGUOUS_RESULT = (
    "This call may have partly run: the session was interrupted while it ran, so its outcome is unknown. "
    "Check its effects before calling it again."
)

# The mark of a record that finishes something (a model response, a tool result): the
# progress a store counts poison turns against (docs/design.md §6).
DONE: dict[str, object] = {"done": True}

# Asked for each call a crashed turn left running, of a tool that is not idempotent:
# `{"executionId", "name", "input"}` -> "rerun" (or an awaitable of it) to run it again.
OnAmbiguous = Callable[[dict[str, object]], object]


class RunningCall(TypedDict):
    """A call that started and has not ended, as `in_flight` shows it (a call a stopped
    engine left running has no `executionId`)."""

    id: str
    name: str
    executionId: NotRequired[str]


class InFlight(TypedDict):
    """What a turn is doing right now: a model request, or the tool calls of a step."""

    kind: Literal["model", "tool"]
    step: int
    calls: list[RunningCall]


class ToolCalls:
    """Runs the tool calls of one turn's steps and records their results."""

    def __init__(
        self,
        core: EngineCore,
        turn_id: str,
        *,
        signal: Signal,
        events: EventBuffer,
        raise_if_halted: Callable[[], None],
        on_ambiguous: OnAmbiguous | None = None,
        no_rerun: bool = False,
    ) -> None:
        self._core = core
        self._turn_id = turn_id
        self._signal = signal
        self._events = events
        self._raise_if_halted = raise_if_halted
        self._on_ambiguous = on_ambiguous
        self._no_rerun = no_rerun
        self._step: int | None = None  # the step whose calls run, or None
        self._running: dict[str, RunningCall] = {}
        # The records of results of calls that may not run again (not idempotent), until the
        # next model request waits for them (`stored`).
        self._unstored: list[asyncio.Future[str | None]] = []

    def __repr__(self) -> str:
        return f"<ToolCalls turn={self._turn_id} step={self._step} running={len(self._running)}>"

    def in_flight(self) -> InFlight | None:
        """The calls running now (None when no step's calls run)."""
        if self._step is None:
            return None
        return {"kind": "tool", "step": self._step, "calls": list(self._running.values())}

    def needs_barrier(self, calls: list[ToolCall]) -> bool:
        """Whether a call of `calls` may start only once its response is durable."""
        tools = self._core.tools
        return any((tool := tools.get(call["name"])) is not None and tool.needs_barrier for call in calls)

    def _execution_id(self, step: int, call_id: str) -> str:
        return execution_id(self._core.session_id, self._turn_id, step, call_id)

    def _ctx(self, call: PlannedCall) -> ToolContext:
        core = self._core
        return ToolContext(self._signal, call.execution_id, core.session_id, core.context, core.epoch)

    async def run(self, step: int, calls: list[ToolCall], response_future: asyncio.Future[str | None] | None, *,
                  rerun: bool = False) -> None:
        """Runs `calls` of `step`, recording each result; a barrier call waits for
        `response_future` (the response's append) first."""
        core = self._core
        planned: list[PlannedCall] = []
        for call in calls:
            value, error = parse_arguments(call["arguments"])
            planned.append(PlannedCall(call["id"], call["name"], value if error is None else call["arguments"],
                                       self._execution_id(step, call["id"]), error))
        self._step = step

        spans: dict[str, Span | None] = {}

        async def on_start(call: PlannedCall) -> None:
            self._raise_if_halted()  # no call starts after a cancel, even one the tools swallowed
            self._running[call.id] = {"id": call.id, "name": call.name, "executionId": call.execution_id}
            tool = core.tools.get(call.name)
            spans[call.id] = tracing.start_tool_span(call.name, call.id, call.execution_id, rerun=rerun,
                                                     idempotent=tool.idempotent if tool is not None else None)
            await self._events.put(ev.tool_start(call.id, call.name, call.input, step))

        async def on_end(call: PlannedCall, outcome: ToolOutcome) -> None:
            self._running.pop(call.id, None)
            tracing.end_tool_span(spans.pop(call.id, None), is_error=outcome.is_error)
            if self._signal.aborted:
                return  # a late result after a cancel is dropped (the turn end answers the call)
            content = self.record(step, outcome)
            await self._events.put(ev.tool_end(call.id, call.name, is_error=outcome.is_error, content=content,
                                               step=step))

        async def wait_barrier() -> None:
            await core.journal.wait(response_future)

        try:
            await run_calls(planned, tools=core.tools, make_ctx=self._ctx, on_start=on_start, on_end=on_end,
                            wait_barrier=wait_barrier)
        finally:
            self._step = None
            self._running.clear()
        self._raise_if_halted()

    def _content(self, outcome: ToolOutcome) -> str:
        """The result's text, with a note when its images cannot go to this model."""
        core = self._core
        if outcome.images and not core.takes_images:
            return outcome.content + (f"\n[FX_MODEL_NO_IMAGES: the tool returned {len(outcome.images)} image(s); "
                                      f"model {core.spec.id} does not take images, so they were not sent]")
        return outcome.content

    def record(self, step: int, outcome: ToolOutcome, *, marks: Sequence[Mark] = ()) -> str:
        """Records a call's result (`tool_result`, with `marks` besides its own); the text
        the model reads."""
        content = self._content(outcome)
        images = outcome.images if self._core.takes_images else []
        body: dict[str, object] = {"step": step, "id": outcome.id, "name": outcome.name, "content": content,
                                   "isError": outcome.is_error}
        if images:
            body["images"] = images
        tool = self._core.tools.get(outcome.name)
        effect = tool is not None and not tool.idempotent
        stored = self._core.commit("tool_result", body, marks=[DONE, *marks], want_ack=effect)
        if stored is not None and effect:
            self._unstored.append(stored)
        return content

    async def stored(self) -> None:
        """Waits until the results of calls that may not run again are in the journal: the
        model must not read a result a crash could lose (a resume would answer that call
        as possibly partly run, though the model saw it end). An idempotent call's result
        needs no wait: a resume runs it again."""
        unstored, self._unstored = self._unstored, []
        for future in unstored:
            await self._core.journal.wait(future)

    async def resume(self, step: int, unanswered: list[ToolCall]) -> None:
        """Decides each call the crashed turn left running: rerun it or answer it as ambiguous."""
        core = self._core
        rerun: list[ToolCall] = []
        for call in unanswered:
            execution = self._execution_id(step, call["id"])
            if await self._again(call, execution):
                core.diag({"type": "tool.rerun", "sessionId": core.session_id, "executionId": execution,
                           "id": call["id"], "name": call["name"], "step": step})
                rerun.append(call)
                continue
            tracing.add_event("tool.ambiguous", {"gen_ai.tool.name": call["name"], "gen_ai.tool.call.id": call["id"],
                                                 "fx.tool.execution_id": execution})
            core.commit("tool_result", {"step": step, "id": call["id"], "name": call["name"],
                                        "content": AMBIGUOUS_RESULT, "isError": True}, marks=[DONE])
            await self._events.put(ev.tool_end(call["id"], call["name"], is_error=True, content=AMBIGUOUS_RESULT,
                                               step=step))
        if rerun:
            await self.run(step, rerun, None, rerun=True)

    async def _again(self, call: ToolCall, execution: str) -> bool:
        """Whether a call the crashed turn left running runs again."""
        tool = self._core.tools.get(call["name"])
        value, error = parse_arguments(call["arguments"])
        if tool is None or error is not None or self._no_rerun:
            return False
        if tool.idempotent:
            return True
        if self._on_ambiguous is None:
            return False
        answer = self._on_ambiguous({"executionId": execution, "name": call["name"], "input": value})
        if inspect.isawaitable(answer):
            answer = await answer
        return answer == "rerun"
