"""The readers' operations: a session's lines, state and conversation, the session index,
and the sweeper's look at the ready set.

Each plan sits beside the parser of its replies; `ReaderOperations` declares them for
`RedisStore` and `store.sync`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fxengine.persistence import JournalRecord, Loaded, StoredCheckpoint

from .. import scripts
from ..errors import FxInvalidCursorError, FxUnknownSessionError
from ..scripts import Command, Step
from . import _packed
from . import _replies as r
from ._core import Op, Plan, StoreCore, one_call, several_calls
from .types import ReadySession, SessionState

# The most UI lines one read returns unless its caller asks for a count: a follower of a
# long session pages through it (and a slow client holds one page, not the session).
READ_PAGE_LINES = 128
# Stream ids are `<uint64>-<uint64>`: a cursor past this is no id Redis can read after.
MAX_CURSOR = 2**64 - 1


def _read_raw_lines(
    core: StoreCore, session_id: str, cursor: int = 0, *, block_ms: int | None = None, count: int | None = None
) -> Op[list[tuple[int, bytes]]]:
    """UI lines after `cursor` as (cursor, JSON bytes): one XREAD from `cursor-0`.

    At most `count` lines a call (default `READ_PAGE_LINES`): a reader of a long session
    pages through it from its last cursor instead of loading it whole. With `block_ms`
    it waits (at most the store's `max_block_ms`) for a first line. Cursors are
    contiguous, so a reader resuming from any cursor sees each line once, whether they are
    stored one per entry or packed at rest (`_packed.expand`). A cursor
    past the stream's id space (2^64 - 1) is `FxInvalidCursorError`.

    Lines are checked as they are read: a damaged chunk, or a line missing between the
    cursor and the last one the session counted before the read, is
    `FxSessionIncompleteError` (never other lines); a chunk of a newer format is
    `FxJournalVersionError`.
    """
    if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
        raise FxInvalidCursorError(f"a stream cursor must be a non-negative integer, got {cursor!r}")
    if cursor > MAX_CURSOR:
        raise FxInvalidCursorError(f"a stream cursor is at most {MAX_CURSOR} (2^64 - 1), got one of {cursor.bit_length()} bits")
    count = READ_PAGE_LINES if count is None else count
    keys = core.keys(session_id)
    # Under FX_ACK=replica (or aof) the read waits for the ack level to hold its lines.
    # The session's last line cursor, read before the lines (scripts write both at once):
    # every line through it is in the stream when the XREAD runs, so a tail cut off the
    # stream (a last chunk or entry gone) is seen too, not only a gap.
    steps: list[Step] = [Command(("HGET", keys.meta, "ui"), key=keys.meta),
                         core.xread(keys.ui, cursor, block_ms=block_ms, count=count),
                         *core.read_ack_steps(keys, cursor)]

    def parse(replies: list[Any]) -> list[tuple[int, bytes]]:
        # A chunk of lines packed at rest comes whole: the lines after the cursor are kept.
        lines = _packed.expand(session_id, r.parse_stream(replies[1]), cursor, count)
        counted = min(int(replies[0] or 0), cursor + count)
        if (lines[-1][0] if lines else cursor) < counted:
            got = lines[-1][0] if lines else cursor
            raise _packed.damaged(session_id, f"its lines {got + 1}..{counted} are missing")
        if lines and len(replies) > 3:
            core.check_ack(replies[3:], f"the lines of session {session_id} after cursor {cursor}",
                           then=f"read again from cursor {cursor}")
        return lines

    return Op(steps, parse, read=True, blocks=bool(block_ms))


def _read_lines(
    core: StoreCore, session_id: str, cursor: int = 0, *, block_ms: int | None = None, count: int | None = None
) -> Plan[list[dict[str, Any]]]:
    """UI lines after `cursor` as dicts, each with its `cursor` and writer `epoch`."""
    raw = yield _read_raw_lines(core, session_id, cursor, block_ms=block_ms, count=count)
    return [json.loads(text) for _, text in raw]


def _state(core: StoreCore, session_id: str, *, now_ms: int | None = None) -> Op[SessionState]:
    """Agent, status (idle / waiting / running), last cursor, turns, epoch; `FxUnknownSessionError` if none."""
    now = core.now(now_ms)

    def parse(replies: list[Any]) -> SessionState:
        state = _session_state(replies[0], session_id=session_id, now_ms=now)
        if state is None:
            raise FxUnknownSessionError(f"no session {session_id}")
        return state

    return Op([scripts.state(core.keys(session_id))], parse, read=True)


def _states(core: StoreCore, session_ids: Sequence[str], *, now_ms: int | None = None) -> Op[list[SessionState | None]]:
    """`state()` of each session, in one round trip (None for one the store does not know)."""
    now = core.now(now_ms)
    sids = list(session_ids)
    steps: list[Step] = [scripts.state(core.keys(sid)) for sid in sids]
    return Op(
        steps,
        # A session with a key gone is None here, as one that is gone whole: nothing to wake
        # or list (state() of it alone raises FxSessionIncompleteError).
        lambda replies: [_session_state(rep, session_id=sid, now_ms=now, incomplete_is_none=True)
                         for sid, rep in zip(sids, replies)],
        read=True,
    )


def _session_state(
    reply: list[Any], *, session_id: str, now_ms: int, incomplete_is_none: bool = False
) -> SessionState | None:
    """A state.lua reply: None for no such session; a session with a key gone raises
    `FxSessionIncompleteError` (None with `incomplete_is_none`)."""
    if not reply:
        return None
    if reply[0] == b"incomplete":
        if incomplete_is_none:
            return None
        raise r.incomplete(session_id, reply[1])
    (_, agent, created_ms, ui, turns, turn, last_turn, pending, cancel, holder, epoch, expires, lease_state, head,
     _yielded, unserved_ms, unserved_next_ms, woken_ms, newer, paused_calls, decisions) = reply
    live = lease_state == b"held" and int(expires) > now_ms
    open_turn = r.text(turn) or None
    cancel_requested = bool(open_turn) and r.text(cancel) == open_turn
    # Stored `\n`-framed, each `a:<id>` or `e:<id>` (append.lua's `pause` mark).
    paused = tuple(call[2:] for call in r.text(paused_calls).split("\n")[1:-1])
    if not (open_turn or int(pending)):
        status = "idle"
    elif live:
        status = "running"
    elif paused and not int(decisions) and not cancel_requested:
        status = "paused"
    else:
        status = "waiting"
    return SessionState(
        session_id=session_id,
        agent=r.text(agent),
        status=status,  # type: ignore[arg-type]
        cursor=int(ui),
        turns=int(turns),
        epoch=int(epoch),
        open_turn=open_turn,
        pending=int(pending),
        cancel_requested=cancel_requested,
        lease_holder=r.text(holder) if live else None,
        lease_expires_ms=int(expires) if live else None,
        created_ms=int(created_ms),
        last_turn=r.text(last_turn) or None,
        head=str(head) if int(head) else None,
        unserved_since_ms=int(unserved_ms) or None,
        unserved_next_ms=int(unserved_next_ms) or None,
        woken_ms=int(woken_ms) or None,
        newer=int(newer) or None,
        paused_calls=paused,
        decisions=int(decisions),
    )


def _load(core: StoreCore, session_id: str) -> Op[Loaded]:
    """The session's checkpoint and the log records after it (what a claim loads), read
    without a lease: `session.checkpoint()` exports from it. `FxUnknownSessionError` if none.

    One atomic read (load.lua): the checkpoint, the log and, at rest, `rest` that holds the
    log; records the checkpoint covers are dropped here.
    """

    def parse(replies: list[Any]) -> Loaded:
        if not replies[0]:
            raise FxUnknownSessionError(f"no session {session_id}")
        _agent, data, through, entries, rest = replies[0]
        covered = int(through) if through is not None else 0
        checkpoint = (StoredCheckpoint(_packed.unpack_checkpoint(bytes(data or b""), session_id=session_id),
                                        str(covered))
                      if through is not None else None)
        stored = r.parse_rest(bytes(rest)) if rest is not None else []
        for entry_id, fields in entries or ():
            if isinstance(fields, list):
                fields = {fields[i]: fields[i + 1] for i in range(0, len(fields), 2)}
            stored.append((int(r.text(entry_id).split("-", 1)[0]), fields))
        records = [JournalRecord(str(cursor), bytes(fields.get(b"d", b""))) for cursor, fields in stored
                   if cursor > covered]
        head = records[-1].cursor if records else (checkpoint.through if checkpoint and covered else None)
        return Loaded(checkpoint=checkpoint, journal=records, head=head)

    return Op([scripts.load(core.keys(session_id))], parse, read=True)


def _index(key: str, limit: int, *, newest_first: bool) -> Op[list[tuple[str, int]]]:
    """Members of a sorted-set index with their scores (ms)."""
    command = "ZREVRANGE" if newest_first else "ZRANGE"
    step = Command((command, key, 0, max(0, int(limit) - 1), "WITHSCORES"), key=key)

    def parse(replies: list[Any]) -> list[tuple[str, int]]:
        flat = replies[0]
        if flat and isinstance(flat[0], (list, tuple)):
            return [(r.text(m), int(float(s))) for m, s in flat]
        return [(r.text(flat[i]), int(float(flat[i + 1]))) for i in range(0, len(flat), 2)]

    return Op([step], parse, read=True)


def _clear(core: StoreCore, session_ids: Sequence[str], *, older_than_ms: int, forget: Sequence[bool]) -> Op[list[bool]]:
    steps: list[Step] = [
        scripts.clear_ready(core.index, session_id=sid, older_than_ms=older_than_ms, forget=f)
        for sid, f in zip(session_ids, forget)
    ]
    return Op(steps, lambda replies: [bool(x) for x in replies])


def _list_sessions(core: StoreCore, limit: int = 100) -> Plan[list[str]]:
    """Ids of the newest sessions the store still holds, newest first."""
    ids = [sid for sid, _ in (yield _index(core.index.sessions, limit, newest_first=True))]
    if not ids:
        return []
    states = yield _states(core, ids)
    return [sid for sid, st in zip(ids, states) if st is not None]


def _clear_ready(
    core: StoreCore, session_id: str, *, now_ms: int | None = None, grace_ms: int | None = None
) -> Plan[bool]:
    """Removes the session from the ready set when nothing is pending or open and its
    mark is older than `grace_ms` (an accept may still be landing; default: 5 s on one
    server, where the accept makes the mark itself, 30 s on a cluster). True if removed."""
    now = core.now(now_ms)
    state = (yield _states(core, [session_id], now_ms=now))[0]
    if state is not None and state.has_work:
        return False
    cleared = yield _clear(core, [session_id], older_than_ms=now - core.grace(grace_ms), forget=[state is None])
    return bool(cleared[0])


def _ready_sessions(
    core: StoreCore, *, now_ms: int | None = None, limit: int = 1000, grace_ms: int | None = None,
    include_held: bool = False,
) -> Plan[list[ReadySession]]:
    """Sessions to wake: in the ready set, work pending or open, and no live lease
    (with `include_held`, also those a live lease holds: reason `held`).

    Also prunes marks of sessions with nothing to do once they are older than `grace_ms`.
    """
    now = core.now(now_ms)
    marked = yield _index(core.index.ready, limit, newest_first=False)
    ids = [sid for sid, _ in marked]
    states = (yield _states(core, ids, now_ms=now)) if ids else []
    idle = [(sid, st is None) for sid, st in zip(ids, states) if st is None or not st.has_work]
    if idle:
        yield _clear(core, [s for s, _ in idle], older_than_ms=now - core.grace(grace_ms), forget=[f for _, f in idle])
    return _ready_from(marked, states, include_held=include_held)


def _ready_from(
    marked: Sequence[tuple[str, int]], states: list[SessionState | None], *, include_held: bool = False
) -> list[ReadySession]:
    ready = []
    for (sid, marked_ms), state in zip(marked, states):
        if state is None or not state.has_work:
            continue
        if state.status == "waiting":
            reason = "open_turn" if state.open_turn else "pending"
            ready.append(ReadySession(sid, state.agent, reason, marked_ms,  # type: ignore[arg-type]
                                      unserved_next_ms=state.unserved_next_ms, woken_ms=state.woken_ms,
                                      newer=state.newer))
        elif include_held:
            ready.append(ReadySession(sid, state.agent, "held", marked_ms, state.lease_expires_ms))
    return ready


class ReaderOperations:
    """The readers' operations of `RedisStore` (awaitable) and `store.sync` (blocking)."""

    read_raw_lines = one_call(_read_raw_lines)
    read_lines = several_calls(_read_lines)
    state = one_call(_state)
    states = one_call(_states)
    load = one_call(_load)
    list_sessions = several_calls(_list_sessions)
    clear_ready = several_calls(_clear_ready)
    ready_sessions = several_calls(_ready_sessions)
