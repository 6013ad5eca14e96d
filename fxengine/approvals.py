"""Turns that wait for a person or a client: tool approvals and external tools (docs/design.md §6).

A call of a tool with `approval` (True, or `approval(input, ctx)` answering True) or of an
`external` tool does not run when the model makes it. `Approvals.hold` records the calls
of a response that wait (`tool_wait`, in the response's own append, before any other call
of it runs) and emits an `approval_request` for each; the turn runs the other calls and then
parks `paused` (`turn_pause`). `engine.resume(decisions={call id: decision})` records
every decision before anything runs (`tool_approved`, or a `tool_result` for a denial or
a submitted result), then runs the approved calls under the usual rules: a barrier
before a call that is not idempotent, and after a crash "may have partly run".

A decision is JSON, as a client sends it:

    {"type": "approve"}
    {"type": "deny", "reason"?: str}
    {"type": "result", "result": <the tool's return value>, "isError"?: bool}

A result is read as a tool's return value is (`tools.runner.format_result`: text, JSON,
or an `fx.tool-result` with images). A call not decided keeps waiting.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict

from . import events as ev
from .codes import Code
from .conversation import AwaitingCall, OpenTurn, denied
from .errors import FxInputError
from .lines import PendingCall, input_preview
from .persistence import Mark
from .tools.definition import Signal, ToolContext
from .tools.runner import TOOL_RESULT_MAX_BYTES, ToolCall, ToolOutcome, execution_id, format_result, parse_arguments
from .turn import EventBuffer

if TYPE_CHECKING:
    from .core import EngineCore
    from .tool_calls import ToolCalls

__all__ = ["Approvals", "Decided", "Decision", "approve", "check_decisions", "deny", "pending_calls", "submit_result"]


class ApproveDecision(TypedDict):
    type: Literal["approve"]


class DenyDecision(TypedDict):
    type: Literal["deny"]
    reason: NotRequired[str]


class ResultDecision(TypedDict):
    type: Literal["result"]
    result: object
    isError: NotRequired[bool]


Decision = ApproveDecision | DenyDecision | ResultDecision


def approve() -> ApproveDecision:
    """The decision that lets a call waiting for approval run."""
    return {"type": "approve"}


def deny(reason: str = "") -> DenyDecision:
    """The decision that answers a call without running it; the model reads `reason`."""
    decision: DenyDecision = {"type": "deny"}
    if reason:
        decision["reason"] = reason
    return decision


def submit_result(result: object, *, is_error: bool = False) -> ResultDecision:
    """An external tool's result, as its client ran it."""
    decision: ResultDecision = {"type": "result", "result": result}
    if is_error:
        decision["isError"] = True
    return decision


@dataclass(frozen=True, slots=True)
class Decided:
    """One checked decision: `outcome` is the call's answer (a denial, a submitted
    result), None for an approval (the call runs)."""

    call: ToolCall
    outcome: ToolOutcome | None
    kind: Literal["approve", "deny", "result"]
    by: str | None = None  # who decided, when the decision names them
    reason: str | None = None  # a denial's
    at_ms: int | None = None  # when it was made (`at`, ms since the epoch), when the decision says
    input_id: str | None = None  # the store's input that carried it (marked taken with it)

    @property
    def marks(self) -> list[Mark]:
        """The store marks of the record that takes this decision."""
        marks: list[Mark] = [{"decided": self.call["id"]}]
        if self.input_id is not None:
            marks.append({"accepted": self.input_id})
        return marks


def _invalid(message: str) -> FxInputError:
    return FxInputError(message, code=Code.DECISION_INVALID)


