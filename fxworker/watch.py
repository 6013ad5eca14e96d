"""Watching a running session's inbox for steers, prompts and cancels (§6).

The watcher reads the session's inbox stream after the last entry it saw every
`WATCH_INTERVAL_S` and hands each new input to the runner, in acceptance order, so a
cancel reaches the running turn well within a second of being stored. It polls (XREAD
without BLOCK) rather than blocking: a blocking read pins one Redis connection per
running turn, so a process carrying 100+ turns would keep most of its loop's pool
(`FX_REDIS_MAX_CONNECTIONS`) parked in reads, and every other call would wait for one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .background import SessionLoop
from .errors import FxStoreUnavailableError

log = logging.getLogger("fxworker.watch")

WATCH_INTERVAL_S = 0.25


class InboxWatcher(SessionLoop):
    """Follows a session's inbox after `after_seq`, calling `on_input(entry)` for each entry."""

    TASK_NAME = "watch"

    def __init__(self, store: Any, session_id: str, *, after_seq: int, on_input: Callable[[Any], None]) -> None:
        self.store = store
        self.session_id = session_id
        self.after_seq = after_seq
        self.on_input = on_input

    def __repr__(self) -> str:
        return f"<InboxWatcher session={self.session_id} after_seq={self.after_seq}>"

    async def _run(self) -> None:
        while not self.stopping:
            try:
                entries = await self.store.watch_inbox(self.session_id, self.after_seq, block_ms=None)
            except FxStoreUnavailableError as exc:
                log.warning("watching %s failed (%s); retrying", self.session_id, exc)
                await asyncio.sleep(0.2)
                continue
            if self.stopping:
                return  # the runner has moved on: what was read stays in the inbox for the next claim
            if not entries:
                await asyncio.sleep(WATCH_INTERVAL_S)
            for entry in entries:
                self.after_seq = max(self.after_seq, int(entry.seq))
                try:
                    self.on_input(entry)
                except Exception:  # noqa: BLE001 - one bad entry must not stop the watch
                    log.exception("handling inbox entry %s of %s failed", entry, self.session_id)
