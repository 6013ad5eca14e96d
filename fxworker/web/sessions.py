"""The session routes of §3: create, prompt, steer, cancel, stream, state, timeline, list.

Each route checks access (`check_access`), reads its body through the capped reader,
calls the library (`Agent` / `Session`) and answers JSON or NDJSON. The library raises
`FX_` errors before anything is stored; `errors.py` turns them into statuses.

A create with a `messageId` is idempotent: the store maps the message id to the session
the first create made (`session_for_message`), so a repeat prompts that session and is
answered `repeated: true` instead of creating a second session and running the turn twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fxworker.agent import Agent, Session, SessionInfo, Turn
from fxworker.errors import (
    FxForbiddenError,
    FxInvalidCursorError,
    FxInvalidRequestError,
    FxUnknownAgentError,
    FxUnknownSessionError,
)
from fxworker.ids import validate_session_id
from fxworker.store._readers import MAX_CURSOR
from fxworker.timeline import DEFAULT_PAGE_TURNS, MAX_PAGE_TURNS
from fxworker.timeline import read as read_timeline

from .auth import check_access, check_session_id, is_allowed
from .bodies import CreateSessionBody, DecisionBody, PromptBody, SteerBody, read_json
from .ndjson import NDJSONResponse, StreamSlot, wants_ndjson

SESSION_HEADER = "X-Fx-Session-Id"
# `GET /v1/sessions?limit=N` takes 1 to 1000 (the CLI's range) and lists at most this many,
# reading their states this many at a time.
MAX_LIST_LIMIT = 100
LIST_STATE_CALLS = 8


def _agents(request: Request) -> dict[str, Agent]:
    agents: dict[str, Agent] = request.app.state.agents()
    return agents


def pick_agent(request: Request, name: str | None) -> Agent:
    """The agent called `name`, or the app's default one (`default`, or its only agent)."""
    agents = _agents(request)
    if name is not None:
        agent = agents.get(name)
        if agent is None:
            raise FxUnknownAgentError(f"this server has no agent named {name!r} (it serves: {', '.join(sorted(agents)) or 'none'})")
        return agent
    if "default" in agents:
        return agents["default"]
    if len(agents) == 1:
        return next(iter(agents.values()))
    if not agents:
        raise FxUnknownAgentError("this server serves no agents: set FX_AGENTS to the module that creates them")
    raise FxUnknownAgentError(f"name the agent: this server serves {', '.join(sorted(agents))}")


def _by_store(request: Request) -> list[Agent]:
    """One agent per distinct store of the app's agents, the default agent's first."""
    agents = _agents(request)
    try:
        first = [pick_agent(request, None)]
    except FxUnknownAgentError:
        first = []  # several agents and no `default`: any of them reads the store
    seen: list[object] = []
    chosen = []
    for agent in [*first, *(agents[name] for name in sorted(agents))]:
        store = request.app.state.store_for(agent)
        if not any(store is other for other in seen):
            seen.append(store)
            chosen.append(agent)
    if not chosen:
        raise FxUnknownAgentError("this server serves no agents: set FX_AGENTS to the module that creates them")
    return chosen


async def _existing(request: Request) -> tuple[Session, SessionInfo]:
    """The session of the path and its state, from the store that has it, with the agent that
    owns it; `FX_UNKNOWN_SESSION` (404) when no store of the app's agents has it."""
    session_id = request.path_params["session_id"]
    probes = _by_store(request)
    for probe in probes:
        try:
            state = await probe.session(session_id).state()
        except FxUnknownSessionError:
            if probe is probes[-1]:
                raise
            continue
        owner = _agents(request).get(state.get("agent") or "", probe)
        return owner.session(session_id), state
    raise FxUnknownSessionError(f"no session {session_id}")


def parse_cursor(raw: str | None) -> int:
    """A stream cursor from the query string: a non-negative integer (§10)."""
    if raw is None or raw == "":
        return 0
    if not raw.isdigit() or not raw.isascii():
        raise FxInvalidCursorError(f"cursor must be a non-negative integer, got {raw[:40]!r}")
    # Stream ids are 64-bit: a longer number is refused before int() (which refuses
    # strings over 4300 digits with a ValueError of its own).
    digits = raw.lstrip("0") or "0"
    if len(digits) > len(str(MAX_CURSOR)) or int(digits) > MAX_CURSOR:
        raise FxInvalidCursorError(f"cursor must be at most {MAX_CURSOR} (2^64 - 1), got {len(raw)} digits")
    return int(digits)


def parse_flag(raw: str | None, *, name: str, default: bool) -> bool:
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise FxInvalidRequestError(f"{name} must be 0 or 1, got {raw!r}")


def _accepted(turn: Turn) -> dict[str, object]:
    return {"sessionId": turn.session_id, "messageId": turn.message_id, "repeated": bool(turn.repeated), "cursor": turn.cursor}


