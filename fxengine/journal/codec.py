"""Picks the journal codec build: compiled `_codec_c` unless absent or `FXENGINE_NO_EXTENSIONS=1`.

    from fxengine.journal.codec import encode_record, decode_record, encode_line, JOURNAL_VERSION
"""

from __future__ import annotations

from .._build import Build, extensions_disabled

BUILD: Build

if extensions_disabled():
    from ._codec_py import JOURNAL_VERSION, decode_record, encode_line, encode_record

    BUILD = "pure"
else:
    try:
        from ._codec_c import JOURNAL_VERSION, decode_record, encode_line, encode_record  # type: ignore[no-redef, import-not-found]
    except ImportError:
        from ._codec_py import JOURNAL_VERSION, decode_record, encode_line, encode_record

        BUILD = "pure"
    else:
        BUILD = "compiled"

__all__ = ["BUILD", "JOURNAL_VERSION", "decode_record", "encode_line", "encode_record"]
