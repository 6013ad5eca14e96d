"""What a session at rest keeps compressed: its checkpoint and its finished lines
(docs/design.md §5 "Packed at rest").

Redis's Lua has no compression, so the worker compresses and the store reads back:

- **A checkpoint** is stored as `CHECKPOINT_MAGIC` + its raw-deflate bytes when that is
  smaller; `unpack_checkpoint` reads either form, so values stored before stay readable.
  Data that itself begins with the magic is always wrapped, so the two never mix up.
- **Lines.** The call whose end record lets the session go (`append(release=True)`) also
  sends the lines its writer stored under the claim, as chunks: one entry of the `ui`
  stream per chunk, id `<last>-0`, fields `f` (its first cursor) and `z` (`LINES_FORMAT`
  + the raw deflate of its lines as NDJSON, exactly as stored, against a preset
  dictionary of common line text and the session id). append.lua checks each chunk's
  SHA-1 against the entries it replaces before it replaces them. An XREAD after a cursor
  inside a chunk returns the chunk (its id is above the cursor); `expand` turns entries
  back into lines and keeps those after the cursor.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Sequence

CHECKPOINT_MAGIC = b"FXZ\x01"
# Version byte of a packed chunk's `z` field: raw deflate against `_dictionary(session)`.
LINES_FORMAT = b"\x01"
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
    packed = CHECKPOINT_MAGIC + packer.compress(data) + packer.flush()
    return packed if wrap or len(packed) < len(data) else data


def unpack_checkpoint(stored: bytes) -> bytes:
    """A checkpoint as it was given to `pack_checkpoint` (or stored before packing was)."""
    if not stored.startswith(CHECKPOINT_MAGIC):
        return stored
    return zlib.decompress(stored[len(CHECKPOINT_MAGIC):], wbits=_WBITS)


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


def unpack_lines(session_id: str, z: bytes) -> list[bytes]:
    """A chunk's lines (its `z` field), in cursor order."""
    if z[:1] != LINES_FORMAT:
        raise ValueError(f"a packed line chunk of session {session_id} has unknown format {z[:1]!r}")
    unpacker = zlib.decompressobj(wbits=_WBITS, zdict=_dictionary(session_id))
    return (unpacker.decompress(z[1:]) + unpacker.flush()).split(b"\n")


def expand(
    session_id: str, entries: Iterable[tuple[int, dict[bytes, bytes]]], after: int, limit: int | None = None
) -> list[tuple[int, bytes]]:
    """The lines of `ui` stream entries (id N of `N-0`, fields), a line's own or a chunk's,
    as (cursor, JSON bytes) after cursor `after`; at most `limit` of them."""
    lines: list[tuple[int, bytes]] = []
    for n, fields in entries:
        text = fields.get(b"l")
        if text is not None:
            lines.append((n, bytes(text)))
        else:
            first = int(fields[b"f"])
            lines.extend((c, line) for c, line in enumerate(unpack_lines(session_id, bytes(fields[b"z"])), first)
                         if c > after)
        if limit is not None and len(lines) >= limit:
            return lines[:limit]
    return lines
