"""What a session went through, read from its stored lines: each turn, the workers (epochs)
that ran parts of it and how each part ended, its model steps and its tool calls.

Everything comes from the UI stream the turns already write (every line carries its
`messageId`, `epoch` and `cursor`, §4), so building a timeline costs no write on the hot
path. How a worker's part of a turn ended is read from what follows it: its own
`turn_end` (`ended`) or `turn_yield` (`yielded`: the deadline came, or a warm shutdown), then
the next worker's `turn_resume`: `interrupted` after no yield means the worker died (or
its lease was lost) and after a yield that it was cut off at the deadline mid-request. A
tool call is `ran` (its start and end in one part), `rerun` (started again by a later
part, an idempotent call left running by a dead worker), `may have partly run` (answered
so, not run again) or `running`.

    timeline = await fxworker.timeline.read(session)   # or `timeline_of(lines)`
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from fxengine.loop import AMBIGUOUS_RESULT

INPUT_PREVIEW_CHARS = 200


class Delivery(TypedDict):
    epoch: int
    firstCursor: int
    lastCursor: int
    how: str  # ended | yielded | cut off | died | running


class ToolCall(TypedDict):
    id: str
    name: str
    step: int | None
    epochs: list[int]
    outcome: str  # ran | rerun | may have partly run | running
    isError: bool | None


class Step(TypedDict):
    step: int
    epoch: int
    textChars: int
    reasoningChars: int
    withdrawn: bool


class Turn(TypedDict):
    messageId: str
    input: str | None
    stopReason: str | None
    error: dict[str, Any] | None
    deliveries: list[Delivery]
    steps: list[Step]
    tools: list[ToolCall]
    steers: int


def timeline_of(session_id: str, lines: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """`{sessionId, turns: [...]}` from a session's lines in cursor order."""
    turns: dict[str, Turn] = {}
    order: list[str] = []
    for line in lines:
        mid = line.get("messageId")
        if not isinstance(mid, str):
            continue
        turn = turns.get(mid)
        if turn is None:
            turn = turns[mid] = Turn(messageId=mid, input=None, stopReason=None, error=None, deliveries=[], steps=[],
                                     tools=[], steers=0)
            order.append(mid)
        _apply(turn, line)
    for turn in turns.values():
        _settle(turn)
    return {"sessionId": session_id, "turns": [turns[mid] for mid in order]}


def _part(turn: Turn, line: Mapping[str, Any]) -> Delivery:
    """The delivery (epoch) `line` belongs to, opened when a new epoch writes."""
    epoch, cursor = int(line.get("epoch") or 0), int(line.get("cursor") or 0)
    parts = turn["deliveries"]
    if not parts or parts[-1]["epoch"] != epoch:
        parts.append(Delivery(epoch=epoch, firstCursor=cursor, lastCursor=cursor, how="running"))
    part = parts[-1]
    part["lastCursor"] = cursor
    return part


def _apply(turn: Turn, line: Mapping[str, Any]) -> None:
    kind = line.get("type")
    if kind == "session_error":
        turn["error"] = {"code": line.get("code"), "message": line.get("message")}
        return  # written by whoever ended the turn, possibly without running it
    part = _part(turn, line)
    if kind == "turn_start":
        text = line.get("input")
        turn["input"] = text[:INPUT_PREVIEW_CHARS] if isinstance(text, str) else None
    elif kind == "turn_resume":
        before = turn["deliveries"][-2] if len(turn["deliveries"]) > 1 else None
        if before is not None and line.get("interrupted"):
            before["how"] = "cut off" if before["how"] == "yielded" else "died"
        for step in turn["steps"]:
            if step["step"] in (line.get("retract") or ()):
                step["withdrawn"] = True
    elif kind == "turn_yield":
        part["how"] = "yielded"
    elif kind == "turn_end":
        part["how"] = "ended"
        turn["stopReason"] = line.get("stopReason")
        if isinstance(line.get("error"), dict):
            turn["error"] = line["error"]
    elif kind in ("text_delta", "reasoning_delta"):
        step = _step(turn, int(line.get("step") or 0), part["epoch"])
        size = len(str(line.get("delta") or ""))
        step["textChars" if kind == "text_delta" else "reasoningChars"] += size
    elif kind == "tool_start":
        _tool_start(turn, line, part["epoch"])
    elif kind == "tool_end":
        _tool_end(turn, line, part["epoch"])
    elif kind == "user_message":
        turn["steers"] += 1


def _step(turn: Turn, number: int, epoch: int) -> Step:
    for step in reversed(turn["steps"]):
        if step["step"] == number and step["epoch"] == epoch:
            return step
    step = Step(step=number, epoch=epoch, textChars=0, reasoningChars=0, withdrawn=False)
    turn["steps"].append(step)
    return step


def _tool(turn: Turn, call_id: str) -> ToolCall | None:
    return next((call for call in turn["tools"] if call["id"] == call_id), None)


def _tool_start(turn: Turn, line: Mapping[str, Any], epoch: int) -> None:
    call_id = str(line.get("id") or "")
    call = _tool(turn, call_id)
    if call is None:
        turn["tools"].append(ToolCall(id=call_id, name=str(line.get("name") or ""), step=line.get("step"),
                                      epochs=[epoch], outcome="running", isError=None))
    elif epoch not in call["epochs"]:
        call["epochs"].append(epoch)
        call["outcome"] = "rerun"


def _tool_end(turn: Turn, line: Mapping[str, Any], epoch: int) -> None:
    call_id = str(line.get("id") or "")
    call = _tool(turn, call_id)
    if call is None:  # answered without a start here (a stream trimmed before it)
        call = ToolCall(id=call_id, name=str(line.get("name") or ""), step=line.get("step"), epochs=[epoch],
                        outcome="running", isError=None)
        turn["tools"].append(call)
    call["isError"] = bool(line.get("isError"))
    if line.get("content") == AMBIGUOUS_RESULT:
        call["outcome"] = "may have partly run"
    elif call["outcome"] == "running":
        call["outcome"] = "ran"


def _settle(turn: Turn) -> None:
    """A turn that ended: a part that never wrote its end and was not resumed died with
    nothing after it (its lease then ended the turn in the store)."""
    if turn["stopReason"] is None:
        return
    for part in turn["deliveries"][:-1]:
        if part["how"] == "running":
            part["how"] = "died"


async def read(session: Any) -> dict[str, Any]:
    """The timeline of `session` (an `fxworker.Session`), from every line it stored."""
    lines = [line async for line in session.stream(0, follow=False)]
    return timeline_of(session.id, lines)
