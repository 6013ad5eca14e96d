"""The memory store: one process's private sessions, for tests and single-process tools.

It is the embedded store on a fresh fake server of its own (the same Redis code and Lua,
not a second implementation), with the looser id rule of §2: any 1-128 of
`A-Z a-z 0-9 . _ -` names a session. Nothing is shared with other stores or survives
the process.
"""

from __future__ import annotations

from collections.abc import Callable

from .embedded import embedded_store, new_server
from .redis import RedisStore


def memory_store(
    *, prefix: str = "fx", session_ttl_s: float | None = None, clock: Callable[[], int] | None = None
) -> RedisStore:
    """A fresh in-process store that accepts any 1-128 of `A-Za-z0-9._-` as a session id."""
    return embedded_store(
        prefix=prefix, server=new_server(), memory_ids=True, session_ttl_s=session_ttl_s, clock=clock, kind="memory"
    )
