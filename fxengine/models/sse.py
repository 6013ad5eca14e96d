"""Picks the decoder build: compiled `_sse_c` unless absent or `FXENGINE_NO_EXTENSIONS=1`.

The compiled build reads common chunks with its exact fast scan (see `_sse_py._ChunkScan`)
and parses the rest with orjson (a C parser) when it is installed; the pure build parses
every chunk with the standard library. Both fall back to `json.loads` for anything orjson
refuses, so they decode exactly the same inputs to the same values.

    from fxengine.models.sse import ChatStreamDecoder, StreamOutcome, ToolCallOut, BUILD
"""

from __future__ import annotations

from .._build import Build, extensions_disabled

BUILD: Build

if extensions_disabled():
    from ._sse_py import ChatStreamDecoder, StreamOutcome, ToolCallOut

    BUILD = "pure"
else:
    try:
        from ._sse_c import ChatStreamDecoder, StreamOutcome, ToolCallOut  # type: ignore[no-redef, import-not-found]
    except ImportError:
        from ._sse_py import ChatStreamDecoder, StreamOutcome, ToolCallOut

        BUILD = "pure"
    else:
        BUILD = "compiled"
        from . import _sse_c

        _sse_c.set_chunk_scan(True)
        try:
            import orjson
        except ImportError:
            pass
        else:
            _sse_c.set_json_loads(orjson.loads)

__all__ = ["BUILD", "ChatStreamDecoder", "StreamOutcome", "ToolCallOut"]
