"""Agents that call agents (docs/design.md §6 "Delegated turns").

A delegating tool (`Agent.as_tool()`, or `delegate_tool()` by hand) is an external tool
whose result another session gives: when the model calls it the parent turn parks, as for
any call that waits (nothing is held while it waits), and the call's prompt goes to a
child session of the tool's agent, run by that agent's workers on their own queue. When
the child's turn ends, its final text (or its error, or `cancelled`) is submitted as the
call's result through the same door a client's result takes (`store.accept(kind=
"decision")`), and the parent resumes on whichever worker takes its wake.

Each step is idempotent and ordered so that a crash at any instant loses nothing:

- The children start in the call that parks the parent (`start_children`, run just before
  the record that parks the turn is stored, and again whenever a parked parent is claimed
  without decisions): a child's id and its prompt's message id come from the parent's call
  (`child_session_id`, `child_message_id`), so a second start is the store's `repeated`.
- A child replies (`reply`) before its own end is stored: a worker that dies between leaves
  the child's turn open; the next one ends it again and its reply is `repeated` (one per
  child turn, message id `reply_message_id`); a reply to a call no longer waiting (the
  parent was cancelled, timed out) is dropped.
- A cancel of a parked parent cancels the turns of its children (`cancel_children`).

The link from child to parent travels in the child prompt's stored settings (`Link`,
under `delegation`), read back by `link_of`, which checks what it decodes. Bounds: a link
one deeper than `max_delegation_depth`, or a call past `max_children` waiting at once,
starts a child whose input ends at once with `FX_DELEGATION_DEPTH` /
`FX_DELEGATION_FANOUT` (the parent's model reads the code as the call's error), so a
refusal takes the same crash-safe path as an answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from fxengine import approvals
from fxengine.codes import Code
from fxengine.errors import FxError, FxInputError, FxJournalVersionError
from fxengine.limits import Block, check_prompt_input
from fxengine.lines import ErrorBody
from fxengine.tools.definition import Tool
from fxengine.tools.runner import parse_arguments

from . import protocol, registry, tracing, typed
from .ids import SESSION_PREFIX, now_ms
from .store.types import DELEGATED_LEVEL, TYPED_LEVEL
from .wakers import cancel_with_wake

if TYPE_CHECKING:
    from fxengine.engine import Engine

    from .protocol import WorkerAgent
    from .store import RedisStore
    from .store.persistence import LineWriter

log = logging.getLogger("fxworker.delegation")

LINK_KEY = "delegation"  # the key of an input's stored settings that holds its `Link`
LINK_VERSION = 1
MAX_DEPTH_LIMIT = 16
MAX_CHILDREN_LIMIT = 64
DEFAULT_MAX_DEPTH = 3
DEFAULT_MAX_CHILDREN = 8
# A child that answers before its parent's pause is stored waits for it, this long at most.
REPLY_WAIT_S = 30.0
REPLY_RETRY_FIRST_S = 0.05
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Answers the parent's door refuses for good: dropped (the parent no longer waits on the
# call, or the parent session is gone).
_DECISION_REFUSALS = (Code.DECISION_UNKNOWN_CALL, Code.DECISION_REPEATED, Code.DECISION_EXPIRED,
                      Code.UNKNOWN_SESSION)
_REFUSALS = frozenset({Code.DELEGATION_DEPTH, Code.DELEGATION_FANOUT, Code.DELEGATION_INVALID})

PromptOf = Callable[[dict[str, object]], "str | list[Block]"]


@dataclass(frozen=True)
class DelegateTool(Tool):
    """A tool whose calls are answered by a turn of agent `agent` (`delegate_tool`)."""

    agent: str = ""
    keep: bool = False  # one child session per parent session (its turns in call order), not one per call
    prompt_of: PromptOf | None = field(default=None, repr=False)


def _input_prompt(args: dict[str, object]) -> str | list[Block]:
    value = args.get("input")
    if not isinstance(value, str):
        raise FxInputError("the call's input must be a string")
    return value


def delegate_tool(
    agent: str,
    *,
    name: str,
    description: str,
    parameters: Mapping[str, object] | None = None,
    prompt: PromptOf | None = None,
    keep: bool = False,
) -> DelegateTool:
    """A tool that hands each call to a turn of agent `agent` (its own session, on its own
    workers) and answers with that turn's final text.

    `parameters` is the JSON schema of the call's arguments (default ``{input: string}``);
    `prompt(args)` builds the child's prompt from them (default: `args["input"]`). `keep`:
    one child session per parent session, so the child remembers earlier calls; by default
    each call has a session of its own.
    """
    schema = dict(parameters) if parameters is not None else {
        "type": "object",
        "properties": {"input": {"type": "string", "description": "the task, in full, for the agent"}},
        "required": ["input"],
    }
    if not isinstance(agent, str) or not agent:
        raise FxInputError("delegate_tool: agent must be an agent's name")
    # Not idempotent: a second child turn for one call would run the child's tools again.
    return DelegateTool(name, description, schema, idempotent=False, external=True, agent=agent, keep=bool(keep),
                        prompt_of=prompt or _input_prompt)


# -- the link a child's input carries ------------------------------------------------------


class Link(TypedDict):
    """The parent of a delegated turn, as the child's stored settings hold it."""

    v: int
    parent: str  # the parent session
    turn: str  # the parent's turn
    call: str  # the parent's call this turn answers
    depth: int  # 1 for a child of a turn no agent delegated
    maxDepth: int
    refuse: dict[str, str] | None  # {code, message}: the child ends at once with this error