def _outcome(call: ToolCall, kind: str, raw: Mapping[str, object]) -> ToolOutcome | None:
    """The answer a decision gives `call` (None: approved), or `FX_DECISION_INVALID`."""
    decision = raw.get("type", "result" if "result" in raw else None)
    if decision == "approve":
        if kind != "approval":
            raise _invalid(f"call {call['id']} runs at the client: it is answered by a result, not approved")
        return None
    if decision == "deny":
        reason = raw.get("reason", "")
        if not isinstance(reason, str):
            raise _invalid(f"the denial of call {call['id']}: reason must be a string")
        return ToolOutcome(call["id"], call["name"], denied(reason or "no reason given"), True)
    if decision != "result" or "result" not in raw:
        raise _invalid(f"the decision for call {call['id']} is not approve, deny or result")
    if kind != "external":
        raise _invalid(f"call {call['id']} waits for approval: it is approved or denied, not given a result")
    is_error = raw.get("isError", False)
    if not isinstance(is_error, bool):
        raise _invalid(f"the result of call {call['id']}: isError must be a bool")
    try:
        content, images, flagged = format_result(raw["result"])
    except (TypeError, ValueError) as exc:
        raise _invalid(f"the result of call {call['id']}: {exc}") from None
    if len(content.encode("utf-8", "surrogatepass")) + sum(len(i["data"]) for i in images) > TOOL_RESULT_MAX_BYTES:
        raise _invalid(f"the result of call {call['id']} is over the 8 MiB limit")
    return ToolOutcome(call["id"], call["name"], content, is_error or flagged, images)


def check_decisions(turn: OpenTurn | None, decisions: object) -> list[Decided]:
    """Checks `{call id: decision}` against the calls `turn` waits on; the decisions in
    call order.

    Raises:
        FxInputError: `FX_DECISION_INVALID` (not a map of decisions, a decision of the
            wrong shape or for the wrong kind of call), `FX_DECISION_UNKNOWN_CALL` (no
            call of the open turn waits on that id), `FX_DECISION_REPEATED` (the call
            was already decided).
    """
    if not isinstance(decisions, Mapping) or not all(
            isinstance(key, str) and isinstance(value, Mapping) for key, value in decisions.items()):
        raise _invalid("decisions must map call ids to decisions ({'type': 'approve' | 'deny' | 'result', ...})")
    awaiting = {call["id"]: call["kind"] for call in turn.awaiting} if turn is not None else {}
    for call_id in decisions:
        if call_id not in awaiting:
            if turn is not None and call_id in turn.decided:
                raise FxInputError(f"call {call_id} was already decided", code=Code.DECISION_REPEATED)
            raise FxInputError(f"no call {call_id} waits for a decision", code=Code.DECISION_UNKNOWN_CALL)
    if turn is None or turn.pending is None:
        return []
    return [_decided(call, awaiting[call["id"]], decisions[call["id"]])
            for call in turn.pending["calls"] if call["id"] in decisions]


def _decided(call: ToolCall, kind: str, raw: Mapping[str, object]) -> Decided:
    outcome = _outcome(call, kind, raw)
    decision: Literal["approve", "deny", "result"] = (
        "approve" if outcome is None else "deny" if raw.get("type") == "deny" else "result")
    by, reason, at = raw.get("by"), raw.get("reason"), raw.get("at")
    return Decided(call, outcome, decision, by if isinstance(by, str) and by else None,
                   reason if isinstance(reason, str) and reason else None,
                   at if isinstance(at, int) and not isinstance(at, bool) else None)


def pending_calls(core: EngineCore) -> list[PendingCall]:
    """The calls the open turn waits on, in call order (empty when none waits)."""
    turn = core.conversation.open
    if turn is None or turn.pending is None or not turn.awaiting:
        return []
    kinds = {call["id"]: call["kind"] for call in turn.awaiting}
    step = int(turn.pending["step"])
    out: list[PendingCall] = []
    for call in turn.pending["calls"]:
        if call["id"] not in kinds:
            continue
        value, error = parse_arguments(call["arguments"])
        input: object = value if error is None else call["arguments"]
        pending: PendingCall = {"id": call["id"], "name": call["name"], "kind": kinds[call["id"]], "step": step,
                                "executionId": execution_id(core.session_id, turn.id, step, call["id"])}
        preview = input_preview(input)
        if preview is None:
            pending["input"] = input
        else:
            pending["inputPreview"], pending["inputTruncated"] = preview, True
        out.append(pending)
    return out


