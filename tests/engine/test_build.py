"""Guards the build: the compiled hot path must load unless the pure one was asked for."""

from __future__ import annotations

import os
import subprocess
import sys

import fxengine
from fxengine.journal import codec
from fxengine.models import sse

PURE_REQUESTED = os.environ.get("FXENGINE_NO_EXTENSIONS", "") not in ("", "0")


def test_the_expected_build_loaded() -> None:
    expected = "pure" if PURE_REQUESTED else "compiled"
    # Under `make test` the extensions were just built: a silent fallback to pure fails here.
    assert fxengine.BUILD == expected
    assert sse.BUILD == expected and codec.BUILD == expected
    module = sse.ChatStreamDecoder.__module__
    assert module == ("fxengine.models._sse_py" if PURE_REQUESTED else "fxengine.models._sse_c")
    assert codec.decode_record.__module__ == ("fxengine.journal._codec_py" if PURE_REQUESTED else "fxengine.journal._codec_c")


def test_the_environment_variable_forces_pure_at_run_time() -> None:
    script = "import fxengine, fxengine.journal.codec as c; print(fxengine.BUILD, c.BUILD)"
    env = {**os.environ, "FXENGINE_NO_EXTENSIONS": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.split() == ["pure", "pure"]