def link_of(settings: object) -> Link | None:
    """The `Link` an input's stored settings carry, checked; None when it has none or
    it cannot be read (logged: the turn then runs as a plain prompt, and answers no one)."""
    raw = settings.get(LINK_KEY) if isinstance(settings, Mapping) else None
    if raw is None:
        return None
    if (not isinstance(raw, Mapping) or raw.get("v") != LINK_VERSION
            or not all(isinstance(raw.get(k), str) and raw.get(k) for k in ("parent", "turn", "call"))
            or not all(isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool) for k in ("depth", "maxDepth"))):
        log.error("an input's delegation link cannot be read (version %r): it answers no parent",
                  raw.get("v") if isinstance(raw, Mapping) else None)
        return None
    refuse = raw.get("refuse")
    if refuse is not None and not (isinstance(refuse, Mapping) and refuse.get("code") in _REFUSALS
                                   and isinstance(refuse.get("message"), str)):
        refuse = {"code": Code.DELEGATION_INVALID, "message": "the delegation was refused"}
    return {"v": LINK_VERSION, "parent": str(raw["parent"]), "turn": str(raw["turn"]), "call": str(raw["call"]),
            "depth": int(raw["depth"]), "maxDepth": int(raw["maxDepth"]),
            "refuse": {"code": str(refuse["code"]), "message": str(refuse["message"])} if refuse else None}


def check_version(settings: object) -> None:
    """`FxJournalVersionError` for a link a newer release wrote (a later `v`): this release
    would run its turn as a plain prompt that answers no one, so the input is left to a
    process that reads it (`Work._let_go_for_newer`), nothing ended."""
    raw = settings.get(LINK_KEY) if isinstance(settings, Mapping) else None
    version = raw.get("v") if isinstance(raw, Mapping) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > LINK_VERSION:
        raise FxJournalVersionError(f"a delegation link of version {version} (this release reads {LINK_VERSION})")


def refusal(link: Link | None) -> ErrorBody | None:
    """The error a delegated input ends with at once (a bound or a bad call), if any."""
    if link is None or not link["refuse"]:
        return None
    return {"code": link["refuse"]["code"], "message": link["refuse"]["message"]}


# -- ids -------------------------------------------------------------------------------------


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\x00".join(parts).encode()).digest()


def child_session_id(parent: str, tool: DelegateTool, execution_id: str) -> str:
    """The child session of a call: one per call, or one per parent session (`keep`)."""
    number = int.from_bytes(_digest("child", parent, tool.name if tool.keep else execution_id)[:17], "big") >> 6
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[number & 31])
        number >>= 5
    chars[-1] = _CROCKFORD[int(_CROCKFORD.index(chars[-1])) & 7]  # a ULID's first character is 0-7
    return SESSION_PREFIX + "".join(reversed(chars))


def child_message_id(execution_id: str) -> str:
    """The child prompt's message id (its turn's id), the same for every start of the call."""
    return "dlg_" + _digest("prompt", execution_id)[:16].hex()


def reply_message_id(child_session: str, child_turn: str) -> str:
    """The message id of a child turn's answer to its parent's call."""
    return "dlr_" + _digest("reply", child_session, child_turn)[:16].hex()


# -- the parent's side ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """A waiting call of a delegating tool: its id, its execution id, its arguments."""

    id: str
    execution_id: str
    args: dict[str, object] | None
    tool: DelegateTool


def waiting_calls(engine: Engine, tools: Sequence[Tool]) -> list[Call]:
    """The parked turn's waiting calls of delegating tools, in call order."""
    by_name = {t.name: t for t in tools if isinstance(t, DelegateTool)}
    if not by_name:
        return []
    pending = engine.pending_calls
    turn = engine.core.conversation.open
    arguments = {c["id"]: c["arguments"] for c in (turn.pending["calls"] if turn and turn.pending else [])}
    out: list[Call] = []
    for call in pending:
        tool = by_name.get(call["name"])
        if tool is None or call["kind"] != "external":
            continue
        value, error = parse_arguments(arguments.get(call["id"], "{}"))
        out.append(Call(call["id"], call["executionId"], value if error is None and isinstance(value, dict) else None,
                        tool))
    return out