class Approvals:
    """The calls of one turn that wait for a decision: held when the model makes them,
    decided on resume."""

    def __init__(self, core: EngineCore, turn_id: str, *, signal: Signal, events: EventBuffer,
                 decisions: list[Decided] | None = None) -> None:
        self._core = core
        self._turn_id = turn_id
        self._signal = signal
        self._events = events
        self.decisions = decisions or []  # checked by `check_decisions` before the turn started

    def __repr__(self) -> str:
        return f"<Approvals turn={self._turn_id} decisions={len(self.decisions)} waiting={self.waiting}>"

    @property
    def waiting(self) -> bool:
        """Whether a call of the open turn still waits for a decision."""
        turn = self._core.conversation.open
        return turn is not None and bool(turn.awaiting)

    async def classify(self, step: int, calls: list[ToolCall]) -> list[AwaitingCall]:
        """The calls of `step` that wait for a decision (asking each `approval` function).

        Asked before the response is recorded, so `hold` records them in the response's
        own append: a crash can never leave a waiting call that looks like one left running
        (which a resume would run without asking)."""
        held: list[AwaitingCall] = []
        for call in calls:
            kind = await self._kind(step, call)
            if kind is not None:
                held.append({"id": call["id"], "name": call["name"], "kind": kind})
        return held

    async def hold(self, step: int, calls: list[ToolCall], held: list[AwaitingCall]) -> list[ToolCall]:
        """Records `held` (`tool_wait`, right after the response) and emits an
        `approval_request` for each; the calls that run now.

        The hold is durable before the turn goes on: whatever the store does before the
        record that parks the turn (a delegated call prompts its child session then) finds
        the calls stored, so a crash before the pause resumes the same calls, never a new
        response whose calls would start other children."""
        if not held:
            return calls
        stored = self._core.commit("tool_wait", {"step": step, "calls": held}, barrier=True)
        for pending in pending_calls(self._core):
            await self._events.put(ev.approval_request(pending))
        await self._core.journal.wait(stored)
        waiting = {call["id"] for call in held}
        return [call for call in calls if call["id"] not in waiting]

    async def _kind(self, step: int, call: ToolCall) -> Literal["approval", "external"] | None:
        """Whether `call` waits, and for what (None: it runs now)."""
        tool = self._core.tools.get(call["name"])
        value, error = parse_arguments(call["arguments"])
        if tool is None or value is None or error is not None:
            return None  # answered as an error without running
        if tool.external:
            return "external"
        if isinstance(tool.approval, bool):
            return "approval" if tool.approval else None
        core = self._core
        ctx = ToolContext(self._signal, execution_id(core.session_id, self._turn_id, step, call["id"]),
                          core.session_id, core.context, core.epoch)
        try:
            answer = tool.approval(value, ctx)
            if inspect.isawaitable(answer):
                answer = await answer
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a check that fails asks: running unasked is the one unsafe answer
            core.diag({"type": "tool.approval_error", "name": call["name"], "id": call["id"],
                       "error": type(exc).__name__})
            return "approval"
        return "approval" if answer else None

    async def decide(self, step: int, calls: ToolCalls) -> tuple[list[ToolCall], asyncio.Future[str | None] | None]:
        """Records every decision before anything runs (a `tool_approved`, or the
        `tool_result` of a denied or submitted call), then emits a `tool_end` for each
        answered call; (the approved calls, the barrier their runs wait for)."""
        core = self._core
        decisions, self.decisions = self.decisions, []
        approved = [decided.call for decided in decisions if decided.outcome is None]
        tools = core.tools
        needs_barrier = any((tool := tools.get(call["name"])) is not None and tool.needs_barrier for call in approved)
        barrier: asyncio.Future[str | None] | None = None
        answered: list[tuple[ToolOutcome, str]] = []
        for decided in decisions:
            await self._events.put(ev.approval_decision(decided.call["id"], decided.call["name"], decided.kind,
                                                        step=step, by=decided.by, reason=decided.reason,
                                                        decided_at_ms=decided.at_ms))
            if decided.outcome is None:
                last = decided.call is approved[-1]
                future = core.commit("tool_approved", {"step": step, "id": decided.call["id"]},
                                     marks=decided.marks, barrier=needs_barrier and last)
                barrier = future if last else barrier
            else:
                answered.append((decided.outcome, calls.record(step, decided.outcome, marks=decided.marks)))
        for outcome, content in answered:
            await self._events.put(ev.tool_end(outcome.id, outcome.name, is_error=outcome.is_error, content=content,
                                               step=step))
        return approved, barrier
