"""The turn loop: model step -> tool calls -> model step ... until the model ends (docs/design.md §4, §6).

Every change goes through `EngineCore.commit` (applied to the conversation, then
journaled), so a replay rebuilds the same state. The runner is one asyncio task in a
`Phase`; `cancel()`, `detach()` and a failed journal append stop it through
`Task.cancel()`, and the `Halt` set beforehand says which of them it was. The halt, not the
`CancelledError`, is what stops the turn: code the task awaits can swallow the error (a tool
that catches it; `asyncio.wait_for` on Python 3.11 when what it waits for, such as the
aborted signal, finishes in the same loop iteration), so the loop checks the halt before
each model request and each tool call (`_raise_if_halted`). Steering cancels only the
streaming sub-task. The runner's owner hears of the turn's end and of a detach through
callbacks (`on_finish`, `on_detach`); the runner never touches its owner's state.

The runner keeps the phase, the halt and the order of steps; the work of each part is a
collaborator's: the start of a new turn (`opening.TurnOpening`), the steers waiting for
the next safe point (`steering.SteerQueue`), one model step (`streaming.ModelStream`), a
step's tool calls, or those a crashed turn left running (`tool_calls.ToolCalls`), and the
calls that wait for a person's or a client's decision (`approvals.Approvals`): a turn with
such calls undecided stops `paused` and stays open. A typed turn (`fxengine.output`) has
each answer judged as its response is recorded (`_judge`, `_record_verdict`); the verdicts
in the journal say whether it ends (`_stop_before_request`).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from . import events as ev
from .approvals import Approvals, Decided, pending_calls
from .codes import Code
from .errors import FxError, FxInputError, FxJournalAppendError, FxSteerDeferredError
from .ids import now_ms
from .journal.journal import JournalStopped
from .limits import Block
from .opening import TurnOpening
from .output import FINAL_RESULT_TOOL, Output, Verdict, error_body
from .steering import SteerQueue, steer_text
from .streaming import ModelStream
from .tool_calls import AMBIGUOUS_RESULT, DONE, InFlight, OnAmbiguous, ToolCalls
from .tools.definition import Signal
from .tools.runner import ToolCall, parse_arguments
from .turn import EventBuffer, TurnResult

if TYPE_CHECKING:
    from .core import EngineCore

__all__ = ["AMBIGUOUS_RESULT", "DONE", "Halt", "OnAmbiguous", "Phase", "TurnOptions", "TurnRunner"]

# How a turn stops: its stop reason and error (None when there is none).
Stop = tuple[str, dict[str, object] | None]
OnFinish = Callable[["TurnRunner"], None]
OnDetach = Callable[[], None]


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


# What the model reads for a final-result call answered, and for calls of the response
# that gave the answer (not run: the answer ends the turn).
FINAL_RESULT_TAKEN = "Final result taken."
NOT_RUN_AFTER_ANSWER = "Not run: the final result was given in the same response."
ONE_FINAL_RESULT = "Not taken: give the final result in one call."


@dataclass
class Judged:
    """A typed answer's verdict on one response: `final` is the final-result call judged
    (tool mode), `rest` the calls that still run, `answered` those answered without running."""

    verdict: Verdict
    final: ToolCall | None = None
    rest: list[ToolCall] = field(default_factory=list)
    answered: list[tuple[ToolCall, str, bool]] = field(default_factory=list)  # (call, content, is_error)


class TurnOptions(TypedDict, total=False):
    """What a turn runs with besides its core and id (`TurnRunner`'s keyword arguments)."""

    blocks: list[Block] | None
    prepare: Awaitable[list[object]] | None
    yield_at: float | None
    resume: bool
    on_ambiguous: OnAmbiguous | None
    no_rerun: bool
    next_step: int | None
    decisions: list[Decided] | None
    output: Output[Any] | None


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
        blocks: list[Block] | None = None,
        prepare: Awaitable[list[object]] | None = None,
        yield_at: float | None = None,
        resume: bool = False,
        on_ambiguous: OnAmbiguous | None = None,
        no_rerun: bool = False,
        next_step: int | None = None,
        decisions: list[Decided] | None = None,
        output: Output[Any] | None = None,
    ) -> None:
        self.core = core
        self.turn_id = turn_id
        self.events = EventBuffer(sink=core.event_sink, diag=core.diag)
        self.result_future: asyncio.Future[TurnResult[Any]] = asyncio.get_running_loop().create_future()
        open_turn = core.conversation.open
        self.retract_candidates: list[int] = open_turn.retract if resume and open_turn is not None else []
        self.signal = Signal()
        self._on_finish = on_finish
        self._on_detach = on_detach
        self._opening = TurnOpening(core, turn_id, blocks=blocks, prepare=prepare)
        self._phase = Phase.STARTING
        self._halt: Halt | None = None
        self._failure: BaseException | None = None  # the append that failed (Halt.JOURNAL_FAILED)
        self._yield_at = yield_at
        self._resume = resume
        self._next_step = next_step
        self._steers = SteerQueue()
        # Asked for at the next safe point (before a model request): a yield (the owner's
        # deadline) and an end (a steer with images runs as the next turn).
        self._yield_requested = False
        self._end_requested = False
        self._task: asyncio.Task[None] | None = None
        self._stream = ModelStream(core, events=self.events, halted=lambda: self._halt is not None)
        self._calls = ToolCalls(core, turn_id, signal=self.signal, events=self.events,
                                raise_if_halted=self._raise_if_halted, on_ambiguous=on_ambiguous, no_rerun=no_rerun)
        self._approvals = Approvals(core, turn_id, signal=self.signal, events=self.events, decisions=decisions)
        # A typed turn: how its answer is asked for (the request's part) and judged.
        self._output = output if output is not None and not output.text else None
        self._text_output = output is not None and output.text
        self._by_tool = self._output is not None and self._output.mode_for(core.spec) == "tool"
        self._ask: dict[str, object] | None = None
        if self._output is not None:
            self._ask = ({"tool": self._output.tool()} if self._by_tool
                         else {"response_format": self._output.response_format()})
        self._stream.ask = self._ask

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
        flight = self.in_flight
        kind, step = (flight["kind"], flight["step"]) if flight is not None else (None, None)
        return f"running kind={kind} step={step} steers={len(self._steers)}"

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
    def in_flight(self) -> InFlight | None:
        """The model request streaming, or the tool calls running (None between them)."""
        step = self._stream.step
        if step is not None:
            return {"kind": "model", "step": step, "calls": []}
        return self._calls.in_flight()

    # control from the caller

    def steer(self, input: str | list[object], steer_id: str | None) -> None:
        if not self.accepting:
            raise FxInputError("no prompt is running", code=Code.TURN_ENDED)
        text = steer_text(self.core, input, steer_id)
        if text is None:
            # A steer with images cannot join a turn (a Chat Completions history takes
            # images only in a user message of their own): the turn ends at its next safe
            # point, and the steer goes back to the caller to run as the next prompt
            # (docs/design.md §6).
            self._end_requested = True
            self._stream.cut()
            raise FxSteerDeferredError("a steer with images runs as the next turn: this turn ends at its next safe point")
        self._steers.add(text, steer_id)
        self._stream.cut()

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
        error: dict[str, object] = {"code": Code.JOURNAL_APPEND_FAILED,
                                    "message": f"the journal append failed: {exc}", "cause": cause}
        return TurnResult("error", usage, error)

    async def _finish(self, outcome: Stop | None) -> None:
        core = self.core
        self._opening.drop()
        usage = dict(core.conversation.open.usage) if core.conversation.open is not None else {}
        result: TurnResult | None
        try:
            if (refused := self._opening.refused) is not None:
                result = TurnResult("error", {}, refused.to_dict())  # nothing was journaled
            elif (result := self._halted_result(usage)) is None:
                stop, error = outcome if outcome is not None else ("cancelled", None)
                self._record_partial()
                answer = self._answer() if stop == "end_turn" else None
                if stop == "paused":
                    core.pause_turn()
                elif stop == "yielded":
                    core.end_turn(self.turn_id, None)
                elif answer is not None:
                    core.end_turn(self.turn_id, ev.end_body(stop, usage, error, output=answer[0]))
                else:
                    core.end_turn(self.turn_id, ev.end_body(stop, usage, error))
                await core.journal.flush()
                result = self._halted_result(usage)  # a failure or detach during the flush
                if result is None:
                    result = TurnResult(stop, usage, error, pending_calls=pending_calls(core) if stop == "paused" else [],
                                        output=self.load_output(answer[0]) if answer is not None else None)
                    await core.save_checkpoint()
        except Exception as exc:  # never leave a caller waiting on result()
            result = TurnResult("error", usage, {"code": Code.ERROR, "message": f"internal error: {exc!r}"})
        self._phase = Phase.ENDED
        self._on_finish(self)
        self.events.close()
        self.result_future.set_result(result)

    def _answer(self) -> tuple[object] | None:
        """A typed turn's answer as JSON (in a 1-tuple: it may be null), None for an
        untyped turn; for `str`, the text of its last response."""
        turn = self.core.conversation.open
        if self._output is not None:
            return (turn.answer,) if turn is not None and turn.answered else None
        if self._text_output:
            for message in reversed(self.core.conversation.messages):
                if message["role"] == "assistant":
                    return (message.get("content") or "",)
            return ("",)
        return None

    def load_output(self, value: object) -> object:
        """The answer's JSON as the caller's type (the text of a `str` turn)."""
        if self._output is None:
            return value
        try:
            return self._output.load(value)
        except ValueError:
            return value  # it validated when it was judged; a type that does not round-trip keeps its JSON

    def _record_partial(self) -> None:
        """Records what a step had streamed when the turn stopped inside it."""
        if self.core.conversation.open is None:
            return
        partial = self._stream.take_partial()
        if partial is None:
            return
        step, out = partial
        self.core.commit("model_response", {"step": step, "content": out.content, "toolCalls": [],
                                             "finishReason": None, "usage": out.usage, "cut": True},
                         marks=[DONE])

    async def _run(self) -> Stop:
        """The turn: opened (or resumed), then model steps and their tools until it stops."""
        if self._resume:
            if not await self._reopen():
                return ("paused", None)
            first_barrier, requested = None, None
        else:
            if not await self._opening.prepared():
                return self._refusal()
            first_barrier, requested = self._opening.open(request=self._may_request_with_start())
        first = True
        while True:
            if first_barrier is not None:
                await self.core.journal.wait(first_barrier)
                first_barrier = None
            self._raise_if_halted()  # a halted turn places no steer and makes no request
            await self._steers.place(self.core, self.events)
            stop = self._stop_before_request(first)
            if stop is not None:
                return stop
            first = False
            await self._calls.stored()  # the results the model is about to read, where it matters
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
        if not await self._opening.prepared():
            return self._refusal()
        barrier, _ = self._opening.open(request=False)
        if barrier is not None:
            await self.core.journal.wait(barrier)
        return ("cancelled", None)

    def _refusal(self) -> Stop:
        refused = self._opening.refused
        assert refused is not None
        return ("error", refused.to_dict())

    def _may_request_with_start(self) -> bool:
        """Whether the first model request may ride in the start's append: nothing is
        asked of the turn before that request yet."""
        return not self._steers and not self._yield_requested and self._next_step is None

    async def _reopen(self) -> bool:
        """Journals the resume and its decisions, settles the tool calls the crashed turn
        left running and runs the approved ones; False when calls still wait for a decision.

        A paused turn resumed with no decision records nothing and stays paused. A paused
        turn was not interrupted: the model is not told so."""
        turn = self.core.conversation.open
        assert turn is not None
        if turn.paused and not self._approvals.decisions:
            return False
        left_running = turn.left_running  # before the decisions: an approved call is not one of them
        pending_step = int(turn.pending["step"]) if turn.pending else 0
        interrupted = not turn.yielded and not turn.paused
        self.core.commit("resumed", {"interrupted": interrupted, "retract": self.retract_candidates})
        approved, barrier = await self._approvals.decide(pending_step, self._calls)
        if left_running:
            await self._calls.resume(pending_step, left_running)
        if approved:
            await self._calls.run(pending_step, approved, barrier)
        return not self._approvals.waiting

    def _stop_before_request(self, first: bool) -> Stop | None:
        """Why the turn stops before its next model request, if it does."""
        turn = self.core.conversation.open
        assert turn is not None
        output = self._output
        if output is not None:
            # The verdicts in the journal decide, so a resumed turn stops where its last
            # worker did: a valid answer is not asked for again, nor one past the retries.
            if turn.answered:
                return ("end_turn", None)
            if turn.output_retries > output.retries:
                return ("error", error_body(output, Verdict(errors=turn.output_errors), turn.output_retries))
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
        out, cut = await self._stream.run(step)
        self._raise_if_halted()  # a reply that ended as the turn was cancelled: kept as cut
        finish = out.finish_reason
        calls = out.tool_calls if not cut and finish not in ("length", "content_filter") else []
        response: dict[str, object] = {"step": step, "content": out.content, "toolCalls": calls,
                                       "finishReason": finish, "usage": out.usage, "cut": cut}
        if out.reasoning:
            response["reasoning"] = "".join(out.reasoning)
        judged = self._judge(out.content, calls) if not cut and finish not in ("length", "content_filter") else None
        if judged is not None:
            calls = judged.rest
        held = await self._approvals.classify(step, calls)
        barrier = self._calls.needs_barrier(calls)
        self._stream.forget()
        response_future = core.commit("model_response", response, marks=[DONE], barrier=barrier,
                                      want_ack=bool(calls))
        if judged is not None:
            await self._record_verdict(step, judged)  # in the response's append: a crash resumes from it
        if cut:
            return None
        if finish == "length":
            return ("max_output_tokens", None)
        if finish == "content_filter":
            return ("refused", None)
        if judged is not None and not calls:
            return None  # the verdict decides, before the next request (`_stop_before_request`)
        if not calls:
            if self._steers:
                return None
            self._phase = Phase.ENDING
            return ("end_turn", None)
        runnable = await self._approvals.hold(step, calls, held)
        if runnable:
            await self._calls.run(step, runnable, response_future)
        return ("paused", None) if self._approvals.waiting else None

    # typed answers

    def _judge(self, content: str, calls: list[ToolCall]) -> Judged | None:
        """The verdict on a response of a typed turn (None: nothing to judge, its calls run)."""
        output = self._output
        if output is None:
            return None
        if not self._by_tool:
            return None if calls else Judged(output.judge(content, by_tool=False))
        finals = [call for call in calls if call["name"] == FINAL_RESULT_TOOL]
        if not finals:
            return None if calls else Judged(output.text_answer())
        final, rest = finals[0], [call for call in calls if call["name"] != FINAL_RESULT_TOOL]
        verdict = output.judge(final["arguments"], by_tool=True)
        answered = [(call, ONE_FINAL_RESULT, True) for call in finals[1:]]
        if verdict.ok:
            answered = [(final, FINAL_RESULT_TAKEN, False), *answered,
                        *((call, NOT_RUN_AFTER_ANSWER, False) for call in rest)]
            rest = []
        else:
            answered = [(final, verdict.retry, True), *answered]
        return Judged(verdict, final=final, rest=rest, answered=answered)

    async def _record_verdict(self, step: int, judged: Judged) -> None:
        """Records the verdict (and the calls it answers) right after the response, before
        anything is awaited, so they go in its append; then tells the turn's reader."""
        core = self.core
        for call, content, is_error in judged.answered:
            core.commit("tool_result", {"step": step, "id": call["id"], "name": call["name"], "content": content,
                                        "isError": is_error}, marks=[DONE])
        verdict = judged.verdict
        body: dict[str, object] = {"step": step}
        if verdict.ok:
            body["value"] = verdict.value
        else:
            body["errors"] = verdict.errors
            if judged.final is None:
                body["retry"] = verdict.retry  # the model reads it as a user message
        stored = core.commit("output", body, want_ack=not verdict.ok)
        if not verdict.ok:
            # The retry's request waits for the refused answer's record: once an answer
            # came, a crash never pays for it again.
            await core.journal.wait(stored)
        for call, content, is_error in judged.answered:
            await self.events.put(ev.tool_start(call["id"], call["name"], _arguments(call), step))
            await self.events.put(ev.tool_end(call["id"], call["name"], is_error=is_error, content=content, step=step))


def _arguments(call: ToolCall) -> object:
    """A call's arguments as the `tool_start` line shows them (the text when not JSON)."""
    value, error = parse_arguments(call["arguments"])
    return value if error is None else call["arguments"]
