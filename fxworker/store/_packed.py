"""What a session at rest keeps compressed: its checkpoint and its finished lines
(docs/design.md §5 "Packed at rest").

Redis's Lua has no compression, so the worker compresses and the store reads back:

- **A checkpoint** is stored as `CHECKPOINT_MAGIC` + its raw-deflate bytes + the CRC-32 of
  the data (4 bytes, big-endian) when that is smaller; `unpack_checkpoint` reads either
  form, so values stored before stay readable. Data that itself begins with the magic is
  always wrapped, so the two never mix up. A reader checks that the deflate stream ended
  and the CRC-32 after it (a value of the previous release ends with the stream: nothing
  to check); any damage is `FxJournalError` (FX_JOURNAL_INVALID), never other data. The
  trailer sits after the stream's end, where the previous release's reader never looks.
- **Lines.** The call whose end record lets the session go (`append(release=True)`) also
  sends the lines its writer stored under the claim, as chunks: one entry of the `ui`
  stream per chunk, id `<last>-0`, fields `f` (its first cursor) and `z` (`LINES_FORMAT`
  + the raw deflate of its lines as NDJSON, exactly as stored, against a preset
  dictionary of common line text and the session id), and the checksum of its NDJSON
  that append.lua checked against the entries it replaces before it replaced them: `s`
  (SHA-1 hex, Redis) or `a` (Adler-32, decimal: the embedded store's Lua has no SHA-1).
  A chunk of the previous release has neither; it gets every other check. An XREAD after
  a cursor inside a chunk returns the chunk (its id is above the cursor); `expand` turns
  entries back into lines and keeps those after the cursor.

A reader checks what it expands (`expand`): the format byte (a newer one is
`FxJournalVersionError`, FX_JOURNAL_VERSION: a newer fxworker wrote it), that the deflate
stream ended with nothing after it, the checksum, that each line is a JSON object with
its cursor, and that cursors run on with no gap across entries and chunks. Any damage is
`FxSessionIncompleteError` (FX_SESSION_INCOMPLETE), never other lines.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from fxengine.errors import FxJournalError, FxJournalVersionError

from ..errors import FxSessionIncompleteError

CHECKPOINT_MAGIC = b"FXZ\x01"
# Version byte of a packed chunk's `z` field: raw deflate against `_dictionary(session)`.
# The checksum fields came later beside it, on the entry: a reader of the previous release
# ignores them and reads these chunks as before. A writer that changes what `z` holds
# sends a new byte, which this reader refuses as newer rather than misreads.
LINES_FORMAT = b"\x01"
_CRC_BYTES = 4  # the checkpoint's trailer
# A chunk holds at most this many lines and about this many bytes of them, so a reader
# that resumes inside one expands a bounded page (`_readers.READ_PAGE_LINES` lines).
CHUNK_MAX_LINES = 128
CHUNK_MAX_BYTES = 64 * 1024

# Deflate settings: an 8 KiB window and a small hash table cost a third of zlib's defaults
# to set up and compress these small values as well (bench/cost.py prints the sizes).
_LEVEL = 6
_MEM_LEVEL = 4
_SMALL_WBITS = -13  # an 8 KiB window: lines, and checkpoints no larger than it
_SMALL_BYTES = 8192
_WBITS = -15  # zlib's 32 KiB window: larger checkpoints (any window reads back with it)
_CHECKPOINT_MIN_BYTES = 128  # smaller values are stored as they are

# Line text most chunks repeat (format 1: never change it, add a format instead). The
# most common comes last: deflate reaches it with the shortest distances.
_DICTIONARY_HEAD = (
    b'{"type":"tool_end","id":"call_","name":"","isError":false,"content":"","messageId":"msg_","epoch":1,"cursor":1}\n'
    b'{"type":"reasoning_delta","delta":"","step":1,"messageId":"msg_","epoch":1,"cursor":1}\n'
    b'{"type":"turn_end","messageId":"msg_","stopReason":"end_turn","usage":{"inputTokens":0,"outputTokens":0},'
    b'"epoch":1,"cursor":1}\n'
    b'{"type":"tool_start","id":"call_","name":"","input":{},"step":1,"messageId":"msg_","epoch":1,"cursor":1}\n'
    b'{"type":"text_delta","delta":"","step":1,"messageId":"msg_","epoch":1,"cursor":1}\n'
    b'{"type":"turn_start","messageId":"msg_","sessionId":"'
)
_DICTIONARY_TAIL = b'","input":"","epoch":1,"cursor":1}\n'


def pack_checkpoint(data: bytes) -> bytes:
    """A checkpoint's stored form: compressed behind `CHECKPOINT_MAGIC` when that is smaller."""
    wrap = data.startswith(CHECKPOINT_MAGIC)
    if len(data) < _CHECKPOINT_MIN_BYTES and not wrap:
        return data
    # A window no larger than the data sets up faster.
    packer = zlib.compressobj(_LEVEL, zlib.DEFLATED, _SMALL_WBITS if len(data) <= _SMALL_BYTES else _WBITS, _MEM_LEVEL)
    packed = CHECKPOINT_MAGIC + packer.compress(data) + packer.flush() + zlib.crc32(data).to_bytes(_CRC_BYTES, "big")
    return packed if wrap or len(packed) < len(data) else data


