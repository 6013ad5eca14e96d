"""The conversation as a fold of journal events: the same code runs live and on replay.

The engine never changes its history directly: it applies an event (and journals it),
so a new engine that replays the stored events rebuilds exactly the same state.
Messages are kept provider-neutral:

    {"role": "user", "blocks": [...]}
    {"role": "assistant", "content", "tool_calls": [{id, name, arguments}]}
    {"role": "tool", "id", "name", "content", "isError", "images"?}

Tool results reach the history in the order the model called them, once every call of
the response is answered; user text that arrives meanwhile (a steer, the resume notice)
waits behind them, because a Chat Completions history must answer every call first.

A call that waits for a decision (a tool with `approval`, or an `external` one) is
`awaiting` from its `tool_wait` record until a `tool_approved` or a `tool_result` (a
denial, a submitted result) decides it; a `turn_pause` parks the turn until then, and a
turn that ends first answers its awaiting calls as denied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NotRequired, TypedDict

from .errors import FxJournalError
from .limits import Block
from .messages import Message, ToolResult, UserMessage
from .models.openai_chat import RESUME_NOTICE
from .tools.runner import ToolCall
from .usage import add_usage, clean_usage

ENDED_UNANSWERED = "The turn ended before this call finished."


def denied(reason: str) -> str:
    """What the model reads for a call a person (or the turn's end) denied."""
    return f"The user denied this tool call: {reason}"


# The bodies of the journal events the fold reads (see `fxengine.journal.records`).


class TurnStartBody(TypedDict):
    turn: str
    input: list[Block]
    atMs: int


class StepBody(TypedDict):
    """`model_request {step}`."""

    step: int


class ModelResponseBody(TypedDict):
    step: int
    content: str
    toolCalls: list[ToolCall]
    finishReason: str | None
    usage: dict[str, int]
    cut: bool
    reasoning: NotRequired[str]


class ToolResultBody(ToolResult):
    step: int


class AwaitingCall(TypedDict):
    """A call that waits for a decision: a person's (`approval`) or a client's result (`external`)."""

    id: str
    name: str
    kind: Literal["approval", "external"]


class ToolWaitBody(TypedDict):
    step: int
    calls: list[AwaitingCall]


class ToolApprovedBody(TypedDict):
    step: int
    id: str


class AcceptedBody(TypedDict):
    id: str
    text: str


class ResumedBody(TypedDict):
    interrupted: bool
    retract: list[int]


class OutputBody(TypedDict):
    """`output`: the verdict on a typed answer (`fxengine.output`): `value` when valid, else
    `errors` and the `retry` text the model reads (absent when a final-result call's
    result carried it)."""

    step: int
    value: NotRequired[object]
    errors: NotRequired[list[dict[str, object]]]
    retry: NotRequired[str]


class TurnEndBody(TypedDict):
    """`turn_end {stopReason, usage, error?, output?}` (`events.EndBody`)."""

    stopReason: str
    usage: dict[str, int]
    error: NotRequired[dict[str, object]]
    output: NotRequired[object]


class LastEnd(TypedDict):
    """How the last turn ended, and the steps whose response it recorded."""

    stopReason: str | None
    usage: dict[str, int]
    error: dict[str, object] | None
    steps: list[int]
    output: NotRequired[object]  # a typed turn's answer


class Pending(TypedDict):
    """The calls of the turn's last response and the results they have so far, by call id."""

    step: int
    calls: list[ToolCall]
    results: dict[str, ToolResult]


@dataclass
class OpenTurn:
    """The turn that started and has not ended (it may be running, crashed or yielded)."""

    id: str
    step: int = 0
    responses: int = 0
    usage: dict[str, int] = field(default_factory=dict)
    yielded: bool = False
    requested: list[int] = field(default_factory=list)
    responded: list[int] = field(default_factory=list)
    pending: Pending | None = None
    deferred: list[Message] = field(default_factory=list)
    awaiting: list[AwaitingCall] = field(default_factory=list)  # calls of `pending` waiting for a decision
    decided: list[str] = field(default_factory=list)  # ids of `pending`'s calls a decision answered
    paused: bool = False  # parked until its awaiting calls are decided (`turn_pause`)
    # A typed answer's verdicts (`output` records): the valid answer, if one came and no
    # user text followed it; how many answers were refused, and the last one's errors.
    answered: bool = False
    answer: object = None
    output_retries: int = 0
    output_errors: list[dict[str, object]] = field(default_factory=list)

    def to_dict(self) -> OpenTurnState:
        return {
            "id": self.id,
            "step": self.step,
            "responses": self.responses,
            "usage": dict(self.usage),
            "yielded": self.yielded,
            "requested": list(self.requested),
            "responded": list(self.responded),
            "pending": self.pending,
            "deferred": list(self.deferred),
            "awaiting": list(self.awaiting),
            "decided": list(self.decided),
            "paused": self.paused,
            "answered": self.answered,
            "answer": self.answer,
            "outputRetries": self.output_retries,
            "outputErrors": list(self.output_errors),
        }

    @classmethod
    def from_dict(cls, raw: OpenTurnState) -> OpenTurn:
        return cls(
            id=raw["id"],
            step=int(raw.get("step", 0)),
            responses=int(raw.get("responses", 0)),
            usage=clean_usage(raw.get("usage")),
            yielded=bool(raw.get("yielded", False)),
            requested=list(raw.get("requested") or []),
            responded=list(raw.get("responded") or []),
            pending=raw.get("pending"),
            deferred=list(raw.get("deferred") or []),
            awaiting=list(raw.get("awaiting") or []),
            decided=list(raw.get("decided") or []),
            paused=bool(raw.get("paused", False)),
            answered=bool(raw.get("answered", False)),
            answer=raw.get("answer"),
            output_retries=int(raw.get("outputRetries", 0)),
            output_errors=list(raw.get("outputErrors") or []),
        )

    @property
    def unanswered(self) -> list[ToolCall]:
        """Calls of the last response that have no result yet, in call order."""
        if not self.pending:
            return []
        results = self.pending["results"]
        return [c for c in self.pending["calls"] if c["id"] not in results]

    @property
    def left_running(self) -> list[ToolCall]:
        """Unanswered calls that do not wait for a decision: those a stopped engine left
        running (or never started), in call order."""
        waiting = {call["id"] for call in self.awaiting}
        return [c for c in self.unanswered if c["id"] not in waiting]

    @property
    def retract(self) -> list[int]:
        """Steps whose request was sent but whose response was never recorded."""
        done = set(self.responded)
        return sorted(s for s in self.requested if s not in done)

    @property
    def step_name(self) -> str:
        """The `{step}` mark of where the turn is: the k-th model call, or its tools."""
        if self.pending and self.unanswered:
            return f"tools:{self.responses}"
        return f"model:{self.responses + 1}"


class OpenTurnState(TypedDict):
    """An `OpenTurn` in a checkpoint (every key but `id` may be absent)."""

    id: str
    step: NotRequired[int]
    responses: NotRequired[int]
    usage: NotRequired[dict[str, int]]
    yielded: NotRequired[bool]
    requested: NotRequired[list[int]]
    responded: NotRequired[list[int]]
    pending: NotRequired[Pending | None]
    deferred: NotRequired[list[Message]]
    awaiting: NotRequired[list[AwaitingCall]]
    decided: NotRequired[list[str]]
    paused: NotRequired[bool]
    answered: NotRequired[bool]
    answer: NotRequired[object]
    outputRetries: NotRequired[int]
    outputErrors: NotRequired[list[dict[str, object]]]


class ConversationState(TypedDict, total=False):
    """A `Conversation` in a checkpoint (a checkpoint's `state`)."""

    messages: list[Message]
    open: OpenTurnState | None
    lastTurnId: str | None
    lastEnd: LastEnd | None
    turns: int


@dataclass
class Conversation:
    """The whole engine state: history, the open turn, and how the last turn ended."""

    messages: list[Message] = field(default_factory=list)
    open: OpenTurn | None = None
    last_turn_id: str | None = None
    last_end: LastEnd | None = None
    turns: int = 0

    def to_dict(self) -> ConversationState:
        return {
            "messages": self.messages,
            "open": self.open.to_dict() if self.open else None,
            "lastTurnId": self.last_turn_id,
            "lastEnd": self.last_end,
            "turns": self.turns,
        }

    @classmethod
    def from_dict(cls, raw: ConversationState) -> Conversation:
        open_raw = raw.get("open")
        return cls(
            messages=list(raw.get("messages") or []),
            open=OpenTurn.from_dict(open_raw) if open_raw else None,
            last_turn_id=raw.get("lastTurnId"),
            last_end=raw.get("lastEnd"),
            turns=int(raw.get("turns", 0)),
        )

    # the fold

    def apply(self, kind: str, body: Mapping[str, object]) -> None:
        """Applies one journal event (see `fxengine.journal.records`); its `_on_<kind>`
        handler reads the body in the shape its kind is recorded with."""
        handler = getattr(self, "_on_" + kind)
        handler(body)

    def _user(self, message: UserMessage) -> None:
        if self.open is not None and self.open.unanswered:
            self.open.deferred.append(message)
        else:
            self.messages.append(message)

    def _settle(self) -> None:
        """Moves the answered calls (in call order) and any deferred messages into history."""
        turn = self.open
        if turn is None or turn.pending is None or turn.unanswered:
            return
        results = turn.pending["results"]
        for call in turn.pending["calls"]:
            self.messages.append({"role": "tool", **results[call["id"]]})
        turn.pending = None
        self.messages.extend(turn.deferred)
        turn.deferred = []

    def _on_turn_start(self, body: TurnStartBody) -> None:
        self.open = OpenTurn(id=body["turn"])
        self.turns += 1
        self.messages.append({"role": "user", "blocks": body["input"]})

    def _on_model_request(self, body: StepBody) -> None:
        turn = self._require_open()
        step = int(body["step"])
        turn.step = max(turn.step, step)
        turn.requested.append(step)

    def _on_model_response(self, body: ModelResponseBody) -> None:
        turn = self._require_open()
        step = int(body["step"])
        turn.responded.append(step)
        turn.responses += 1
        turn.usage = add_usage(turn.usage, body.get("usage"))
        calls = body.get("toolCalls") or []
        content = body.get("content") or ""
        if content or calls:
            self.messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        if calls:
            turn.pending = {"step": step, "calls": calls, "results": {}}
            turn.awaiting, turn.decided = [], []

    def _on_tool_result(self, body: ToolResultBody) -> None:
        turn = self._require_open()
        if turn.pending is None:
            return
        result: ToolResult = {"id": body["id"], "name": body["name"], "content": body.get("content", ""),
                                  "isError": bool(body.get("isError"))}
        if body.get("images"):
            result["images"] = body["images"]
        turn.pending["results"][body["id"]] = result
        self._decide(turn, body["id"])
        self._settle()

    def _decide(self, turn: OpenTurn, call_id: str) -> None:
        """A decision (or a result) answered an awaiting call."""
        if any(call["id"] == call_id for call in turn.awaiting):
            turn.awaiting = [call for call in turn.awaiting if call["id"] != call_id]
            turn.decided.append(call_id)

    def _on_tool_wait(self, body: ToolWaitBody) -> None:
        turn = self._require_open()
        unanswered = {call["id"] for call in turn.unanswered}
        turn.awaiting = [{"id": c["id"], "name": c["name"], "kind": c["kind"]} for c in body["calls"]
                         if c["id"] in unanswered]

    def _on_tool_approved(self, body: ToolApprovedBody) -> None:
        self._decide(self._require_open(), body["id"])

    def _on_turn_pause(self, body: Mapping[str, object]) -> None:
        self._require_open().paused = True

    def _on_accepted(self, body: AcceptedBody) -> None:
        self._user({"role": "user", "blocks": [{"type": "text", "text": body["text"]}]})
        turn = self.open
        if turn is not None:
            turn.answered, turn.answer = False, None  # a steer after the answer: the model answers again

    def _on_output(self, body: OutputBody) -> None:
        turn = self._require_open()
        if "value" in body:
            turn.answered, turn.answer = True, body["value"]
            return
        turn.output_retries += 1
        turn.output_errors = list(body.get("errors") or [])
        retry = body.get("retry")
        if retry:
            self._user({"role": "user", "blocks": [{"type": "text", "text": retry}]})

    def _on_resumed(self, body: ResumedBody) -> None:
        turn = self._require_open()
        turn.yielded = turn.paused = False
        if body.get("interrupted"):
            self._user({"role": "user", "blocks": [{"type": "text", "text": RESUME_NOTICE}]})

    def _on_turn_yield(self, body: Mapping[str, object]) -> None:
        self._require_open().yielded = True

    def _on_turn_end(self, body: TurnEndBody) -> None:
        turn = self.open
        if turn is None:
            return
        if turn.pending is not None:
            waiting = {call["id"] for call in turn.awaiting}
            reason = body.get("stopReason") or "the turn ended"
            for call in turn.unanswered:
                content = denied(reason) if call["id"] in waiting else ENDED_UNANSWERED
                turn.pending["results"][call["id"]] = {
                    "id": call["id"], "name": call["name"], "content": content, "isError": True}
            turn.awaiting = []
            self._settle()
        self.messages.extend(turn.deferred)
        self.last_turn_id = turn.id
        self.last_end = {"stopReason": body.get("stopReason"), "usage": clean_usage(body.get("usage")),
                         "error": body.get("error"), "steps": list(turn.responded)}
        if "output" in body:
            self.last_end["output"] = body["output"]
        self.open = None

    def _require_open(self) -> OpenTurn:
        if self.open is None:
            raise FxJournalError("journal event outside a turn")
        return self.open
