"""The HTTP API of §3 as an ASGI app: `create_app(agents=..., authorize=...)`.

Needs the `web` extra: ``pip install 'fxworker[web]'``.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("fxworker.web needs the web extra: pip install 'fxworker[web]'") from exc

from .app import create_app
from .auth import ACTIONS, Authorize
from .wake import sign_wake

__all__ = ["ACTIONS", "Authorize", "create_app", "sign_wake"]