def unpack_checkpoint(stored: bytes, *, session_id: str = "") -> bytes:
    """A checkpoint as it was given to `pack_checkpoint` (or stored before packing was).

    Raises:
        FxJournalError: the stored value is damaged (a cut or changed deflate stream, a
            CRC-32 that does not match): FX_JOURNAL_INVALID, never other data.
    """
    if not stored.startswith(CHECKPOINT_MAGIC):
        return stored
    unpacker = zlib.decompressobj(wbits=_WBITS)
    try:
        data = unpacker.decompress(stored[len(CHECKPOINT_MAGIC):])
    except zlib.error as exc:
        raise _bad_checkpoint(session_id, f"its deflate stream does not decode ({exc})") from exc
    if not unpacker.eof:
        raise _bad_checkpoint(session_id, "its deflate stream is cut short")
    trailer = unpacker.unused_data
    if trailer and (len(trailer) != _CRC_BYTES or int.from_bytes(trailer, "big") != zlib.crc32(data)):
        raise _bad_checkpoint(session_id, "its CRC-32 does not match")
    return data


def _bad_checkpoint(session_id: str, why: str) -> FxJournalError:
    whose = f" of session {session_id}" if session_id else ""
    return FxJournalError(f"the stored checkpoint{whose} is damaged: {why}; it is not read as other data")


def _dictionary(session_id: str) -> bytes:
    return _DICTIONARY_HEAD + session_id.encode() + _DICTIONARY_TAIL


def stored_line(text: str, epoch: int, cursor: int) -> bytes:
    """A line exactly as append.lua stores it from its text without the closing brace."""
    return f'{text},"epoch":{epoch},"cursor":{cursor}}}'.encode()


def pack_lines(session_id: str, epoch: int, first: int, texts: Sequence[str]) -> list[bytes]:
    """Chunks of lines `first`.. (texts as append.lua takes them, all stored under `epoch`)
    as `pack` store marks: `<first>:<last>:<sha1 hex>:<adler32>:<z>` (checksums of the
    chunk's NDJSON, which append.lua checks against the entries it replaces; Adler-32
    where the Lua has no SHA-1, the embedded store's)."""
    marks: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    start = first
    zdict = _dictionary(session_id)

    def close() -> None:
        ndjson = b"\n".join(chunk)
        packer = zlib.compressobj(_LEVEL, zlib.DEFLATED, _SMALL_WBITS, _MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, zdict)
        z = LINES_FORMAT + packer.compress(ndjson) + packer.flush()
        last = start + len(chunk) - 1
        marks.append(f"{start}:{last}:{hashlib.sha1(ndjson).hexdigest()}:{zlib.adler32(ndjson)}:".encode() + z)

    for i, text in enumerate(texts):
        line = stored_line(text, epoch, first + i)
        if chunk and (len(chunk) >= CHUNK_MAX_LINES or size + len(line) > CHUNK_MAX_BYTES):
            close()
            start, chunk, size = first + i, [], 0
        chunk.append(line)
        size += len(line) + 1
    if chunk:
        close()
    return marks


def damaged(session_id: str, why: str) -> FxSessionIncompleteError:
    """The refusal of a session whose stored lines are damaged or missing."""
    return FxSessionIncompleteError(
        f"session {session_id} is incomplete: {why}, so its lines are not served from what is left"
    )