@dataclass(frozen=True, slots=True)
class Parent:
    """The parent turn that delegates: its session, its turn, its own link (when it is a
    child itself) and its agent's bounds."""

    session_id: str
    turn_id: str
    agent: WorkerAgent
    store: RedisStore
    link: Link | None
    context: object = None
    max_depth: int = DEFAULT_MAX_DEPTH
    max_children: int = DEFAULT_MAX_CHILDREN


async def start_children(parent: Parent, calls: Sequence[Call], writer: LineWriter | None, *,
                         wake: bool = True, announced: set[str] | None = None) -> list[tuple[str, str]]:
    """Prompts the child of each call (idempotent) and queues a `delegate_start` line for
    each call not `announced` (the calls whose line is stored; without it, for each child
    this start created), adding it there. With `wake`, wakes them; else returns the wakes to send
    (child, agent) once the parent's pause is stored: a child that ran first could answer
    before its parent waits on the call (the accept marked it ready and woken, so should the
    parent's worker die first, the sweeper wakes it)."""
    wakes: list[tuple[str, str]] = []
    depth = parent.link["depth"] + 1 if parent.link else 1
    max_depth = min(parent.max_depth, parent.link["maxDepth"]) if parent.link else parent.max_depth
    for index, call in enumerate(calls):
        refuse = None
        blocks: list[Block] | str = "(refused)"
        if depth > max_depth:
            refuse = {"code": Code.DELEGATION_DEPTH.value,
                      "message": f"delegation deeper than {max_depth} agents was refused (max_delegation_depth); "
                                 "answer without delegating"}
        elif index >= parent.max_children:
            refuse = {"code": Code.DELEGATION_FANOUT.value,
                      "message": f"at most {parent.max_children} delegated calls may wait at once (max_children); "
                                 "call fewer at a time"}
        else:
            try:
                if call.args is None or call.tool.prompt_of is None:
                    raise FxInputError("the call's arguments are not a JSON object")
                blocks = check_prompt_input(call.tool.prompt_of(call.args), json_only=True)
            except (FxInputError, ValueError, TypeError, KeyError) as exc:
                refuse = {"code": Code.DELEGATION_INVALID.value, "message": f"the call cannot be delegated: {exc}"}
                blocks = "(refused)"
        link: Link = {"v": LINK_VERSION, "parent": parent.session_id, "turn": parent.turn_id, "call": call.id,
                      "depth": depth, "maxDepth": max_depth, "refuse": refuse}
        child = child_session_id(parent.session_id, call.tool, call.execution_id)
        message_id = child_message_id(call.execution_id)
        settings: dict[str, object] = {LINK_KEY: dict(link)}
        needs = DELEGATED_LEVEL  # a process of an older release would never answer the parent
        child_agent = registry.get_agent(call.tool.agent)
        if child_agent is not None and child_agent.output is not None:
            # A typed agent's answer: stored as its prompts are, so only a process that types
            # it runs the child (its workers read the agent's own type).
            settings[typed.OUTPUT_KEY] = dict(typed.stored(child_agent.output, child_agent.output))
            needs = TYPED_LEVEL
        accepted = await parent.store.accept(
            child, agent=call.tool.agent, kind="prompt", message_id=message_id,
            input=blocks if isinstance(blocks, list) else check_prompt_input(blocks, json_only=True),
            context=parent.context, settings=settings, now_ms=now_ms(),
            traceparent=tracing.current_traceparent() if tracing.enabled() else None,
            needs=needs,
        )
        new = call.id not in announced if announced is not None else not accepted.repeated
        if new and writer is not None:
            # Queued, not pushed: it goes in the call of the record that parks the turn
            # (or the caller's flush), never alone before it.
            writer.queue([protocol.delegate_start(parent.turn_id, call_id=call.id, session_id=child,
                                                     agent=accepted.agent or call.tool.agent,
                                                     child_message_id=message_id, depth=depth)])
            if announced is not None:
                announced.add(call.id)
        if accepted.wake:
            wakes.append((child, accepted.agent or call.tool.agent))
    if wake:
        await wake_children(parent.agent, wakes)
        return []
    return wakes


async def wake_children(agent: WorkerAgent, wakes: Sequence[tuple[str, str]]) -> None:
    for child, owner in wakes:
        await _wake(agent, child, owner, "delegate")


