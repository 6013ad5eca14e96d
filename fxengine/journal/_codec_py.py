"""Journal record codec: ``b"FXJ" + version byte + msgpack([kind, body])``.

The single readable source; `setup.py` compiles it as `fxengine.journal._codec_c` with
the types of `_codec_c.pxd`, and `fxengine.journal.codec` picks the build. Also the
compact JSON encoder of NDJSON lines (UI streams).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import msgpack

from ..errors import FxJournalError, FxJournalVersionError

__all__ = ["JOURNAL_VERSION", "decode_record", "encode_line", "encode_record"]

JOURNAL_VERSION = 1
_MAGIC = b"FXJ"
_HEADER = b"FXJ\x01"

_json_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def encode_record(kind: str, body: Mapping[str, object]) -> bytes:
    """Encodes one journal record (kind and a msgpack-ready body) with the version header."""
    packed: bytes = msgpack.packb([kind, body], use_bin_type=True)
    return _HEADER + packed


def decode_record(data: bytes) -> tuple[str, dict[str, object]]:
    """Decodes a journal record.

    Raises:
        FxJournalVersionError: the record was written by a newer fxengine.
        FxJournalError: the bytes are not a journal record; they are attached as `.raw`.
    """
    if type(data) is not bytes:
        data = bytes(data)
    if len(data) < 4 or data[:3] != _MAGIC:
        raise _invalid("not a journal record (no FXJ header)", data)
    version = data[3]
    if version > JOURNAL_VERSION:
        error = FxJournalVersionError(
            f"journal record version {version} is newer than this fxengine reads ({JOURNAL_VERSION})"
        )
        error.raw = data  # type: ignore[attr-defined]
        raise error
    if version < 1:
        raise _invalid(f"journal record version {version} is not valid", data)
    try:
        value = msgpack.unpackb(data[4:], raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise _invalid(f"journal record body does not parse: {exc}", data) from exc
    if type(value) is not list or len(value) != 2:
        raise _invalid("journal record body is not [kind, body]", data)
    kind = value[0]
    body = value[1]
    if type(kind) is not str or type(body) is not dict:
        raise _invalid("journal record kind is not a string or its body is not a map", data)
    return kind, body


def encode_line(obj: Mapping[str, object]) -> bytes:
    """Encodes one NDJSON line: compact JSON, UTF-8, no trailing newline."""
    return _json_encoder.encode(obj).encode("utf-8")


def _invalid(message: str, data: bytes) -> FxJournalError:
    error = FxJournalError(message)
    error.raw = data  # type: ignore[attr-defined]
    return error