def _inflate(session_id: str, z: bytes, where: str) -> bytes:
    """A chunk's NDJSON from its `z` field: the format byte, then a deflate stream that ends
    exactly where the field does."""
    if z[:1] != LINES_FORMAT:
        if z[:1] > LINES_FORMAT:
            raise FxJournalVersionError(
                f"the line chunk {where} of session {session_id} has format {z[:1]!r}, newer than this "
                f"fxworker reads ({LINES_FORMAT!r}): it was written by a newer fxworker; upgrade this process"
            )
        raise damaged(session_id, f"the line chunk {where} has no known format ({z[:1]!r})")
    unpacker = zlib.decompressobj(wbits=_WBITS, zdict=_dictionary(session_id))
    try:
        ndjson = unpacker.decompress(z[1:])
    except zlib.error as exc:
        raise damaged(session_id, f"the line chunk {where} does not decode ({exc})") from exc
    if not unpacker.eof:
        raise damaged(session_id, f"the line chunk {where} is cut short")
    if unpacker.unused_data:
        raise damaged(session_id, f"the line chunk {where} has {len(unpacker.unused_data)} bytes after its end")
    return ndjson


def unpack_lines(session_id: str, z: bytes) -> list[bytes]:
    """A chunk's lines (its `z` field), in cursor order, with the checks its bytes allow
    alone (`unpack_chunk` checks the rest)."""
    return _inflate(session_id, z, "").split(b"\n")


def _loads(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:  # what orjson refuses that json reads: an integer past 64 bits
        return json.loads(line)


def unpack_chunk(session_id: str, first: int, last: int, fields: Mapping[bytes, Any]) -> list[bytes]:
    """The lines `first`..`last` of a chunk entry (`<last>-0`), checked: its `z` decodes
    whole, its NDJSON has the entry's checksum (`s` SHA-1 or `a` Adler-32; a chunk of the
    previous release has none), and each line is a JSON object with its own cursor.
    `FxSessionIncompleteError` for any damage."""
    where = f"{first}..{last}"
    ndjson = _inflate(session_id, bytes(fields.get(b"z", b"")), where)
    sha1, adler32 = fields.get(b"s"), fields.get(b"a")
    if sha1 is not None and hashlib.sha1(ndjson).hexdigest().encode() != bytes(sha1):
        raise damaged(session_id, f"the line chunk {where} does not match its SHA-1")
    if adler32 is not None and str(zlib.adler32(ndjson)).encode() != bytes(adler32):
        raise damaged(session_id, f"the line chunk {where} does not match its Adler-32")
    lines = ndjson.split(b"\n")
    if len(lines) != last - first + 1:
        raise damaged(session_id, f"the line chunk {where} holds {len(lines)} lines")
    for cursor, line in enumerate(lines, first):
        try:
            value = _loads(line)
        except ValueError:
            value = None
        if not isinstance(value, dict) or value.get("cursor") != cursor:
            raise damaged(session_id, f"line {cursor} of the line chunk {where} is not that line")
    return lines


def expand(
    session_id: str, entries: Iterable[tuple[int, Mapping[bytes, Any]]], after: int, limit: int | None = None
) -> list[tuple[int, bytes]]:
    """The lines of `ui` stream entries (id N of `N-0`, fields), a line's own or a chunk's,
    as (cursor, JSON bytes) after cursor `after`; at most `limit` of them.

    `entries` are those after `after` in id order (an XREAD's): the first holds line
    `after + 1` and each next one begins where the last ended. A gap (an entry or chunk
    missing) or a damaged chunk is `FxSessionIncompleteError`."""
    lines: list[tuple[int, bytes]] = []
    expected = after + 1
    for i, (n, fields) in enumerate(entries):
        text = fields.get(b"l")
        try:
            first = n if text is not None else int(fields[b"f"])
        except (KeyError, ValueError):
            raise damaged(session_id, f"its entry {n} is neither a line nor a line chunk") from None
        # The first entry may be a chunk the cursor lies inside; each later one starts
        # where the one before ended.
        if first > expected:
            raise damaged(session_id, f"its lines {expected}..{first - 1} are missing")
        if n < expected or (i and first != expected):
            raise damaged(session_id, f"its entry {n} overlaps the lines before it")
        if text is not None:
            lines.append((n, bytes(text)))
        else:
            lines.extend((c, line) for c, line in enumerate(unpack_chunk(session_id, first, n, fields), first)
                         if c > after)
        expected = n + 1
        if limit is not None and len(lines) >= limit:
            return lines[:limit]
    return lines
