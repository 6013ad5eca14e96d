"""The turn loop: model step -> tool calls -> model step ... until the model ends (docs/design.md §4, §6).

Every change goes through `EngineCore.commit` (applied to the conversation, then
journaled), so a replay rebuilds the same state. The runner is one asyncio task in a
`Phase`; `cancel()`, `detach()` and a failed journal append stop it through
`Task.cancel()`, and the `Halt` set beforehand says which of them it was. The halt, not the
`CancelledError`, is what stops the turn: code the task awaits can swallow the error (a tool
that catches it; `asyncio.wait_for` on Python 3.11 when what it waits for, such as the
aborted signal, finishes in the same loop iteration), so the loop checks the halt before
each model request and each tool call (`_raise_if_halted`). Steering cancels only the
streaming sub-task. The
runner's owner hears of the turn's end and of a detach through callbacks (`on_finish`,
`on_detach`); the runner never touches its owner's state.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import events as ev
from . import tracing
from .codes import Code
from .errors import FxError, FxInputError, FxJournalAppendError, FxSteerDeferredError
from .ids import new_steer_id, now_ms
from .journal.journal import JournalStopped
from .limits import check_message_id, check_prompt_input, check_steer_text, has_images, prompt_text
from .models.openai_chat import StepOutput, build_request, model_step
from .tools.definition import Signal, ToolContext
from .tools.runner import PlannedCall, ToolOutcome, execution_id, parse_arguments, run_calls
from .turn import EventBuffer, TurnResult

if TYPE_CHECKING:
    from .core import EngineCore

AMBIGUOUS_RESULT = (
    "This call may have partly run: the session was interrupted while it ran, so its outcome is unknown. "
    "Check its effects before calling it again."
)

OnAmbiguous = Callable[[dict[str, Any]], Any]
# How a turn stops: its stop reason and error (None when there is none).
Stop = tuple[str, dict[str, Any] | None]
OnFinish = Callable[["TurnRunner"], None]
OnDetach = Callable[[], None]

# The mark of a record that finishes something (a model response, a tool result): the
# progress a store counts poison turns against (docs/design.md §6).
DONE: dict[str, Any] = {"done": True}


class Phase(enum.Enum):
    """Where a turn runner is; it only moves forward (STARTING -> ... -> ENDED)."""

    STARTING = "starting"  # created; its task has not run a step (a stop needs no Task.cancel)
    RUNNING = "running"
    ENDING = "ending"  # the model answered and no steer waits: no more steers
    FINISHING = "finishing"  # its end is being recorded: a cancel no longer applies
    ENDED = "ended"  # its result is set


class Halt(enum.IntEnum):
    """Why a turn was stopped from outside; a higher one overrides a lower one."""

    CANCELLED = 1  # cancel(): the turn ends `cancelled`
    DETACHED = 2  # detach(): another worker owns the session; nothing more is written
    JOURNAL_FAILED = 3  # an append failed: the turn ends with FX_JOURNAL_APPEND_FAILED


class TurnRunner:
    """Runs one turn (a new prompt, or the resume of an open turn) on an engine's core.

    `on_finish(runner)` is called once the turn's end is recorded, just before its result
    is set; `on_detach()` when `detach()` stops the turn, before its signal aborts (the
    owner stops the journal there: nothing more is written).
    """

    def __init__(
        self,
        core: EngineCore,
        turn_id: str,
        *,
        on_finish: OnFinish,
        on_detach: OnDetach,
        blocks: list[dict[str, Any]] | None = None,
        prepare: Any = None,
        yield_at: float | None = None,
        resume: bool = False,
        on_ambiguous: OnAmbiguous | None = None,
        no_rerun: bool = False,
        next_step: int | None = None,
    ) -> None:
        self.core = core
        self.turn_id = turn_id
        self.events = EventBuffer(sink=core.event_sink, diag=core.diag)
        self.result_future: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        open_turn = core.conversation.open
        self.retract_candidates: list[int] = open_turn.retract if resume and open_turn is not None else []
        self.signal = Signal()
        self._on_finish = on_finish
        self._on_detach = on_detach
        self._blocks = blocks
        self._prepare = prepare  # an awaitable of the blocks (an async `resize_image`), or None
        self._refused: FxError | None = None
        self._phase = Phase.STARTING
        self._halt: Halt | None = None
        self._failure: BaseException | None = None  # the append that failed (Halt.JOURNAL_FAILED)
        self._yield_at = yield_at
        self._resume = resume
        self._on_ambiguous = on_ambiguous
        self._no_rerun = no_rerun
        self._next_step = next_step
        self._steers: deque[tuple[str, str]] = deque()
        self._steer_bytes = 0
        # Asked for at the next safe point (before a model request): a yield (the owner's
        # deadline) and an end (a steer with images runs as the next turn).
        self._yield_requested = False
        self._end_requested = False
        self._task: asyncio.Task[None] | None = None
        self._stream_task: asyncio.Task[StepOutput] | None = None
        self._out: StepOutput | None = None
        self._out_step = 0
        self._in_flight: dict[str, Any] | None = None
        self._running_calls: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        halt = f" halt={self._halt.name}" if self._halt is not None else ""
        return f"<TurnRunner turn={self.turn_id} phase={self._phase.value}{halt}>"

    def _halt_with(self, halt: Halt) -> None:
        if self._halt is None or halt > self._halt:
            self._halt = halt

    @property
    def accepting(self) -> bool:
        """Whether a steer can still join this turn."""
        return self._phase in (Phase.STARTING, Phase.RUNNING) and self._halt is None and not self._end_requested

    def describe(self) -> str:
        if self.result_future.done():
            return f"ended={self.result_future.result().stop_reason}"
        flight = self._in_flight or {}
        return f"running kind={flight.get('kind')} step={flight.get('step')} steers={len(self._steers)}"

    # lifecycle

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._main(), name=f"fx-turn-{self.turn_id}")
        self._task.add_done_callback(self._never_ran)

    def _never_ran(self, task: asyncio.Task[None]) -> None:
        """Settles a turn whose task was cancelled before its first step (a loop that
        closes cancels every task): `_main` never ran, nothing was journaled, and whoever
        awaits the result (the engine's close) must not wait for ever."""
        if self.result_future.done():
            return
        self._halt_with(Halt.DETACHED)
        self._phase = Phase.ENDED
        self._on_finish(self)
        self.events.close()
        self.result_future.set_result(TurnResult("unknown", {}, detached=True))

    def finish_now(self, result: TurnResult) -> None:
        """Ends a turn that runs nothing (a repeated turn id)."""
        self._phase = Phase.ENDED
        self.events.close()
        self.result_future.set_result(result)

    @property
    def in_flight(self) -> dict[str, Any] | None:
        flight = self._in_flight
        if flight is None:
            return None
        if flight["kind"] == "tool":
            return {**flight, "calls": list(self._running_calls.values())}
        return dict(flight)

    # control from the caller

    def steer(self, input: str | list[Any], steer_id: str | None) -> None:
        if not self.accepting:
            raise FxInputError("no prompt is running", code=Code.TURN_ENDED)
        if not isinstance(input, str):
            blocks = check_prompt_input(input)
            if has_images(blocks):
                self._end_for_images(blocks, steer_id)
            input = prompt_text(blocks)
        check_steer_text(input, queued=len(self._steers), queued_bytes=self._steer_bytes)
        if steer_id is not None:
            check_message_id(steer_id)
        self._steers.append((steer_id or new_steer_id(), input))
        self._steer_bytes += len(input.encode("utf-8", "surrogatepass"))
        self._cut_stream()

    def _end_for_images(self, blocks: list[dict[str, Any]], steer_id: str | None) -> None:
        """A steer with images cannot join a turn (a Chat Completions history takes images
        only in a user message of their own): the turn ends at its next safe point, and
        the steer goes back to the caller to run as the next prompt (docs/design.md §6)."""
        if steer_id is not None:
            check_message_id(steer_id)
        self.core.check_images(blocks)
        text = prompt_text(blocks)
        if text.strip():
            check_steer_text(text)
        self._end_requested = True
        self._cut_stream()
        raise FxSteerDeferredError("a steer with images runs as the next turn: this turn ends at its next safe point")

    def _cut_stream(self) -> None:
        stream = self._stream_task
        if stream is not None and not stream.done():
            stream.cancel()

    def cancel(self) -> None:
        if self._phase in (Phase.FINISHING, Phase.ENDED) or self._halt is not None:
            return
        self._halt = Halt.CANCELLED
        self.signal.abort("cancelled")
        self._stop_task()

    def yield_now(self) -> None:
        self._yield_requested = True

    def detach(self) -> None:
        if self._phase is Phase.ENDED or self._halt is Halt.DETACHED:
            return
        self._halt_with(Halt.DETACHED)  # after a failed append the failure stays the turn's end
        self._on_detach()
        self.signal.abort("detached")
        self._stop_task()

    def on_journal_failure(self, exc: BaseException) -> None:
        if self._phase is Phase.ENDED:
            return
        self._failure = exc
        self._halt_with(Halt.JOURNAL_FAILED)
        self.signal.abort("journal")
        self._stop_task()

    def _raise_if_halted(self) -> None:
        """Stops the task of a halted turn whose `Task.cancel()` was swallowed by what it
        awaited (see the module docstring): nothing more starts after a halt."""
        if self._halt is not None:
            raise asyncio.CancelledError(f"halted: {self._halt.name}")

    def _stop_task(self) -> None:
        task = self._task
        if self._phase is Phase.STARTING:
            return  # a task cancelled before its first step would never run `_main`; it reads the halt
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()

    # the task

    async def _main(self) -> None:
        outcome: Stop | None = None
        self._phase = Phase.RUNNING
        try:
            if self._halt is None:
                outcome = await self._run()
            elif self._halt is Halt.CANCELLED and not self._resume:
                outcome = await self._open_cancelled()
        except (asyncio.CancelledError, JournalStopped, FxJournalAppendError):
            task = asyncio.current_task()
            if task is not None:
                while task.uncancel():
                    pass
            self._halt_with(Halt.CANCELLED)
        except FxError as exc:
            outcome = ("error", exc.to_dict())
        except Exception as exc:  # a bug must end the turn visibly, not hang it
            outcome = ("error", {"code": Code.ERROR, "message": f"internal error: {type(exc).__name__}: {exc}"})
        self._phase = Phase.FINISHING
        finisher = asyncio.get_running_loop().create_task(self._finish(outcome))
        while not finisher.done():
            try:
                await asyncio.shield(finisher)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()

    def _halted_result(self, usage: dict[str, int]) -> TurnResult | None:
        """The result of a turn a failed append or a detach stopped (None for any other):
        nothing more is recorded for it."""
        if self._halt is Halt.DETACHED:
            return TurnResult("unknown", usage, detached=True)
        if self._halt is not Halt.JOURNAL_FAILED:
            return None
        exc = self._failure
        cause = exc.to_dict() if isinstance(exc, FxError) else {"code": Code.ERROR, "message": str(exc)}
        error = {"code": Code.JOURNAL_APPEND_FAILED, "message": f"the journal append failed: {exc}", "cause": cause}
        return TurnResult("error", usage, error)

    async def _finish(self, outcome: Stop | None) -> None:
        core = self.core
        if inspect.iscoroutine(self._prepare):
            self._prepare.close()  # the turn stopped before its prompt's images were resized
        usage = dict(core.conversation.open.usage) if core.conversation.open is not None else {}
        result: TurnResult | None
        try:
            if self._refused is not None:
                result = TurnResult("error", {}, self._refused.to_dict())  # nothing was journaled
            elif (result := self._halted_result(usage)) is None:
                stop, error = outcome if outcome is not None else ("cancelled", None)
                self._record_partial()
                core.end_turn(self.turn_id, None if stop == "yielded" else ev.end_body(stop, usage, error))
                await core.journal.flush()
                result = self._halted_result(usage)  # a failure or detach during the flush
                if result is None:
                    result = TurnResult(stop, usage, error)
                    await core.save_checkpoint()
        except Exception as exc:  # never leave a caller waiting on result()
            result = TurnResult("error", usage, {"code": Code.ERROR, "message": f"internal error: {exc!r}"})
        self._phase = Phase.ENDED
        self._on_finish(self)
        self.events.close()
        self.result_future.set_result(result)

    def _record_partial(self) -> None:
        """Records what a step had streamed when the turn stopped inside it."""
        out = self._out
        if out is None or self.core.conversation.open is None:
            return
        self._out = None
        self.core.commit("model_response", {"step": self._out_step, "content": out.content, "toolCalls": [],
                                             "finishReason": None, "usage": out.usage, "cut": True},
                         marks=[DONE])

    async def _run(self) -> Stop:
        """The turn: opened (or resumed), then model steps and their tools until it stops."""
        if self._resume:
            await self._reopen()
            first_barrier, requested = None, None
        else:
            if self._prepare is not None and not await self._prepared():
                assert self._refused is not None
                return ("error", self._refused.to_dict())
            first_barrier, requested = self._open()
        first = True
        while True:
            if first_barrier is not None:
                await self.core.journal.wait(first_barrier)
                first_barrier = None
            self._raise_if_halted()  # a halted turn places no steer and makes no request
            await self._place_steers()
            stop = self._stop_before_request(first)
            if stop is not None:
                return stop
            first = False
            if requested is not None:
                step, requested = requested, None  # its model_request is in the start's append
            else:
                turn = self.core.conversation.open
                assert turn is not None
                step = max(turn.step + 1, self._next_step or 0)
                self._next_step = None
                self.core.commit("model_request", {"step": step})
            stop = await self._step(step)
            if stop is not None:
                return stop

    async def _open_cancelled(self) -> Stop:
        """A new turn cancelled before its first step still opens in the journal and ends
        there `cancelled`: its prompt is recorded and no model request is made. Without the
        start, the end record would close no turn, and a store would keep the prompt waiting
        (and run it again: docs/design.md §6, a cancel before any worker claimed it)."""
        if self._prepare is not None and not await self._prepared():
            assert self._refused is not None
            return ("error", self._refused.to_dict())
        barrier, _ = self._open(request=False)
        if barrier is not None:
            await self.core.journal.wait(barrier)
        return ("cancelled", None)

    def _open(self, *, request: bool = True) -> tuple[asyncio.Future[str | None] | None, int | None]:
        """Journals the turn's start (ending a turn an earlier engine left open first);
        (the start's barrier, the step whose model_request rides with it, if any: none
        unless `request`)."""
        core = self.core
        conv = core.conversation
        if conv.open is not None:
            core.end_turn(conv.open.id, ev.end_body("cancelled", conv.open.usage, {
                "code": Code.TURN_INTERRUPTED, "message": "a new prompt ended this turn, which an earlier engine left open"}))
        assert self._blocks is not None
        first_barrier = core.commit("turn_start", {"turn": self.turn_id, "input": self._blocks, "atMs": now_ms()},
                                    marks=[{"start": self.turn_id}], barrier=True)
        requested = None
        if request and not self._steers and not self._yield_requested and self._next_step is None:
            # The first request goes in the start's append (one store call fewer): a steer
            # placed after it still reaches that request, as its messages are built later.
            requested = conv.open.step + 1 if conv.open is not None else None
            if requested is not None:
                core.commit("model_request", {"step": requested})
        return first_barrier, requested

    async def _reopen(self) -> None:
        """Journals the resume and settles the tool calls the crashed turn left running."""
        turn = self.core.conversation.open
        assert turn is not None
        unanswered = turn.unanswered
        pending_step = int(turn.pending["step"]) if turn.pending else 0
        self.core.commit("resumed", {"interrupted": not turn.yielded, "retract": self.retract_candidates})
        if unanswered:
            await self._resume_calls(pending_step, unanswered)

    def _stop_before_request(self, first: bool) -> Stop | None:
        """Why the turn stops before its next model request, if it does."""
        turn = self.core.conversation.open
        assert turn is not None
        if self._end_requested and not first:
            return ("end_turn", None)  # a steer with images runs as the next turn
        if self._yield_requested or (not first and self._yield_at is not None and now_ms() >= self._yield_at):
            return ("yielded", None)
        if turn.responses >= self.core.max_model_turns:
            return ("max_model_turns", None)
        return None

    async def _step(self, step: int) -> Stop | None:
        """One model request and the tools it calls; how the turn stops, or None to go on."""
        core = self.core
        out, cut = await self._model_step(step)
        self._raise_if_halted()  # a reply that ended as the turn was cancelled: kept as cut
        finish = out.finish_reason
        calls = out.tool_calls if not cut and finish not in ("length", "content_filter") else []
        response: dict[str, Any] = {"step": step, "content": out.content, "toolCalls": calls,
                                    "finishReason": finish, "usage": out.usage, "cut": cut}
        if out.reasoning:
            response["reasoning"] = "".join(out.reasoning)
        barrier = any(self._needs_barrier(c["name"]) for c in calls)
        self._out = None
        response_future = core.commit("model_response", response, marks=[DONE], barrier=barrier,
                                      want_ack=bool(calls))
        if cut:
            return None
        if finish == "length":
            return ("max_output_tokens", None)
        if finish == "content_filter":
            return ("refused", None)
        if not calls:
            if self._steers:
                return None
            self._phase = Phase.ENDING
            return ("end_turn", None)
        await self._run_tools(step, calls, response_future)
        return None

    async def _prepared(self) -> bool:
        """Awaits the prompt's blocks from an async `resize_image` and checks them; False
        (with `_refused` set) when they are refused: the turn then journals nothing."""
        prepare, self._prepare = self._prepare, None
        try:
            blocks = check_prompt_input(await prepare)
            self.core.check_images(blocks)
        except FxInputError as exc:
            self._refused = exc
            return False
        self._blocks = blocks
        return True

    def _needs_barrier(self, name: str) -> bool:
        tool = self.core.tools.get(name)
        return tool is not None and tool.needs_barrier

    async def _place_steers(self) -> None:
        while self._steers:
            steer_id, text = self._steers.popleft()
            self._steer_bytes -= len(text.encode("utf-8", "surrogatepass"))
            self.core.commit("accepted", {"id": steer_id, "text": text}, marks=[{"accepted": steer_id}])
            await self.events.put(ev.user_message(text, steer_id))

    async def _model_step(self, step: int) -> tuple[StepOutput, bool]:
        core = self.core
        out = StepOutput()
        self._out = out
        self._out_step = step
        self._in_flight = {"kind": "model", "step": step, "calls": []}
        body = build_request(core.spec, core.conversation.messages, tools=core.tool_list, instructions=core.instructions)
        put = self.events.put

        async def on_delta(kind: str, delta: str) -> None:
            if kind == "text_delta":
                await put(ev.text_delta(delta, step))
            else:
                await put(ev.reasoning_delta(delta, step))

        stream = asyncio.get_running_loop().create_task(
            model_step(core.client, core.provider, body, on_delta=on_delta, diag=core.diag, step=step, out=out)
        )
        self._stream_task = stream
        span = tracing.start_model_span(core.provider.name, core.spec.id, step)
        cut, failure = False, None
        try:
            await stream
            return out, False
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._halt is not None or (task is not None and task.cancelling()):
                raise
            cut = True
            return out, True  # a steer cut the reply short
        except Exception as exc:
            failure = exc
            raise
        finally:
            self._stream_task = None
            self._in_flight = None
            tracing.end_model_span(span, model=out.model, finish_reason=out.finish_reason, usage=out.usage, cut=cut,
                                   error=failure)

    def _ctx(self, call: PlannedCall) -> ToolContext:
        core = self.core
        return ToolContext(self.signal, call.execution_id, core.session_id, core.context, core.epoch)

    def _execution_id(self, step: int, call_id: str) -> str:
        return execution_id(self.core.session_id, self.turn_id, step, call_id)

    async def _run_tools(self, step: int, calls: list[dict[str, Any]],
                         response_future: asyncio.Future[str | None] | None, *, rerun: bool = False) -> None:
        core = self.core
        planned: list[PlannedCall] = []
        for call in calls:
            value, error = parse_arguments(call["arguments"])
            planned.append(PlannedCall(call["id"], call["name"], value if error is None else call["arguments"],
                                       self._execution_id(step, call["id"]), error))
        self._in_flight = {"kind": "tool", "step": step, "calls": []}

        spans: dict[str, Any] = {}

        async def on_start(call: PlannedCall) -> None:
            self._raise_if_halted()  # no call starts after a cancel, even one the tools swallowed
            self._running_calls[call.id] = {"id": call.id, "name": call.name, "executionId": call.execution_id}
            tool = core.tools.get(call.name)
            spans[call.id] = tracing.start_tool_span(call.name, call.id, call.execution_id, rerun=rerun,
                                                     idempotent=tool.idempotent if tool is not None else None)
            await self.events.put(ev.tool_start(call.id, call.name, call.input, step))

        async def on_end(call: PlannedCall, outcome: ToolOutcome) -> None:
            self._running_calls.pop(call.id, None)
            tracing.end_tool_span(spans.pop(call.id, None), is_error=outcome.is_error)
            if self.signal.aborted:
                return  # a late result after a cancel is dropped (the turn end answers the call)
            content, images = outcome.content, outcome.images
            if images and not core.takes_images:
                content += (f"\n[FX_MODEL_NO_IMAGES: the tool returned {len(images)} image(s); model "
                            f"{core.spec.id} does not take images, so they were not sent]")
                images = []
            body: dict[str, Any] = {"step": step, "id": call.id, "name": call.name, "content": content,
                                    "isError": outcome.is_error}
            if images:
                body["images"] = images
            core.commit("tool_result", body, marks=[DONE])
            await self.events.put(ev.tool_end(call.id, call.name, is_error=outcome.is_error, content=content,
                                              step=step))

        async def wait_barrier() -> None:
            await core.journal.wait(response_future)

        try:
            await run_calls(planned, tools=core.tools, make_ctx=self._ctx, on_start=on_start, on_end=on_end,
                            wait_barrier=wait_barrier)
        finally:
            self._in_flight = None
            self._running_calls.clear()
        self._raise_if_halted()

    async def _resume_calls(self, step: int, unanswered: list[dict[str, Any]]) -> None:
        """Decides each call the crashed turn left running: rerun it or answer it as ambiguous."""
        core = self.core
        rerun: list[dict[str, Any]] = []
        for call in unanswered:
            tool = core.tools.get(call["name"])
            value, error = parse_arguments(call["arguments"])
            execution_id = self._execution_id(step, call["id"])
            again = False
            if tool is not None and error is None and not self._no_rerun:
                if tool.idempotent:
                    again = True
                elif self._on_ambiguous is not None:
                    answer = self._on_ambiguous({"executionId": execution_id, "name": call["name"], "input": value})
                    if inspect.isawaitable(answer):
                        answer = await answer
                    again = answer == "rerun"
            if again:
                core.diag({"type": "tool.rerun", "sessionId": core.session_id, "executionId": execution_id,
                              "id": call["id"], "name": call["name"], "step": step})
                rerun.append(call)
                continue
            tracing.add_event("tool.ambiguous", {"gen_ai.tool.name": call["name"], "gen_ai.tool.call.id": call["id"],
                                                 "fx.tool.execution_id": execution_id})
            core.commit("tool_result", {"step": step, "id": call["id"], "name": call["name"],
                                       "content": AMBIGUOUS_RESULT, "isError": True}, marks=[DONE])
            await self.events.put(ev.tool_end(call["id"], call["name"], is_error=True, content=AMBIGUOUS_RESULT,
                                              step=step))
        if rerun:
            await self._run_tools(step, rerun, None, rerun=True)
