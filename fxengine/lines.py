"""The protocol, declared once: the lines of a session's UI stream, the model events among
them, and the store marks a journal record (or a call of its own) carries.

Each line is a `TypedDict` whose `type` is a `Literal`, like pydantic-ai's `messages.py`;
`Line` is their union and `LINE_TYPES` the one tuple of every type, `ModelEvent` and
`MODEL_EVENT_TYPES` the same for what a turn's iteration yields (docs/design.md §4,
docs/reference.md "Stream lines"):

    model events   text_delta, reasoning_delta, tool_start, tool_end, user_message,
                   approval_request, approval_decision (built by the functions here, emitted
                   by the engine's turn loop)
    control lines  turn_start, turn_resume, turn_yield, turn_pause, turn_end, session_error,
                   delegate_start, delegate_end (built here, written by the worker around the
                   engine's events)
    store lines    session_waiting (written by claim.lua); idle (an HTTP answer, never stored)

A new line type is declared here (its TypedDict in a union, its type in the matching tuple
and `Literal`, the function that builds it), written by one module, and given its case in
the page's `render` (`fxworker/web/static/app.js`, checked by tests/web/test_line_types.py).

Every stored line also carries `messageId` (the turn's id) and the store stamps `cursor` and
`epoch` into it as it writes it. A reader that holds a line decoded from JSON names its type
with `line_type()`: an unknown type is None, and a comparison with a type that is not
declared here fails the type check (mypy's strict equality).

A mark tells the store what a record does without decoding it (`fxengine.persistence`): the
engine's `start`, `end`, `yield`, `accepted`, `step`, `done` and the worker's `drop`, each a
one-key `TypedDict`; `Mark` is their union and `MARK_NAMES` the one tuple the store checks a
mark's name against (`fxworker/store/_replies.encode_marks`). `CALL_MARK_NAMES` are the marks
the store's `append(release=..., checkpoint=..., pack_after=...)` adds to a call itself.

It imports nothing of the engine but its limits (the tool input preview's size): the
engine, the store and the web read it alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, NotRequired, TypedDict, TypeGuard

from .limits import TOOL_INPUT_PREVIEW_MAX_BYTES

# -- how a turn ended --------------------------------------------------------------------


class ErrorBody(TypedDict):
    """An error as lines and results carry it."""

    code: str
    message: str
    cause: NotRequired[dict[str, object]]


class EndBody(TypedDict):
    """How a turn ended: `{stopReason, usage, error?, output?}`, the body of its `turn_end`
    record, of the event sink's `turn_end` and of a session's `turn_end` line. `output` is a
    typed turn's answer as JSON (`fxengine.output`)."""

    stopReason: str
    usage: dict[str, int]
    error: NotRequired[dict[str, object]]
    output: NotRequired[object]


_NO_OUTPUT: object = object()


def end_body(stop_reason: str, usage: Mapping[str, int] | None, error: Mapping[str, object] | None,
             output: object = _NO_OUTPUT) -> EndBody:
    """`{stopReason, usage, error?, output?}`: `usage` always present, `error` only when
    there is one, `output` only for a typed turn's answer."""
    body: EndBody = {"stopReason": stop_reason, "usage": dict(usage or {})}
    if error:
        body["error"] = dict(error)
    if output is not _NO_OUTPUT:
        body["output"] = output
    return body


# -- lines -------------------------------------------------------------------------------


class _Stored(TypedDict, total=False):
    """What the store stamps into every line it writes."""

    cursor: int
    epoch: int


class TextDelta(_Stored):
    type: Literal["text_delta"]
    delta: str
    step: int
    messageId: NotRequired[str | None]


class ReasoningDelta(_Stored):
    type: Literal["reasoning_delta"]
    delta: str
    step: int
    messageId: NotRequired[str | None]


class ToolStart(_Stored):
    """A tool call starts; an input over 64 KiB of JSON comes as a truncated preview."""

    type: Literal["tool_start"]
    id: str
    name: str
    input: NotRequired[object]
    inputPreview: NotRequired[str]
    inputTruncated: NotRequired[bool]
    step: int
    messageId: NotRequired[str | None]
    delegate: NotRequired[str]  # the agent whose turn answers it (a delegating tool's call: no one decides it)


class ToolEnd(_Stored):
    type: Literal["tool_end"]
    id: str
    name: str
    isError: bool
    content: NotRequired[str]
    step: int
    messageId: NotRequired[str | None]


