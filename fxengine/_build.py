"""Which build of fxengine's hot path loaded: `compiled` (Cython) or `pure` (Python).

`FXENGINE_NO_EXTENSIONS=1` forces the pure build at run time (and skips compiling at
build time, see setup.py). It is read here and nowhere else.
"""

from __future__ import annotations

import os
from typing import Literal

Build = Literal["compiled", "pure"]


def extensions_disabled() -> bool:
    """True when `FXENGINE_NO_EXTENSIONS` asks for the pure-Python build."""
    return os.environ.get("FXENGINE_NO_EXTENSIONS", "") not in ("", "0")
