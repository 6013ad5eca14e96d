"""Encoding of store arguments for the scripts and parsing of their replies.

Pure functions shared by the sync and async store: the scripts answer arrays whose first
element is a status word (`ok`, `fenced`, `in_use`, ...); a non-`ok` word becomes the
fxworker error the caller sees. Nothing here does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fxengine.codes import Code
from fxengine.errors import FxFencedError, FxLimitError
from fxengine.persistence import JournalRecord, StoredCheckpoint

from ..errors import (
    FxLeaseLostError,
    FxMessageIdInUseError,
    FxQueueFullError,
    FxSessionIncompleteError,
    FxStoreUnavailableError,
    FxUnknownSessionError,
)
from .types import (
    Accepted,
    Appended,
    Claim,
    Idle,
    InboxKind,
    Input,
    InputKind,
    Mark,
    OpenTurn,
    Released,
    SessionState,
    Unserved,
)

_KIND_CODE = {"prompt": "p", "steer": "s"}
_KIND_NAME: dict[bytes, InboxKind] = {b"p": "prompt", b"s": "steer", b"c": "cancel"}
_STATUS = {b"w": "waiting", b"r": "running", b"d": "done"}
_MARK_NAMES = ("start", "end", "yield", "accepted", "step", "done", "drop")


# One encoder for every call: `json.dumps` with options builds a new one each time.
dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def kind_code(kind: str) -> str:
    try:
        return _KIND_CODE[kind]
    except KeyError:
        raise ValueError(f"kind must be 'prompt' or 'steer', got {kind!r}") from None


def encode_line(line: Mapping[str, Any]) -> tuple[str, str]:
    """A UI line as the script takes it: its JSON without the closing brace (the script
    adds `epoch` and `cursor`), and the message id it ends when it is a `turn_end`."""
    if not isinstance(line.get("type"), str):
        raise ValueError(f"a stream line needs a string 'type', got {line!r}")
    body = {k: v for k, v in line.items() if k not in ("cursor", "epoch")}
    text = dumps(body)
    ends = str(line.get("messageId") or "") if line["type"] == "turn_end" else ""
    return text[:-1], ends


def encode_marks(marks: Sequence[Mark]) -> list[tuple[str, str]]:
    """Engine marks (`{"start": id}`, `{"end": True}`, ...) as (name, value) pairs.

    Raises:
        ValueError: a mark name the store does not know (a misspelt mark fails where it is
            written instead of vanishing).
    """
    flat: list[tuple[str, str]] = []
    for mark in marks:
        for name, value in mark.items():
            if name not in _MARK_NAMES:
                raise ValueError(f"unknown store mark {name!r} (known: {', '.join(_MARK_NAMES)})")
            flat.append((name, value if isinstance(value, str) else "1"))
    return flat


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _json_or_none(raw: bytes) -> Any:
    return json.loads(raw) if raw else None


def fenced(session_id: str, epoch: int, reply: list[Any]) -> FxLeaseLostError:
    _, head_epoch, state, expires_ms = reply
    why = "released" if state == b"released" else "expired" if head_epoch == epoch else f"epoch {head_epoch} heads it"
    return FxLeaseLostError(f"session {session_id}: epoch {epoch} no longer holds the lease ({why})")


def parse_input(fields: list[Any], *, cancel_target: str = "") -> Input:
    """One inbox entry. A field that does not decode leaves the entry `unreadable` (the
    runner ends it with an error) instead of failing the claim that already took the lease."""
    seq = int(fields[0])
    values = {fields[i]: fields[i + 1] for i in range(1, len(fields) - 1, 2)}
    message_id = _text(values.get(b"id", b""))
    decoded: dict[str, Any] = {}
    unreadable = None
    for name, field in (("input", b"in"), ("context", b"cx"), ("settings", b"st")):
        try:
            decoded[name] = _json_or_none(values.get(field, b""))
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError both are
            decoded[name] = None
            unreadable = f"its stored {name} is not valid JSON ({exc})"
    return Input(
        seq=seq,
        kind=_KIND_NAME.get(values.get(b"k", b""), "prompt"),
        message_id=message_id,
        accepted_ms=int(values.get(b"at", 0) or 0),
        cancelled=bool(cancel_target) and message_id == cancel_target,
        unreadable=unreadable,
        traceparent=_text(values[b"tp"]) if b"tp" in values else None,
        **decoded,
    )


def parse_accept(reply: list[Any], session_id: str, message_id: str, kind: InputKind) -> Accepted:
    word = reply[0]
    if word == b"ok" or word == b"repeated":
        _, agent, state, seq, end_cursor, cursor, created = reply
        # Positional: this runs once per accepted input (see Accepted for the fields).
        return Accepted(
            session_id, message_id, kind, word == b"repeated", _STATUS[state], int(cursor),  # type: ignore[arg-type]
            agent.decode() if isinstance(agent, bytes) else agent, bool(created), int(seq), int(end_cursor) or None,
        )
    if word == b"in_use":
        other = _KIND_NAME[reply[1]]
        raise FxMessageIdInUseError(f"message id {message_id!r} already names a {other} in session {session_id}")
    if word == b"unknown":
        raise FxUnknownSessionError(f"no session {session_id}")
    if word == b"incomplete":
        raise incomplete(session_id, reply[1])
    if word == b"too_large":
        raise FxLimitError(f"a steer is limited to {reply[1]} bytes of text", code=Code.LIMIT_STEER_SIZE)
    if word == b"queue_full":
        what = "steers" if reply[1] == b"count" else "bytes of queued steers"
        raise FxQueueFullError(f"session {session_id} already holds the most {what} it may queue ({reply[2]})")
    raise FxStoreUnavailableError(f"unexpected accept reply {reply!r}")


def incomplete(session_id: str, key: Any) -> FxSessionIncompleteError:
    """The refusal of a session whose `key` is gone (`_whole.lua`)."""
    return FxSessionIncompleteError(
        f"session {session_id} is incomplete: its {_text(key)} key is gone (evicted or deleted), so it is not "
        "served on what is left. Give Redis maxmemory-policy noeviction (see docs/operations.md, Running Redis)"
    )


def parse_claim(reply: list[Any], *, session_id: str, holder: str) -> Claim | Idle | Unserved | None:
    word = reply[0]
    if word == b"held":
        return None
    if word == b"idle":
        return Idle(int(reply[1]), _text(reply[2]))
    if word == b"unserved":
        return Unserved(_text(reply[1]), int(reply[2]), int(reply[3]), bool(reply[4]))
    if word == b"unknown":
        raise FxUnknownSessionError(f"no session {session_id}")
    if word == b"incomplete":
        raise incomplete(session_id, reply[1])
    (_, epoch, expires, agent, has_ckpt, ckpt_data, through, flat_records, head, waiting, turn, yielded,
     cutoffs, deaths, cancel, ui, taken, inbox, turn_input, turn_cursor, give_up) = reply
    cancel_target = _text(cancel)
    records = [
        JournalRecord(_text(flat_records[i]), bytes(flat_records[i + 1])) for i in range(0, len(flat_records), 2)
    ]
    checkpoint = StoredCheckpoint(bytes(ckpt_data), str(through)) if has_ckpt else None
    open_id = _text(turn)
    open_turn = None
    if open_id:
        open_turn = OpenTurn(
            message_id=open_id,
            yielded=bool(yielded),
            input=parse_input(turn_input, cancel_target=cancel_target) if turn_input else None,
        )
    return Claim(
        session_id=session_id,
        holder=holder,
        epoch=int(epoch),
        lease_expires_ms=int(expires),
        agent=_text(agent),
        checkpoint=checkpoint,
        records=records,
        head=str(head) if int(head) else None,
        pending=[parse_input(e, cancel_target=cancel_target) for e in waiting if e],
        open_turn=open_turn,
        cutoffs=int(cutoffs),
        deaths=int(deaths),
        cancel_requested=bool(open_id) and cancel_target == open_id,
        ui_cursor=int(ui),
        taken_over=bool(taken),
        inbox_cursor=int(inbox),
        turn_cursor=int(turn_cursor),
        give_up=bool(give_up),
    )


def parse_append(reply: list[Any], *, session_id: str, epoch: int, expected: str | None) -> Appended:
    word = reply[0]
    if word == b"ok":
        _, head, cursors, first, last, repeated = reply
        return Appended(
            records=[_text(c) for c in cursors],
            lines=list(range(int(first), int(last) + 1)),
            head=str(head) if int(head) else None,
            repeated=bool(repeated),
        )
    if word == b"fenced":
        raise fenced(session_id, epoch, reply)
    if word == b"conflict":
        head = int(reply[1]) or None
        raise FxFencedError(f"another engine appended to session {session_id}: expected {expected}, head {head}")
    raise FxStoreUnavailableError(f"unexpected append reply {reply!r}")


def parse_renew(reply: list[Any], *, session_id: str, epoch: int) -> int:
    if reply[0] == b"ok":
        return int(reply[1])
    raise fenced(session_id, epoch, reply)


def parse_release(reply: list[Any], *, session_id: str, epoch: int) -> Released:
    if reply[0] == b"ok":
        return Released(released=bool(reply[1]), cutoffs=int(reply[2]), pending=int(reply[3]))
    raise fenced(session_id, epoch, reply)


def parse_checkpoint(reply: list[Any], *, session_id: str, epoch: int) -> int:
    word = reply[0]
    if word == b"ok":
        return int(reply[2])
    if word == b"fenced":
        raise fenced(session_id, epoch, reply)
    if word == b"too_large":
        raise FxLimitError(f"a checkpoint is limited to {reply[1]} bytes", code=Code.JOURNAL_TOO_LARGE)
    if word == b"bad_through":
        raise ValueError(f"checkpoint through must lie between the stored one ({reply[2]}) and the head ({reply[1]})")
    raise FxStoreUnavailableError(f"unexpected checkpoint reply {reply!r}")


def parse_cancel(reply: list[Any], *, session_id: str) -> str | None:
    word = reply[0]
    if word == b"ok":
        return _text(reply[1])
    if word == b"unknown":
        raise FxUnknownSessionError(f"no session {session_id}")
    return None


def parse_state(
    reply: list[Any], *, session_id: str, now_ms: int, incomplete_is_none: bool = False
) -> SessionState | None:
    """A state.lua reply: None for no such session; a session with a key gone raises
    `FxSessionIncompleteError` (None with `incomplete_is_none`)."""
    if not reply:
        return None
    if reply[0] == b"incomplete":
        if incomplete_is_none:
            return None
        raise incomplete(session_id, reply[1])
    (_, agent, created_ms, ui, turns, turn, last_turn, pending, cancel, holder, epoch, expires, lease_state, head,
     _yielded, unserved_ms, unserved_next_ms) = reply
    live = lease_state == b"held" and int(expires) > now_ms
    open_turn = _text(turn) or None
    if not (open_turn or int(pending)):
        status = "idle"
    elif live:
        status = "running"
    else:
        status = "waiting"
    return SessionState(
        session_id=session_id,
        agent=_text(agent),
        status=status,  # type: ignore[arg-type]
        cursor=int(ui),
        turns=int(turns),
        epoch=int(epoch),
        open_turn=open_turn,
        pending=int(pending),
        cancel_requested=bool(open_turn) and _text(cancel) == open_turn,
        lease_holder=_text(holder) if live else None,
        lease_expires_ms=int(expires) if live else None,
        created_ms=int(created_ms),
        last_turn=_text(last_turn) or None,
        head=str(head) if int(head) else None,
        unserved_since_ms=int(unserved_ms) or None,
        unserved_next_ms=int(unserved_next_ms) or None,
    )


def parse_stream(reply: Any) -> list[tuple[int, dict[bytes, bytes]]]:
    """An XREAD reply for one stream as (N of the `N-0` id, fields)."""
    if not reply:
        return []
    if isinstance(reply, dict):  # a RESP3 client answers a map of stream -> entries
        entries = next(iter(reply.values()))
    else:
        entries = reply[0][1]
    out = []
    for entry_id, fields in entries:
        if isinstance(fields, list):
            fields = {fields[i]: fields[i + 1] for i in range(0, len(fields), 2)}
        out.append((int(_text(entry_id).split("-", 1)[0]), fields))
    return out
