"""`TimedStore`: a store whose calls are timed in `fxworker.metrics.STORE_LATENCY`."""

from __future__ import annotations

import asyncio
from typing import Any

from .. import metrics


class TimedStore:
    """A store whose async calls are each timed in `fxworker.metrics.STORE_LATENCY` under
    their method name: the one place the core measures the store. A blocking read
    (`block_ms` set) measures a wait, not the store, and is not timed.

    Calls need no bound here: each loop's store client draws on a bounded pool that makes
    a call wait for a free connection (`FX_REDIS_MAX_CONNECTIONS`), where redis-py's
    default pool would fail it.
    """

    def __init__(self, store: Any) -> None:
        self._store = store

    def __repr__(self) -> str:
        return f"<TimedStore {self._store!r}>"

    @property
    def wrapped(self) -> Any:
        """The store whose calls this one times."""
        return self._store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("block_ms"):
                return await attr(*args, **kwargs)
            with metrics.store_timer(name):
                return await attr(*args, **kwargs)

        self.__dict__[name] = call  # built once per name: later lookups skip __getattr__
        return call
