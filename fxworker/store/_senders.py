"""The senders' operations (web processes, `Session.prompt/steer/cancel`): store an input,
name the session of a create, ask for a cancel, mark a session ready.

Each plan sits beside the parser of its replies; `SenderOperations` declares them for
`RedisStore` and `store.sync`.
"""

from __future__ import annotations

from typing import Any

from fxengine.codes import Code
from fxengine.errors import FxInputError, FxLimitError

from .. import scripts
from ..errors import FxMessageIdInUseError, FxQueueFullError, FxStoreUnavailableError, FxUnknownSessionError
from ..ids import validate_message_id, validate_session_id
from ..keys import created_session_key
from ..scripts import Command, Step
from . import _replies as r
from ._core import Op, StoreCore, one_call
from .types import (
    INPUT_MAX_BYTES,
    STEER_MAX_BYTES,
    STEER_MAX_QUEUED,
    STEER_MAX_QUEUED_BYTES,
    Accepted,
    InputKind,
)


def _accept(
    core: StoreCore, session_id: str, *, agent: str, kind: InputKind = "prompt", message_id: str, input: object,
    context: object = None, settings: object = None, now_ms: int | None = None, create: bool = True,
    traceparent: str | None = None, call_id: str = "", expired: bool = False, decision: str = "", needs: int = 0,
) -> Op[Accepted]:
    """Stores a prompt, steer or decision; returns once Redis (and the `ack` level) has it.

    A decision (`kind="decision"`, `input` ``{callId, decision, by?}``) is for `call_id`, a
    call the session's open turn waits on: one not waiting is `FX_DECISION_UNKNOWN_CALL`,
    one decided already `FX_DECISION_REPEATED`, one whose wait timed out
    `FX_DECISION_EXPIRED` (`expired=True` is that timeout's own decision); `decision`
    ("a" approve, "d" deny, "r" a result) of the wrong kind for the call is
    `FX_DECISION_INVALID`.

    The session is marked ready first, then one script checks the message id (the
    same id and kind again: `repeated=True` with the original; a steer reusing a
    prompt's id: `FxMessageIdInUseError`), enforces the steer limits
    (`FxLimitError` / `FxQueueFullError`), appends to the inbox and records the owning
    agent on first input. `create=False` refuses an unknown session
    (`FxUnknownSessionError`). `Accepted.agent` is the owner: compare it with `agent`
    to detect a forwarded session. `traceparent` (a W3C trace context) is kept with the
    input, for the worker that runs it to continue the trace. `needs`: only a process that
    reads this stored layout level runs the input (meta `newer`; a delegated turn's prompt).
    """
    keys = core.keys(session_id)
    validate_message_id(message_id)
    code = r.kind_code(kind)
    input_json = r.dumps(input)
    json_bytes = len(input_json.encode())
    if json_bytes > INPUT_MAX_BYTES:
        raise FxLimitError(f"an input is limited to {INPUT_MAX_BYTES} bytes of JSON", code=Code.LIMIT_INPUT)
    # §6 limits a steer's text, not its JSON: quotes and escapes do not count.
    steer_bytes = None
    if code == "s":
        steer_bytes = _steer_text_bytes(input, json_bytes)
    now = core.now(now_ms)
    cluster = core.cluster
    accept = scripts.accept(
        keys, kind=code, message_id=message_id, input_json=input_json,
        context_json="" if context is None else r.dumps(context),
        settings_json="" if settings is None else r.dumps(settings),
        agent=agent, now_ms=now, create=create, steer_max_bytes=STEER_MAX_BYTES,
        steer_max_count=STEER_MAX_QUEUED, steer_max_total_bytes=STEER_MAX_QUEUED_BYTES,
        ready=None if cluster else core.index, session_id=session_id, steer_bytes=steer_bytes,
        traceparent=traceparent or "", call_id=call_id, expired=expired, decision=decision, needs=needs,
    )
    # The ready mark goes first (§5): a sender that dies after the acknowledgement
    # leaves the session for the sweeper. On one server the accept script marks it
    # itself (one call, atomic); on a cluster the ready set is in another slot, so the
    # mark is a call of its own, run before the accept.
    if not cluster and core.ack == "primary":
        return Op([accept], lambda replies: _accepted(replies[0], session_id, message_id, kind))
    # With an ack level each write is followed by its wait (on a cluster, on the node
    # that took the write: `_transport._node_groups`); the mark's is sent, not required.
    steps: list[Step] = []
    if cluster:
        steps += [scripts.mark_ready(core.index, session_id=session_id, now_ms=now), *core.ack_steps()]
    at = len(steps)
    steps.append(accept)
    steps += core.ack_steps()

    def parse(replies: list[Any]) -> Accepted:
        # The ready mark's own wait is not checked: the index lives on one node, and a
        # failover there (its promoted replica has none) must not refuse every accept of
        # the cluster. A mark lost with that node is only the sweeper's net; the input
        # itself is acknowledged by a replica of its own node, and its wake is sent.
        accepted = _accepted(replies[at], session_id, message_id, kind)
        if len(replies) > at + 1:
            core.check_ack(replies[at + 1:], f"message {message_id}")
        return accepted

    return Op(steps, parse)


