"""What a session went through, read from its stored lines: each turn, the workers (epochs)
that ran parts of it and how each part ended, its model steps and its tool calls.

Everything comes from the UI stream the turns already write (every line carries its
`messageId`, `epoch` and `cursor`, §4) and one `state()` snapshot, so a timeline costs no
write on the hot path. A part (a delivery: the lines one epoch wrote for one turn) ended:

- `ended`: it wrote the turn's `turn_end`;
- `yielded`: it wrote `turn_yield` (the deadline's soft stop, a warm shutdown) and the next
  part resumed with `interrupted: false`;
- `cut off`: it wrote `turn_yield` but the next part resumed with `interrupted: true` (the
  deadline's hard stop cut a call off, §6: no yield record was stored);
- `died`: it wrote neither and another epoch continued (`turn_resume {interrupted: true}`)
  or ended the turn, or, from the state, its lease is gone or taken: a killed process, a
  lost lease (a fenced worker stores nothing, so the two look the same) or a lost store;
- `paused`: it wrote `turn_pause`: the turn parked, its calls waiting for decisions (§6
  "Paused turns"), and the part that takes them resumes it;
- `running`: the last part of an open turn whose epoch holds the live lease (without a
  state, any last part of an open turn that wrote no yield).

A turn's `waits` are the calls it parked on: what each waited for (`approval`, or an
`external` tool's result), how it was decided (`approve`, `deny`, `result`; None while it
waits), by whom when the decision named them, and how long it waited (`waitedMs`: from the
pause to the decision's acceptance, both stamped on their lines).

A turn's `delegations` are its calls of delegating tools (§6 "Delegated turns"): the child
session and turn each started, its agent and depth, and how it ended (`stopReason`,
`usage`, `error`; None while it runs). `read(..., children=True)` also reads each child's
turn and nests it (`turn`), down the chain of delegations: one view of the whole work.

A step whose output a later part withdrew (`turn_resume.retract`, §4) is `withdrawn`. A tool
call is `ran` (started once, answered), `rerun` (started again by a later epoch: an
idempotent call a stopped worker left running, the engine's `tool.rerun`), `may have partly
run` (answered with the engine's `AMBIGUOUS_RESULT`, not run again), `running` (its part
is running) or `unfinished` (no answer stored: its worker stopped, or the turn ended first,
a cancel).

Not stored, so not shown: times (lines carry none but a pause's and a decision's, stream
ids are `<cursor>-0`), which of
kill / fence / store loss stopped a `died` part, and a rerun of a call whose first
`tool_start` line was lost with its worker (it shows as `ran`).

A timeline is read a page of turns at a time (`read`): a page holds at most `limit` turns
(the web route's default `DEFAULT_PAGE_TURNS`, at most `MAX_PAGE_TURNS`) and says where the
next one starts, so a reader of a session of ten thousand turns holds one page of turns and
one page of lines (`store.read_lines`), never the session.

    page = await fxworker.timeline.read(store, session_id)          # the first turns
    while page["next"] is not None:                                  # and the ones after
        page = await fxworker.timeline.read(store, session_id, cursor=page["next"])
    timeline = timeline_of(session_id, lines)                        # lines already in hand
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal, NotRequired, TypedDict

from fxengine.lines import DELTA_TYPES, line_type
from fxengine.loop import AMBIGUOUS_RESULT

from .store import RedisStore

INPUT_PREVIEW_CHARS = 200
# Turns in one page of `read`: the web route's default, and the most it answers at once.
DEFAULT_PAGE_TURNS = 20
MAX_PAGE_TURNS = 100
MAX_CHILD_DEPTH = 16  # how deep `read(children=True)` follows delegations

How = Literal["ended", "yielded", "cut off", "died", "paused", "running"]
Outcome = Literal["ran", "rerun", "may have partly run", "running", "unfinished"]


class Delivery(TypedDict):
    epoch: int
    startCursor: int
    endCursor: int
    how: How


class ToolCall(TypedDict):
    id: str
    name: str
    step: int | None
    epochs: list[int]
    outcome: Outcome
    isError: bool | None


class Wait(TypedDict):
    id: str
    name: str
    kind: str
    decision: str | None
    by: str | None
    reason: str | None
    pausedAtMs: int | None
    decidedAtMs: int | None
    waitedMs: int | None


class Delegation(TypedDict):
    callId: str
    sessionId: str
    agent: str
    childMessageId: str | None
    depth: int
    stopReason: str | None
    usage: dict[str, int] | None
    error: dict[str, object] | None
    turn: NotRequired[Turn | None]  # the child's turn, read with `children=True` (None: not found)


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
    error: dict[str, object] | None
    deliveries: list[Delivery]
    steps: list[Step]
    tools: list[ToolCall]
    steers: int
    waits: list[Wait]
    delegations: list[Delegation]


class Timeline(TypedDict):
    sessionId: str
    turns: list[Turn]


class TimelinePage(Timeline):
    """One page of `read`: its turns, and `next`, the cursor the following page is read
    after (None: this page reaches the end of what is stored)."""

    next: int | None


class _Call:
    """A tool call while lines come in; its outcome is decided once they are all read."""

    __slots__ = ("answered", "ambiguous", "public")

    def __init__(self, public: ToolCall) -> None:
        self.public = public
        self.answered = False
        self.ambiguous = False


class TimelineBuilder:
    """Takes a session's lines in cursor order (`add`), a page at a time if need be: it keeps
    one entry per turn, part, step and tool call, never the lines themselves."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._turns: dict[str, Turn] = {}
        self._calls: dict[str, dict[str, _Call]] = {}

    @property
    def turn_count(self) -> int:
        return len(self._turns)

    def starts_turn(self, line: Mapping[str, object]) -> bool:
        """Whether `line` is the first this builder sees of a turn."""
        mid = line.get("messageId")
        return isinstance(mid, str) and bool(mid) and mid not in self._turns

    def add(self, line: Mapping[str, object]) -> None:
        mid = line.get("messageId")
        if not isinstance(mid, str) or not mid:
            return  # `idle` and other lines of no turn
        turn = self._turns.get(mid)
        if turn is None:
            turn = self._turns[mid] = Turn(messageId=mid, input=None, stopReason=None, error=None, deliveries=[],
                                           steps=[], tools=[], steers=0, waits=[], delegations=[])
            self._calls[mid] = {}
        kind = line_type(line)
        if kind == "session_error":
            turn["error"] = {"code": line.get("code"), "message": line.get("message")}
            return  # written by whoever ended the turn, before its turn_end: no part of its own
        part = _part(turn, line)
        if kind == "turn_start":
            text = line.get("input")
            turn["input"] = _preview(text) if isinstance(text, str) else None
        elif kind == "turn_resume":
            _resume(turn, line)
        elif kind == "turn_yield":
            part["how"] = "yielded"
        elif kind == "turn_pause":
            part["how"] = "paused"
            _paused(turn, line)
        elif kind == "approval_request":
            turn["waits"].append(Wait(id=str(line.get("id") or ""), name=str(line.get("name") or ""),
                                      kind=str(line.get("kind") or ""), decision=None, by=None, reason=None,
                                      pausedAtMs=None, decidedAtMs=None, waitedMs=None))
        elif kind == "approval_decision":
            _decided(turn, line)
        elif kind == "delegate_start":
            depth = line.get("depth")
            child = line.get("childMessageId")
            turn["delegations"].append(Delegation(
                callId=str(line.get("callId") or ""), sessionId=str(line.get("sessionId") or ""),
                agent=str(line.get("agent") or ""), childMessageId=child if isinstance(child, str) else None,
                depth=_int(depth), stopReason=None, usage=None, error=None))
        elif kind == "delegate_end":
            _delegated(turn, line)
        elif kind == "turn_end":
            part["how"] = "ended"
            stop = line.get("stopReason")
            turn["stopReason"] = stop if isinstance(stop, str) else "unknown"
            error = line.get("error")
            if isinstance(error, dict):
                turn["error"] = error
        elif kind in DELTA_TYPES:
            step = _step(turn, _int(line.get("step")), part["epoch"])
            size = len(str(line.get("delta") or ""))
            step["textChars" if kind == "text_delta" else "reasoningChars"] += size
        elif kind == "tool_start":
            self._tool_start(turn, line, part["epoch"])
        elif kind == "tool_end":
            self._tool_end(turn, line, part["epoch"])
        elif kind == "user_message":
            turn["steers"] += 1

    def _tool_start(self, turn: Turn, line: Mapping[str, object], epoch: int) -> None:
        call = self._call(turn, line, epoch)
        if epoch not in call.public["epochs"]:
            call.public["epochs"].append(epoch)  # started again by a later part: a rerun
        elif len(call.public["epochs"]) == 1 and call.public["step"] is not None:
            _step(turn, call.public["step"], epoch)  # a step that only called tools is a step too

    def _tool_end(self, turn: Turn, line: Mapping[str, object], epoch: int) -> None:
        call = self._call(turn, line, epoch)
        call.answered = True
        call.public["isError"] = bool(line.get("isError"))
        call.ambiguous = call.public["isError"] is True and line.get("content") == AMBIGUOUS_RESULT

    def _call(self, turn: Turn, line: Mapping[str, object], epoch: int) -> _Call:
        calls = self._calls[turn["messageId"]]
        call_id = str(line.get("id") or "")
        call = calls.get(call_id)
        if call is None:  # answered without a start (a start lost with its worker) is still a call
            step = line.get("step")
            public = ToolCall(id=call_id, name=str(line.get("name") or ""),
                              step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                              epochs=[epoch], outcome="running", isError=None)
            call = calls[call_id] = _Call(public)
            turn["tools"].append(public)
        return call

    def result(self, state: Mapping[str, object] | None = None) -> Timeline:
        """The timeline of the lines added. `state` (the session's `state()`: `status`,
        `epoch`), read before the lines, tells whether the last part of an open turn still
        runs or its worker is gone."""
        turns = list(self._turns.values())
        for turn in turns:
            _settle(turn, state)
            running = turn["deliveries"][-1] if turn["deliveries"] and turn["deliveries"][-1]["how"] == "running" else None
            for call in self._calls[turn["messageId"]].values():
                call.public["outcome"] = _outcome(call, running)
        return Timeline(sessionId=self.session_id, turns=turns)