async def cancel_children(parent: Parent, calls: Sequence[Call]) -> None:
    """Cancels the child turn of each waiting call (its worker sees it within a second; a
    child not started yet ends `cancelled` before it runs)."""
    for call in calls:
        child = child_session_id(parent.session_id, call.tool, call.execution_id)
        await cancel_with_wake(parent.store, child, message_id=child_message_id(call.execution_id),
                               wake=lambda owner: _wake(parent.agent, child, owner, "cancel"))


async def _wake(agent: WorkerAgent, session_id: str, owner: str, reason: str) -> None:
    """A wake is a hint (§7): the input's ready mark stands, so a lost one is the sweeper's."""
    try:
        await asyncio.to_thread(agent.wake, session_id, agent=owner, reason=reason)
    except Exception as exc:  # noqa: BLE001 - the sweeper wakes a ready session
        log.warning("waking %s (%s) failed (%s: %s); the sweeper will wake it", session_id, reason,
                    type(exc).__name__, exc)


# -- the child's side -------------------------------------------------------------------------


def final_text(engine: Engine | None) -> str:
    """The text of the turn's last model response (what the child answers)."""
    if engine is None:
        return ""
    for message in reversed(engine.core.conversation.messages):
        if message["role"] == "user":
            return ""
        if message["role"] == "assistant" and message["content"]:
            return message["content"]
    return ""


async def reply(
    agent: WorkerAgent,
    store: RedisStore,
    link: Link,
    *,
    child_session: str,
    child_turn: str,
    stop_reason: str,
    text: str,
    error: Mapping[str, object] | None,
    usage: Mapping[str, int] | None,
) -> None:
    """Submits a child turn's end as its parent's call result and wakes the parent. A
    parent that no longer waits on the call (cancelled, timed out, answered) drops it."""
    if stop_reason == "end_turn":
        decision = approvals.submit_result(text)
    else:
        why = f"{error.get('code')}: {error.get('message')}" if error else stop_reason
        decision = approvals.submit_result(f"agent {agent.name} ended {stop_reason} ({why})" +
                                           (f"; its last text: {text}" if text else ""), is_error=True)
    delegate: dict[str, object] = {"sessionId": child_session, "agent": agent.name, "stopReason": stop_reason,
                                   "usage": dict(usage or {})}
    if error:
        delegate["error"] = dict(error)
    body = {"callId": link["call"], "decision": decision, "by": f"agent:{agent.name}", "delegate": delegate}
    delay_s, waited_s = REPLY_RETRY_FIRST_S, 0.0
    while True:
        try:
            accepted = await store.accept(
                link["parent"], agent=agent.name, kind="decision",
                message_id=reply_message_id(child_session, child_turn), input=body, now_ms=now_ms(), create=False,
                call_id=link["call"], decision="r",
            )
            break
        except FxError as exc:
            if exc.code not in _DECISION_REFUSALS:
                raise
            if exc.code == Code.DECISION_UNKNOWN_CALL and waited_s < REPLY_WAIT_S and await _parking(store, link):
                # The parent's pause is not stored yet (its worker is slow, or died before
                # it and its turn resumes): the call will wait soon.
                await asyncio.sleep(delay_s)
                waited_s += delay_s
                delay_s = min(delay_s * 2, 2.0)
                continue
            log.info("the answer of %s to %s call %s was not taken (%s)", child_session, link["parent"], link["call"],
                     exc.code)
            return
    if accepted.wake:
        await _wake(agent, link["parent"], accepted.agent or agent.name, "decision")


async def _parking(store: RedisStore, link: Link) -> bool:
    """Whether the parent's turn is still open and not parked: its call may wait soon."""
    try:
        state = await store.state(link["parent"])
    except FxError as exc:
        if exc.code == Code.UNKNOWN_SESSION:
            return False  # gone: the answer is dropped
        raise
    return state is not None and state.open_turn == link["turn"] and not state.paused_calls


def delegate_end(turn_id: str, body: Mapping[str, object]) -> dict[str, object] | None:
    """The parent's `delegate_end` line for a decision input `body` a child sent."""
    delegate = body.get("delegate")
    call_id = body.get("callId")
    if not isinstance(delegate, Mapping) or not isinstance(call_id, str):
        return None
    usage = delegate.get("usage")
    error = delegate.get("error")
    return dict(protocol.delegate_end(
        turn_id, call_id=call_id, session_id=str(delegate.get("sessionId")), agent=str(delegate.get("agent")),
        stop_reason=str(delegate.get("stopReason")),
        usage={k: v for k, v in usage.items() if isinstance(k, str) and isinstance(v, int)}
        if isinstance(usage, Mapping) else {},
        error=error if isinstance(error, Mapping) else None))