class ApprovalRequest(_Stored):
    """A tool call waits for a decision: a person's approval, or a client's result for an
    external tool (`kind`); its turn parks `paused` until `resume(decisions=...)`."""

    type: Literal["approval_request"]
    id: str
    name: str
    kind: Literal["approval", "external"]
    input: NotRequired[object]
    inputPreview: NotRequired[str]
    inputTruncated: NotRequired[bool]
    step: int
    messageId: NotRequired[str | None]
    delegate: NotRequired[str]  # the agent whose turn answers it (a delegating tool's call: no one decides it)


class ApprovalDecision(_Stored):
    """A waiting call's decision, as its turn takes it (before the approved call runs, or
    the answer's `tool_end`): who decided (`by`, when known) and, for a denial, why."""

    type: Literal["approval_decision"]
    id: str
    name: str
    decision: Literal["approve", "deny", "result"]
    by: NotRequired[str]
    reason: NotRequired[str]
    decidedAtMs: NotRequired[int]  # when the decision was stored (ms since the epoch)
    step: int
    messageId: NotRequired[str | None]


class PendingCall(TypedDict):
    """A call a paused turn waits on (`TurnResult.pending_calls`, `Engine.pending_calls`):
    what a person or a client needs to decide it."""

    id: str
    executionId: str
    name: str
    kind: Literal["approval", "external"]
    step: int
    input: NotRequired[object]
    inputPreview: NotRequired[str]
    inputTruncated: NotRequired[bool]


class UserMessage(_Stored):
    """A steer the running turn took."""

    type: Literal["user_message"]
    text: str
    id: str
    messageId: NotRequired[str | None]


class TurnStart(_Stored):
    type: Literal["turn_start"]
    messageId: str | None
    sessionId: str
    input: str | None


class TurnResume(_Stored):
    type: Literal["turn_resume"]
    messageId: str | None
    sessionId: str
    interrupted: bool
    retract: NotRequired[list[int]]


class TurnYield(_Stored):
    type: Literal["turn_yield"]
    messageId: str | None


class TurnPause(_Stored):
    """The turn parked: its `pendingCalls` wait for decisions, and no worker holds it."""

    type: Literal["turn_pause"]
    messageId: str | None
    pendingCalls: list[PendingCall]
    atMs: NotRequired[int]  # when it parked (ms since the epoch)


class TurnEnd(_Stored, EndBody):
    type: Literal["turn_end"]
    messageId: str | None
    repeated: NotRequired[bool]  # added by a reader answering an ended turn again
    delegatedUsage: NotRequired[dict[str, int]]  # the usage of the turns its delegated calls ran
    outputType: NotRequired[str]  # a typed turn's answer type, by name ("@agent" or "module:Name")


class DelegateStart(_Stored):
    """A call of a delegating tool started a turn of another agent's session (its own
    stream, from cursor 0, shows that turn); the parent turn parks until it ends."""

    type: Literal["delegate_start"]
    messageId: str | None
    callId: str
    sessionId: str  # the child session
    agent: str  # the agent that runs it
    childMessageId: str  # the child turn's id (its prompt's message id)
    depth: int  # 1 for a child of a turn no agent delegated


class DelegateEnd(_Stored):
    """The child's turn ended; its answer became the call's result."""

    type: Literal["delegate_end"]
    messageId: str | None
    callId: str
    sessionId: str
    agent: str
    stopReason: str
    usage: dict[str, int]
    error: NotRequired[dict[str, object]]


class SessionError(_Stored):
    type: Literal["session_error"]
    messageId: str | None
    code: str
    message: str
    id: str | None


class NoWorker(TypedDict):
    agent: str
    sinceMs: int


class SessionWaiting(_Stored):
    """No live worker runs the session's agent (written once per wait by claim.lua)."""

    type: Literal["session_waiting"]
    messageId: str | None
    noWorker: NoWorker


class Idle(TypedDict):
    """A resume's answer when the session had nothing to run (never stored)."""

    type: Literal["idle"]
    requestId: str


ModelEvent = TextDelta | ReasoningDelta | ToolStart | ToolEnd | UserMessage | ApprovalRequest | ApprovalDecision
ModelEventType = Literal["text_delta", "reasoning_delta", "tool_start", "tool_end", "user_message",
                         "approval_request", "approval_decision"]
MODEL_EVENT_TYPES: Final[tuple[ModelEventType, ...]] = (
    "text_delta", "reasoning_delta", "tool_start", "tool_end", "user_message", "approval_request",
    "approval_decision")

ControlLine = TurnStart | TurnResume | TurnYield | TurnPause | TurnEnd | SessionError | DelegateStart | DelegateEnd
ControlLineType = Literal["turn_start", "turn_resume", "turn_yield", "turn_pause", "turn_end", "session_error",
                          "delegate_start", "delegate_end"]