def timeline_of(session_id: str, lines: Iterable[Mapping[str, object]],
                state: Mapping[str, object] | None = None) -> Timeline:
    """`{sessionId, turns: [...]}` from a session's lines in cursor order (and its state)."""
    builder = TimelineBuilder(session_id)
    for line in lines:
        builder.add(line)
    return builder.result(state)


async def read(store: RedisStore, session_id: str, *, state: Mapping[str, object] | None = None, cursor: int = 0,
               limit: int = DEFAULT_PAGE_TURNS, children: bool = False) -> TimelinePage:
    """A page of the timeline of `session_id`: the turns whose lines follow stream cursor
    `cursor` (0: the first turns), at most `limit` of them, read a page of lines at a time.

    `next` is the cursor just before the first line of the turn after the page: pass it as
    `cursor` for the following page. It is None when the page reaches the end of what is
    stored (its last turn may still be open: read the same page again to see it grow). A
    turn's lines follow each other in the stream, so a page holds whole turns; a `cursor`
    inside a turn gives that turn from there on. The reader holds the page's turns and one
    page of lines (`READ_PAGE_LINES`), whatever the session's length.

    `state` is the session's `state()` if the caller has it (read before the lines, so
    the lines are at least as new); otherwise it is read here, first. `children`: each
    delegation's child turn is read too and nested (`Delegation.turn`), and theirs, at
    most `MAX_CHILD_DEPTH` deep.
    `FxUnknownSessionError` for no such session; `FxInvalidCursorError` for a cursor that
    is no stream cursor; `ValueError` for a `limit` below 1."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"a timeline page holds at least one turn, got limit={limit!r}")
    if state is None:
        found = await store.state(session_id)
        state = {"status": found.status, "epoch": found.epoch}
    builder = TimelineBuilder(session_id)
    after = cursor
    while lines := await store.read_lines(session_id, after):
        for line in lines:
            if builder.turn_count >= limit and builder.starts_turn(line):
                # The turn after the page: it is read from just before its first line.
                return _page(builder.result(state), next_cursor=int(line["cursor"]) - 1)
            builder.add(line)
        after = int(lines[-1]["cursor"])
    page = _page(builder.result(state), next_cursor=None)
    if children:
        await _nest_children(store, page["turns"], depth=1)
    return page


async def _nest_children(store: RedisStore, turns: list[Turn], *, depth: int) -> None:
    """Reads the child turn of each delegation of `turns` into it (`Delegation.turn`)."""
    for turn in turns:
        for delegation in turn["delegations"]:
            delegation["turn"] = await _child_turn(store, delegation) if depth <= MAX_CHILD_DEPTH else None
            child = delegation["turn"]
            if child is not None:
                await _nest_children(store, [child], depth=depth + 1)


async def _child_turn(store: RedisStore, delegation: Delegation) -> Turn | None:
    """The child's turn a delegation started (its session's lines, read until it is found)."""
    session_id, message_id = delegation["sessionId"], delegation["childMessageId"]
    found = await store.state(session_id) if message_id else None
    if found is None:
        return None
    state = {"status": found.status, "epoch": found.epoch}
    builder = TimelineBuilder(session_id)
    after = 0
    while lines := await store.read_lines(session_id, after):
        for line in lines:
            if line.get("messageId") == message_id:
                builder.add(line)
        after = int(lines[-1]["cursor"])
    for turn in builder.result(state)["turns"]:
        return turn
    return None


def _page(timeline: Timeline, *, next_cursor: int | None) -> TimelinePage:
    return TimelinePage(sessionId=timeline["sessionId"], turns=timeline["turns"], next=next_cursor)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _preview(text: str) -> str:
    if len(text) <= INPUT_PREVIEW_CHARS:
        return text
    return text[: INPUT_PREVIEW_CHARS - 1] + "…"


def _part(turn: Turn, line: Mapping[str, object]) -> Delivery:
    """The part (epoch) `line` belongs to, opened when a new epoch writes."""
    epoch, cursor = _int(line.get("epoch")), _int(line.get("cursor"))
    parts = turn["deliveries"]
    if not parts or parts[-1]["epoch"] != epoch:
        parts.append(Delivery(epoch=epoch, startCursor=cursor, endCursor=cursor, how="running"))
    part = parts[-1]
    part["endCursor"] = cursor
    return part


def _resume(turn: Turn, line: Mapping[str, object]) -> None:
    """A later part continued the turn: how the one before ended, and the steps it withdrew."""
    parts = turn["deliveries"]
    before = parts[-2] if len(parts) > 1 else None
    if before is not None and before["how"] in ("running", "yielded") and line.get("interrupted"):
        before["how"] = "cut off" if before["how"] == "yielded" else "died"
    retract = line.get("retract")
    withdrawn = set(retract) if isinstance(retract, list) else set()
    for step in turn["steps"]:
        if step["step"] in withdrawn and step["epoch"] != parts[-1]["epoch"]:
            step["withdrawn"] = True


def _paused(turn: Turn, line: Mapping[str, object]) -> None:
    """A pause: the time its calls' waits began (the first pause each one waited in)."""
    at = line.get("atMs")
    for wait in turn["waits"]:
        if wait["decision"] is None and wait["pausedAtMs"] is None and isinstance(at, int):
            wait["pausedAtMs"] = at


