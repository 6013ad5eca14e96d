"""What every operation's plan shares: the encoding of lines, marks and JSON for the
scripts, and the reading of the reply parts several operations meet (inbox entries,
stream entries, the refusals of a fenced or incomplete session).

Each operation's own parser sits beside its plan (`_senders`, `_workers`, `_readers`):
the scripts answer arrays whose first element is a status word (`ok`, `fenced`,
`in_use`, ...), and a non-`ok` word becomes the fxworker error the caller sees. Nothing
here does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from fxengine.lines import MARK_NAMES, TURN_ENDS

from ..errors import FxLeaseLostError, FxSessionIncompleteError
from .types import InboxKind, Input, Mark

_KIND_CODE = {"prompt": "p", "steer": "s", "decision": "d"}
KIND_NAME: dict[bytes, InboxKind] = {b"p": "prompt", b"s": "steer", b"d": "decision", b"c": "cancel"}
STATUS = {b"w": "waiting", b"r": "running", b"d": "done"}


# One encoder for every call: `json.dumps` with options builds a new one each time.
_std_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def dumps(value: object) -> str:
    """Compact JSON, non-ASCII kept: orjson's (a tenth of the standard library's time for a
    line), the standard library's for what orjson refuses (an integer past 64 bits, a key
    that is not a string, a lone surrogate)."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return _std_dumps(value)


def kind_code(kind: str) -> str:
    try:
        return _KIND_CODE[kind]
    except KeyError:
        raise ValueError(f"kind must be 'prompt', 'steer' or 'decision', got {kind!r}") from None


def encode_line(line: Mapping[str, object]) -> tuple[str, str]:
    """A UI line as the script takes it: its JSON without the closing brace (the script
    adds `epoch` and `cursor`), and the message id it ends when it is a `turn_end`."""
    if not isinstance(line.get("type"), str):
        raise ValueError(f"a stream line needs a string 'type', got {line!r}")
    body = {k: v for k, v in line.items() if k not in ("cursor", "epoch")}
    text = dumps(body)
    ends = str(line.get("messageId") or "") if line["type"] in TURN_ENDS else ""
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
            if name not in MARK_NAMES:
                raise ValueError(f"unknown store mark {name!r} (known: {', '.join(MARK_NAMES)})")
            flat.append((name, value if isinstance(value, str) else "1"))
    return flat


def text(value: bytes | str) -> str:
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
    message_id = text(values.get(b"id", b""))
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
        kind=KIND_NAME.get(values.get(b"k", b""), "prompt"),
        message_id=message_id,
        accepted_ms=int(values.get(b"at", 0) or 0),
        cancelled=bool(cancel_target) and message_id == cancel_target,
        unreadable=unreadable,
        traceparent=text(values[b"tp"]) if b"tp" in values else None,
        **decoded,
    )


def incomplete(session_id: str, key: bytes | str) -> FxSessionIncompleteError:
    """The refusal of a session whose `key` is gone (`_whole.lua`)."""
    return FxSessionIncompleteError(
        f"session {session_id} is incomplete: its {text(key)} key is gone (evicted or deleted), so it is not "
        "served on what is left. Give Redis maxmemory-policy noeviction (see docs/operations.md, Running Redis)"
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
        out.append((int(text(entry_id).split("-", 1)[0]), fields))
    return out


def parse_rest(blob: bytes) -> list[tuple[int, dict[bytes, bytes]]]:
    """A session's `rest` value (lua/_rest.lua): its log's records as (cursor, fields `d`
    data and `e` writer epoch), in cursor order; a parked turn's input kept there is skipped."""
    records = []
    pos, end = 0, len(blob)
    while pos < end:
        values = []
        for _ in range(3):
            colon = blob.index(b":", pos)
            stop = colon + 1 + int(blob[pos:colon])
            values.append(blob[colon + 1:stop])
            pos = stop
        if values[0].isdigit():  # not a parked turn's input (`i<seq>`), kept with the records
            records.append((int(values[0]), {b"d": values[1], b"e": values[2]}))
    return records