CONTROL_LINE_TYPES: Final[tuple[ControlLineType, ...]] = (
    "turn_start", "turn_resume", "turn_yield", "turn_pause", "turn_end", "session_error", "delegate_start",
    "delegate_end")

StoredLine = ModelEvent | ControlLine | SessionWaiting  # what a session's stream holds
Line = StoredLine | Idle
LineType = ModelEventType | ControlLineType | Literal["session_waiting", "idle"]
LINE_TYPES: Final[tuple[LineType, ...]] = (*MODEL_EVENT_TYPES, *CONTROL_LINE_TYPES, "session_waiting", "idle")

# The deltas of one step, which a writer may merge and a reader shows as running text.
DELTA_TYPES: Final[tuple[LineType, ...]] = ("text_delta", "reasoning_delta")
# The lines that end a turn's following: it ended, or it stays open for the next delivery.
TURN_ENDS: Final[tuple[LineType, ...]] = ("turn_end",)
# The lines a follower of one turn stops at: its end, or its pause (it waits, parked, for
# decisions; the decision's own follower reads on from there).
TURN_STOPS: Final[tuple[LineType, ...]] = ("turn_end", "turn_pause")
# The lines a turn is opened or continued by (a resume follows the first after its cursor).
TURN_OPENS: Final[tuple[LineType, ...]] = ("turn_start", "turn_resume")

_BY_NAME: dict[str, LineType] = {kind: kind for kind in LINE_TYPES}


def line_type(line: Mapping[str, object]) -> LineType | None:
    """The declared type of a decoded line, None for a line of a type not declared here."""
    kind = line.get("type")
    return _BY_NAME.get(kind) if isinstance(kind, str) else None


def is_model_event(line: Line) -> TypeGuard[ModelEvent]:
    """Whether `line` is one of the model events a turn's iteration yields."""
    return line["type"] in MODEL_EVENT_TYPES


# What the engine's event buffer and sink carry: a `ModelEvent`, built below, or the turn's
# end (`turn_end` / `turn_yield` with `turnId`, `EngineCore.report_end`).
Event = Mapping[str, Any]


def text_delta(delta: str, step: int) -> Event:
    event: TextDelta = {"type": "text_delta", "delta": delta, "step": step}
    return event


def reasoning_delta(delta: str, step: int) -> Event:
    event: ReasoningDelta = {"type": "reasoning_delta", "delta": delta, "step": step}
    return event


