"""Picks the decoder build: compiled `_sse_c` unless absent or `FXENGINE_NO_EXTENSIONS=1`.

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
        from ._sse_c import ChatStreamDecoder, StreamOutcome, ToolCallOut  # type: ignore[no-redef]
    except ImportError:
        from ._sse_py import ChatStreamDecoder, StreamOutcome, ToolCallOut

        BUILD = "pure"
    else:
        BUILD = "compiled"

__all__ = ["BUILD", "ChatStreamDecoder", "StreamOutcome", "ToolCallOut"]
