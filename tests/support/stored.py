"""A session's lines and journal records as Redis holds them, read by hand: from the streams,
or at rest from `rest` and the last line (fxworker/lua/_rest.lua). For checkers that look
past the store's API; the session must not change between the reads."""

from __future__ import annotations

from typing import Any

from fxworker.keys import SessionKeys
from fxworker.store._replies import parse_rest


def _entries(client: Any, key: str) -> list[tuple[int, dict[bytes, bytes]]]:
    return [(int(entry_id.split(b"-", 1)[0]), fields) for entry_id, fields in client.xrange(key)]


def stored_records(client: Any, keys: SessionKeys) -> list[tuple[int, dict[bytes, bytes]]]:
    """The log's records (cursor, fields: `d` data, `e` writer epoch, ...) in cursor order."""
    rest = client.get(keys.rest)
    records = dict(parse_rest(rest)[1]) if rest is not None else {}
    records.update(_entries(client, keys.log))
    return sorted(records.items())


def stored_lines(client: Any, keys: SessionKeys) -> list[tuple[int, bytes]]:
    """The UI lines (cursor, JSON text) in cursor order."""
    rest = client.get(keys.rest)
    lines = dict(parse_rest(rest, records=False)[0]) if rest is not None else {}
    lines.update((n, fields[b"l"]) for n, fields in _entries(client, keys.ui))
    return sorted(lines.items())