def input_preview(input: object) -> str | None:
    """None for an input of at most 64 KiB of JSON, else the truncated preview a line
    carries instead (with `inputTruncated`)."""
    encoded = json.dumps(input, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if len(encoded) <= TOOL_INPUT_PREVIEW_MAX_BYTES:
        return None
    return encoded[:TOOL_INPUT_PREVIEW_MAX_BYTES].decode("utf-8", "ignore")


def tool_start(call_id: str, name: str, input: object, step: int) -> Event:
    """A `tool_start`; an input over 64 KiB of JSON becomes a truncated preview."""
    preview = input_preview(input)
    event: ToolStart
    if preview is None:
        event = {"type": "tool_start", "id": call_id, "name": name, "input": input, "step": step}
    else:
        event = {"type": "tool_start", "id": call_id, "name": name, "inputPreview": preview, "inputTruncated": True,
                 "step": step}
    return event


def approval_request(call: PendingCall) -> Event:
    """An `approval_request` for a call a turn parks on (its input as `tool_start` has it)."""
    event: ApprovalRequest = {"type": "approval_request", "id": call["id"], "name": call["name"],
                              "kind": call["kind"], "step": call["step"]}
    if "input" in call:
        event["input"] = call["input"]
    else:
        event["inputPreview"] = call.get("inputPreview", "")
        event["inputTruncated"] = True
    return event


def approval_decision(call_id: str, name: str, decision: Literal["approve", "deny", "result"], *, step: int,
                      by: str | None = None, reason: str | None = None, decided_at_ms: int | None = None) -> Event:
    """An `approval_decision`: call `call_id`'s decision, as its turn takes it."""
    event: ApprovalDecision = {"type": "approval_decision", "id": call_id, "name": name, "decision": decision,
                               "step": step}
    if by:
        event["by"] = by
    if reason:
        event["reason"] = reason
    if decided_at_ms is not None:
        event["decidedAtMs"] = decided_at_ms
    return event


def tool_end(call_id: str, name: str, *, is_error: bool, content: str | None, step: int) -> Event:
    event: ToolEnd = {"type": "tool_end", "id": call_id, "name": name, "isError": is_error, "step": step}
    if content is not None:
        event["content"] = content
    return event


def user_message(text: str, message_id: str) -> Event:
    event: UserMessage = {"type": "user_message", "text": text, "id": message_id}
    return event


def turn_start(message_id: str | None, session_id: str, text: str | None) -> TurnStart:
    return {"type": "turn_start", "messageId": message_id, "sessionId": session_id, "input": text}


def turn_resume(message_id: str | None, session_id: str, *, interrupted: bool, retract: Sequence[int] = ()) -> TurnResume:
    line: TurnResume = {"type": "turn_resume", "messageId": message_id, "sessionId": session_id,
                        "interrupted": interrupted}
    if retract:
        line["retract"] = list(retract)
    return line


def turn_yield(message_id: str | None) -> TurnYield:
    return {"type": "turn_yield", "messageId": message_id}


def turn_pause(message_id: str | None, pending_calls: list[PendingCall], *, at_ms: int | None = None) -> TurnPause:
    line: TurnPause = {"type": "turn_pause", "messageId": message_id, "pendingCalls": pending_calls}
    if at_ms is not None:
        line["atMs"] = at_ms
    return line


def turn_end(message_id: str | None, body: EndBody) -> TurnEnd:
    line: TurnEnd = {"type": "turn_end", "messageId": message_id, "stopReason": body["stopReason"],
                     "usage": body["usage"]}
    if "error" in body:
        line["error"] = body["error"]
    return line


def delegate_start(message_id: str | None, *, call_id: str, session_id: str, agent: str, child_message_id: str,
                   depth: int) -> DelegateStart:
    return {"type": "delegate_start", "messageId": message_id, "callId": call_id, "sessionId": session_id,
            "agent": agent, "childMessageId": child_message_id, "depth": depth}


def delegate_end(message_id: str | None, *, call_id: str, session_id: str, agent: str, stop_reason: str,
                 usage: Mapping[str, int], error: Mapping[str, object] | None = None) -> DelegateEnd:
    line: DelegateEnd = {"type": "delegate_end", "messageId": message_id, "callId": call_id, "sessionId": session_id,
                         "agent": agent, "stopReason": stop_reason, "usage": dict(usage)}
    if error:
        line["error"] = dict(error)
    return line


def session_error(message_id: str | None, error: Mapping[str, object], input_id: str | None) -> SessionError:
    """A turn's `session_error` (`id`: the input it could not take); with both None, the last
    line of a stream an error stopped (it has no cursor: it was never stored)."""
    return {"type": "session_error", "messageId": message_id, "code": str(error.get("code")),
            "message": str(error.get("message")), "id": input_id}


# -- store marks -------------------------------------------------------------------------


class StartMark(TypedDict):
    start: str  # the turn started (consumes the input id)


class EndMark(TypedDict):
    end: bool  # the open turn ended


YieldMark = TypedDict("YieldMark", {"yield": bool})  # the open turn yielded at a model boundary


class AcceptedMark(TypedDict):
    accepted: str  # the turn took a steer or follow-up


class StepMark(TypedDict):
    step: str  # the step the turn is at (cut-off counting)


class DoneMark(TypedDict):
    done: bool  # a model response or a tool result: progress (poison-turn counting)


class DropMark(TypedDict):
    drop: str  # consumes an input no turn takes (cancelled, or refused before it started)


class PauseMark(TypedDict):
    pause: str  # the open turn parks until these calls are decided (`a:<id>` approvals, `e:<id>`
    # external tools' results, `\n`-separated)


class DecidedMark(TypedDict):
    decided: str  # the turn took the decision of this call


Mark = StartMark | EndMark | YieldMark | AcceptedMark | StepMark | DoneMark | DropMark | PauseMark | DecidedMark
MarkName = Literal["start", "end", "yield", "accepted", "step", "done", "drop", "pause", "decided"]
MARK_NAMES: Final[tuple[MarkName, ...]] = ("start", "end", "yield", "accepted", "step", "done", "drop", "pause",
                                           "decided")
# Added to a call by the store's `append` arguments, never by an engine (append.lua's header).
CALL_MARK_NAMES: Final = ("release", "checkpoint", "pack")


def drop(input_id: str) -> DropMark:
    """The store mark that consumes an input no turn takes (cancelled, or refused before it
    started); the store refuses a mark name it does not know (`store/_replies.encode_marks`)."""
    return {"drop": input_id}