def _accepted(reply: list[Any], session_id: str, message_id: str, kind: InputKind) -> Accepted:
    word = reply[0]
    if word == b"ok" or word == b"repeated":
        _, agent, state, seq, end_cursor, cursor, created, wake, turn = reply
        # Positional: this runs once per accepted input (see Accepted for the fields).
        return Accepted(
            session_id, message_id, kind, word == b"repeated", r.STATUS[state], int(cursor),  # type: ignore[arg-type]
            agent.decode() if isinstance(agent, bytes) else agent, bool(created), int(seq), int(end_cursor) or None,
            bool(wake), r.text(turn) or None,
        )
    if word == b"in_use":
        other = r.KIND_NAME[reply[1]]
        raise FxMessageIdInUseError(f"message id {message_id!r} already names a {other} in session {session_id}")
    if word == b"unknown":
        raise FxUnknownSessionError(f"no session {session_id}")
    if word == b"incomplete":
        raise r.incomplete(session_id, reply[1])
    if word == b"wrong_kind":
        why = ("waits for approval: approve or deny it" if reply[1] == b"a"
               else "is an external tool's: submit its result (or deny it)")
        raise FxInputError(f"session {session_id}: that call {why} (decision {message_id})",
                           code=Code.DECISION_INVALID)
    if word in _DECISION_REFUSED:
        code, why = _DECISION_REFUSED[word]
        raise FxInputError(f"session {session_id}: {why} (decision {message_id})", code=code)
    if word == b"too_large":
        raise FxLimitError(f"a steer is limited to {reply[1]} bytes of text", code=Code.LIMIT_STEER_SIZE)
    if word == b"queue_full":
        what = "steers" if reply[1] == b"count" else "bytes of queued steers"
        raise FxQueueFullError(f"session {session_id} already holds the most {what} it may queue ({reply[2]})")
    raise FxStoreUnavailableError(f"unexpected accept reply {reply!r}")


_DECISION_REFUSED = {
    b"no_call": (Code.DECISION_UNKNOWN_CALL, "its open turn waits on no such call; read the session's pendingCalls"),
    b"decided": (Code.DECISION_REPEATED, "that call was decided already; the first decision stands"),
    b"expired": (Code.DECISION_EXPIRED, "that call's wait timed out and it was answered as denied"),
}


def _steer_text_bytes(input: object, json_bytes: int) -> int:
    """The bytes a steer counts against its limits: its text (a steer given as blocks
    counts its text blocks; its images have their own limits, checked before the store)."""
    if isinstance(input, str):
        return len(input.encode("utf-8", "surrogatepass"))
    if isinstance(input, list) and all(isinstance(b, dict) for b in input):
        return sum(len(str(b.get("text", "")).encode("utf-8", "surrogatepass")) for b in input if b.get("type") == "text")
    return json_bytes


def _session_for_message(core: StoreCore, message_id: str, session_id: str, *, scope: str = "") -> Op[str]:
    """The session a create with `message_id` names within `scope`: `session_id` if this
    call is the first.

    One `SET NX` claims `message_id` for `session_id` (with the session TTL); a later
    call with the same id gets the first call's session back, so a repeated create
    prompts that session and its `accept` answers `repeated=True`. Call it before the
    session's first `accept`: if that accept never lands, the repeat creates the session.
    """
    if scope and not scope.isalnum():
        raise ValueError(f"a message id scope is letters and digits, got {scope!r}")
    key = created_session_key(core.prefix, validate_message_id(message_id), scope)
    core.keys(session_id)  # a valid session id, or FxInvalidSessionIdError before anything is stored
    ttl = ("PX", core.ttl_ms) if core.ttl_ms else ()
    steps: list[Step] = [Command(("SET", key, session_id, "NX", *ttl), key=key), Command(("GET", key), key=key)]
    return Op(steps, lambda replies: r.text(replies[1]))


def _request_cancel(core: StoreCore, session_id: str, *, now_ms: int | None = None,
                    message_id: str | None = None) -> Op[str | None]:
    """Asks for the open turn (or, with none, the next waiting one) to be cancelled;
    with `message_id`, that prompt's turn only, while it is open or waiting.

    Returns the targeted message id, or None when nothing (or not that turn) runs or
    waits. A worker running the session sees it on `watch_inbox()`; a later claim
    reports it.
    """
    call = scripts.cancel(core.keys(session_id), now_ms=core.now(now_ms), message_id=message_id)

    def parse(replies: list[Any]) -> str | None:
        word = replies[0][0]
        if word == b"ok":
            return r.text(replies[0][1])
        if word == b"unknown":
            raise FxUnknownSessionError(f"no session {session_id}")
        return None

    return Op([call], parse)


def _mark_ready(core: StoreCore, session_id: str, *, now_ms: int | None = None) -> Op[None]:
    """Puts the session in the ready set (the sweeper's list; `accept` does it first)."""
    validate_session_id(session_id, memory=core.memory_ids)
    call = scripts.mark_ready(core.index, session_id=session_id, now_ms=core.now(now_ms))
    return Op([call], lambda replies: None)


class SenderOperations:
    """The senders' operations of `RedisStore` (awaitable) and `store.sync` (blocking)."""

    accept = one_call(_accept)
    session_for_message = one_call(_session_for_message)
    request_cancel = one_call(_request_cancel)
    mark_ready = one_call(_mark_ready)
