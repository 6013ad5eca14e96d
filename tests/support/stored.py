"""A session's journal records as Redis holds them, read by hand: from the log, or at rest
from `rest` (fxworker/lua/_rest.lua). For checkers that look past the store's API; the
session must not change between the two reads."""

from __future__ import annotations

from typing import Any

from fxworker.keys import SessionKeys
from fxworker.store._replies import parse_rest


def stored_records(client: Any, keys: SessionKeys) -> list[tuple[int, dict[bytes, bytes]]]:
    """The log's records (cursor, fields: `d` data, `e` writer epoch, ...) in cursor order."""
    rest = client.get(keys.rest)
    records = dict(parse_rest(rest)) if rest is not None else {}
    records.update((int(entry_id.split(b"-", 1)[0]), fields) for entry_id, fields in client.xrange(keys.log))
    return sorted(records.items())
