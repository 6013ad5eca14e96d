"""What Redis holds for a session, read by hand, for checkers that look past the store's
API: its journal records (from the log, or at rest from `rest`, fxworker/lua/_rest.lua; the
session must not change between the two reads), its lines (chunks packed at rest
expanded), and any stored value as it was written before packing."""

from __future__ import annotations

from typing import Any

from fxworker.keys import SessionKeys
from fxworker.store._packed import expand, unpack_checkpoint, unpack_lines
from fxworker.store._replies import parse_rest


def stored_records(client: Any, keys: SessionKeys) -> list[tuple[int, dict[bytes, bytes]]]:
    """The log's records (cursor, fields: `d` data, `e` writer epoch, ...) in cursor order."""
    rest = client.get(keys.rest)
    records = dict(parse_rest(rest)) if rest is not None else {}
    records.update((int(entry_id.split(b"-", 1)[0]), fields) for entry_id, fields in client.xrange(keys.log))
    return sorted(records.items())


def stored_lines(client: Any, keys: SessionKeys, session_id: str, *, newest: bool = False) -> list[bytes]:
    """The session's lines as stored (JSON bytes), in cursor order; with `newest`, only the
    newest entry's (the last of them is the newest line)."""
    stored = client.xrevrange(keys.ui, count=1) if newest else client.xrange(keys.ui)
    entries = [(int(i.split(b"-", 1)[0]), f) for i, f in stored]
    # The newest entry alone: its lines are read from its first on.
    after = int(entries[0][1].get(b"f", entries[0][0])) - 1 if newest and entries else 0
    return [text for _, text in expand(session_id, entries, after)]


def unpacked(key: bytes, field: bytes, value: bytes) -> bytes:
    """A field of a stored key as written before packing at rest: a line chunk (`z` of a
    session's `ui`) as its NDJSON, a checkpoint (`data`) as its bytes, else as it is."""
    if field == b"z" and key.endswith(b":ui") and b"{" in key:
        session_id = key[key.index(b"{") + 1:key.index(b"}")].decode()
        return b"\n".join(unpack_lines(session_id, value))
    if field == b"data":
        return unpack_checkpoint(value)
    return value