def _decided(turn: Turn, line: Mapping[str, object]) -> None:
    for wait in turn["waits"]:
        if wait["id"] == line.get("id") and wait["decision"] is None:
            decision, by, reason, at = line.get("decision"), line.get("by"), line.get("reason"), line.get("decidedAtMs")
            wait["decision"] = str(decision) if isinstance(decision, str) else None
            wait["by"] = by if isinstance(by, str) else None
            wait["reason"] = reason if isinstance(reason, str) else None
            if isinstance(at, int):
                wait["decidedAtMs"] = at
                if wait["pausedAtMs"] is not None:
                    wait["waitedMs"] = max(0, at - wait["pausedAtMs"])
            return


def _delegated(turn: Turn, line: Mapping[str, object]) -> None:
    for delegation in turn["delegations"]:
        if delegation["callId"] == line.get("callId") and delegation["stopReason"] is None:
            stop, usage, error = line.get("stopReason"), line.get("usage"), line.get("error")
            delegation["stopReason"] = stop if isinstance(stop, str) else "unknown"
            delegation["usage"] = ({k: v for k, v in usage.items() if isinstance(v, int)}
                                   if isinstance(usage, dict) else {})
            delegation["error"] = error if isinstance(error, dict) else None
            return


def _step(turn: Turn, number: int, epoch: int) -> Step:
    for step in reversed(turn["steps"]):
        if step["step"] == number and step["epoch"] == epoch:
            return step
    step = Step(step=number, epoch=epoch, textChars=0, reasoningChars=0, withdrawn=False)
    turn["steps"].append(step)
    return step


def _settle(turn: Turn, state: Mapping[str, object] | None) -> None:
    """How the parts no later line told about ended. A part before the last that never
    wrote its end or a yield died (the turn went on, or was ended, by another epoch). The
    last part of an open turn runs while its epoch holds the live lease; with its lease
    gone (the session waits) or taken by a later epoch, its worker died."""
    parts = turn["deliveries"]
    for part in parts[:-1]:
        if part["how"] == "running":
            part["how"] = "died"
    if not parts or parts[-1]["how"] != "running" or state is None:
        return
    epoch, last = _int(state.get("epoch")), parts[-1]["epoch"]
    if epoch > last or (epoch == last and state.get("status") != "running"):
        parts[-1]["how"] = "died"  # (a state older than the lines, epoch < last, tells nothing)


def _outcome(call: _Call, running: Delivery | None) -> Outcome:
    if call.ambiguous:
        return "may have partly run"
    if call.answered:
        return "rerun" if len(call.public["epochs"]) > 1 else "ran"
    if running is not None and call.public["epochs"][-1] == running["epoch"]:
        return "running"
    return "unfinished"
