"""The embedded store: the same Redis code and Lua scripts, on fakeredis in this process.

The default when `REDIS_URL` is not set, for development and tests: no server to run,
and nothing survives the process. Every embedded store built without an explicit
`server` shares one process-wide fake server, so a web app and a worker loop in one
process see the same sessions. Scripts run on Lua 5.1 through lupa, as on Redis.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType

from ..errors import FxConfigError
from ._core import StoreCore
from .redis import RedisStore

_shared: object | None = None  # a fakeredis.FakeServer
_shared_lock = threading.Lock()


def _fakeredis() -> ModuleType:
    try:
        import fakeredis
        import lupa  # noqa: F401  (fakeredis runs Lua through it)
    except ImportError as exc:
        raise FxConfigError(
            "the embedded store needs fakeredis with Lua: pip install 'fxworker[embedded]'"
        ) from exc
    return fakeredis


def shared_server() -> object:
    """The process-wide fake Redis server of the embedded store."""
    global _shared
    fakeredis = _fakeredis()
    with _shared_lock:
        if _shared is None:
            _shared = fakeredis.FakeServer(version=(7, 2))
        return _shared


def new_server() -> object:
    """A fresh, private fake Redis server."""
    return _fakeredis().FakeServer(version=(7, 2))


def embedded_store(
    *,
    prefix: str = "fx",
    server: object | None = None,
    memory_ids: bool = False,
    session_ttl_s: float | None = None,
    clock: Callable[[], int] | None = None,
    kind: str = "embedded",
) -> RedisStore:
    """A `RedisStore` on fakeredis (`server`: a `fakeredis.FakeServer`, default the shared one)."""
    fakeredis = _fakeredis()
    server = server if server is not None else shared_server()
    core = StoreCore(prefix=prefix, memory_ids=memory_ids, session_ttl_s=session_ttl_s, clock=clock)
    return RedisStore(
        core,
        make_async_client=lambda: fakeredis.FakeAsyncRedis(server=server),
        make_sync_client=lambda: fakeredis.FakeRedis(server=server),
        kind=kind,
    )