def _stream_slot(request: Request) -> StreamSlot:
    """A place among this process's open streams, or 503 `FX_LIMIT_STREAMS` before anything is stored."""
    slot: StreamSlot = request.app.state.stream_slots.take()
    return slot


def _turn_response(request: Request, turn: Turn, slot: StreamSlot | None) -> Response:
    headers = {SESSION_HEADER: turn.session_id}
    if slot is not None:
        return NDJSONResponse(turn.ndjson(), headers=headers, slot=slot)
    return JSONResponse(_accepted(turn), status_code=202, headers=headers)


async def session_context(request: Request, body: CreateSessionBody) -> object:
    """The tool context a new session gets: the embedder's `session_context` hook decides;
    without one, the client's `context`, except under an `authorize` hook (403)."""
    hook = request.app.state.session_context
    if hook is not None:
        context: object = hook(request, body)
        return await context if inspect.isawaitable(context) else context
    if body.context is not None and request.app.state.authorize is not None:
        raise FxForbiddenError("this server sets a session's context itself: send none "
                               "(the embedder passes create_app(session_context=...) to choose it)")
    return body.context


def message_scope(agent: Agent, context: object) -> str:
    """The scope of a create's message id: the agent and the session's context, so one caller
    cannot take a message id another (with another pinned context) will use."""
    pinned = json.dumps(context, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{agent.name}\0{pinned}".encode()).hexdigest()[:24]


async def _first_session(request: Request, agent: Agent, body: CreateSessionBody, context: object) -> Session:
    """The session a create prompts: the one it names (where the server allows that), a new
    one, or the one an earlier create with this message id made."""
    if body.session_id is not None:
        session_id = validate_session_id(body.session_id)  # 400 before the hooks see it
        await check_session_id(request, session_id)
        await check_access(request, session_id, "prompt")  # it may exist: the hook decides as for a prompt
        try:
            await agent.session(session_id).state()
        except FxUnknownSessionError:
            return agent.session(session_id, context=context)  # new: the create pins its context
        # It exists: its pinned context holds, as for a prompt (two creates racing for one
        # new id may both pin theirs; the second's stands).
        return agent.session(session_id)
    session = agent.session(None, context=context)  # checks the settings before anything is stored
    if body.message_id is None:
        return session
    await session.prepare_input(body.input)  # a refused input claims no message id
    claim = getattr(agent.store, "session_for_message", None)
    if claim is None:
        return session  # a store of the embedder's own without the index
    first = await claim(body.message_id, session.id, scope=message_scope(agent, context))
    if first == session.id:
        return session
    await check_access(request, first, "prompt")
    return agent.session(first, context=context)


async def create_session(request: Request) -> Response:
    """`POST /v1/sessions` `{agent?, input, messageId?, context?, sessionId?}`: a new session
    (or the one `sessionId` names) and its first prompt."""
    await check_access(request, None, "create")
    body = await read_json(request, CreateSessionBody)
    agent = pick_agent(request, body.agent)
    context = await session_context(request, body)
    return await _prompted(request, body, lambda: _first_session(request, agent, body, context))


async def prompt(request: Request) -> Response:
    """`POST /v1/sessions/{id}/prompts` `{input, messageId?}`: the next prompt of a session."""
    await check_access(request, request.path_params["session_id"], "prompt")
    body = await read_json(request, PromptBody)

    async def existing() -> Session:
        session, _ = await _existing(request)
        return session

    return await _prompted(request, body, existing)


async def _prompted(request: Request, body: PromptBody, open_session: Callable[[], Awaitable[Session]]) -> Response:
    """Prompts the session `open_session()` gives: 202, or the turn's lines streamed. The
    stream slot a streamed prompt takes first is let go again if the prompt fails."""
    slot = _stream_slot(request) if wants_ndjson(request.headers.get("accept")) else None
    try:
        session = await open_session()
        turn = await session.prompt(body.input, message_id=body.message_id)
    except BaseException:
        if slot is not None:
            slot.release()
        raise
    return _turn_response(request, turn, slot)


async def steer(request: Request) -> Response:
    """`POST /v1/sessions/{id}/steer` `{input, messageId?}`: steer the running turn (§6)."""
    session_id = request.path_params["session_id"]
    await check_access(request, session_id, "steer")
    body = await read_json(request, SteerBody)
    session, _ = await _existing(request)
    accepted = await session.steer(body.input, message_id=body.message_id)
    return JSONResponse(
        {"sessionId": session_id, "messageId": accepted.message_id, "repeated": bool(accepted.repeated)}, status_code=202
    )


async def decide(request: Request) -> Response:
    """`POST /v1/sessions/{id}/calls/{call_id}` `{type: approve|deny|result, reason?, result?,
    isError?, messageId?}`: the decision for a call the session's parked turn waits on
    (§6 "Paused turns"). The `authorize` hook sees action `approve`; the principal it
    names (`request.state.principal`) is kept with the decision as who decided."""
    session_id = request.path_params["session_id"]
    call_id = request.path_params["call_id"]
    await check_access(request, session_id, "approve")
    body = await read_json(request, DecisionBody)
    session, _ = await _existing(request)
    by = getattr(request.state, "principal", None)
    by = by if isinstance(by, str) else None
    if body.type == "approve":
        accepted = await session.approve(call_id, message_id=body.message_id, by=by)
    elif body.type == "deny":
        accepted = await session.deny(call_id, reason=body.reason, message_id=body.message_id, by=by)
    else:
        accepted = await session.submit_tool_result(call_id, body.result, is_error=body.is_error,
                                                    message_id=body.message_id, by=by)
    return JSONResponse({"sessionId": session_id, "callId": call_id, "messageId": accepted.message_id,
                         "repeated": bool(accepted.repeated), "turnId": accepted.turn, "cursor": accepted.cursor},
                        status_code=202)


async def cancel(request: Request) -> Response:
    """`POST /v1/sessions/{id}/cancel`: cancel the running or waiting turn."""
    session_id = request.path_params["session_id"]
    await check_access(request, session_id, "cancel")
    session, _ = await _existing(request)
    await session.cancel()
    return JSONResponse({"sessionId": session_id, "cancelRequested": True}, status_code=202)


async def stream(request: Request) -> Response:
    """`GET /v1/sessions/{id}/stream?cursor=N&follow=1`: the lines after N, open for new ones."""
    session_id = request.path_params["session_id"]
    await check_access(request, session_id, "stream")
    cursor = parse_cursor(request.query_params.get("cursor"))
    follow = parse_flag(request.query_params.get("follow"), name="follow", default=True)
    session, _ = await _existing(request)
    slot = _stream_slot(request)
    return NDJSONResponse(session.stream_raw(cursor, follow=follow), headers={SESSION_HEADER: session_id}, slot=slot)


async def state(request: Request) -> Response:
    """`GET /v1/sessions/{id}`: agent, status, last cursor, turns, lease epoch."""
    await check_access(request, request.path_params["session_id"], "state")
    _, found = await _existing(request)
    return JSONResponse(found)


def parse_turns(raw: str | None) -> int:
    """A timeline page's `limit` from the query string: 1 to `MAX_PAGE_TURNS` turns."""
    if raw is None or raw == "":
        return DEFAULT_PAGE_TURNS
    if len(raw) > 3 or not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE_TURNS:
        raise FxInvalidRequestError(f"limit must be an integer from 1 to {MAX_PAGE_TURNS} (turns), got {raw[:40]!r}")
    return int(raw)


async def timeline(request: Request) -> Response:
    """`GET /v1/sessions/{id}/timeline?cursor=N&limit=K`: a page of at most K turns (those
    after stream cursor N), each with the workers that ran it (epoch, how each part ended),
    its steps and its tool calls, and `next`, the cursor of the page after it
    (`fxworker.timeline`); `children=1` nests each delegated call's child turn (the hook
    is asked for the parent session only: the children are its work). Its own hook action,
    `timeline`: it shows the prompts' text."""
    session_id = request.path_params["session_id"]
    await check_access(request, session_id, "timeline")
    cursor = parse_cursor(request.query_params.get("cursor"))
    limit = parse_turns(request.query_params.get("limit"))
    children = parse_flag(request.query_params.get("children"), name="children", default=False)
    session, found = await _existing(request)  # the state first: the lines read after are newer
    return JSONResponse(await read_timeline(session.store, session.id, state=found, cursor=cursor, limit=limit,
                                            children=children))


async def list_sessions(request: Request) -> Response:
    """`GET /v1/sessions?limit=N`: recent sessions with their status, newest first.

    At most `MAX_LIST_LIMIT`, their states read `LIST_STATE_CALLS` at a time. With an
    `authorize` hook, a session is listed only if the hook allows its `state`.
    """
    await check_access(request, None, "list")
    raw = request.query_params.get("limit") or "20"
    if len(raw) > 4 or not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise FxInvalidRequestError(f"limit must be an integer from 1 to 1000, got {raw[:40]!r}")
    limit = min(int(raw), MAX_LIST_LIMIT)
    listing: list[tuple[Agent, str]] = []
    for agent in _by_store(request):  # every store the app's agents use
        ids = await request.app.state.store_for(agent).list_sessions(limit)
        listing += [(agent, session_id) for session_id in ids]
    gate = asyncio.Semaphore(LIST_STATE_CALLS)

    async def listed(agent: Agent, session_id: str) -> SessionInfo | None:
        async with gate:
            if not await is_allowed(request, session_id, "state"):
                return None
            return await agent.session(session_id).state()

    states = await asyncio.gather(*(listed(agent, session_id) for agent, session_id in listing[:limit]),
                                  return_exceptions=True)
    # A session may expire between the listing and its state, or not be the caller's: leave it out.
    found = [state for state in states if isinstance(state, dict)]
    for failure in states:
        if isinstance(failure, BaseException) and not isinstance(failure, FxUnknownSessionError):
            raise failure
    return JSONResponse({"sessions": found})
