"""`SessionLoop`: the start/stop lifecycle of one session's background task.

The lease keeper runs one such loop beside a turn (the inbox is read by one hub per
process loop, `fxworker.watch`). `start()` runs
the subclass's `_run()` as a task named `<TASK_NAME>:<session id>`; `stop()` ends it and
waits until it has finished, so nothing of it runs once the runner goes on.

A single `task.cancel()` is not enough to end such a loop on Python 3.11: redis-py writes
to its socket inside `asyncio.wait_for`, which returns the call's result and drops the
cancellation when the cancel lands just as the write completes (fixed in 3.12, where
`wait_for` is built on `asyncio.timeout`). A loop that lost its cancel that way renewed its
lease (or polled its inbox, when each turn had a watcher task) for ever while the runner
waited at `stop()`. So `stop()` sets
a flag every loop checks (`stopping`), cancels again until the task is done, and gives up
waiting after `STOP_TIMEOUT_S`: the flag still ends the loop at its next turn.
"""

from __future__ import annotations

import asyncio
import logging
from typing import ClassVar, Self

log = logging.getLogger("fxworker.background")

STOP_TIMEOUT_S = 2.0  # how long stop() waits for the task before leaving it to its flag
RECANCEL_S = 0.05  # how often stop() repeats the cancel while the task runs on


class SessionLoop:
    """One background task per session: `start()` runs `_run()`; `stop()` ends it, bounded.

    Subclasses loop `while not self.stopping` and do nothing more once it is set.
    """

    TASK_NAME: ClassVar[str]
    session_id: str
    _task: asyncio.Task[None] | None = None
    _stopping: bool = False

    @property
    def stopping(self) -> bool:
        """Set by `stop()`: the loop must end at its next check."""
        return self._stopping

    def start(self) -> Self:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name=f"{self.TASK_NAME}:{self.session_id}")
        return self

    async def stop(self, *, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ends the task; returns once it finished, or after `timeout_s` at the latest."""
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + timeout_s
        while not task.done():
            task.cancel()
            # asyncio.wait neither cancels the task on its timeout nor raises what it raised.
            await asyncio.wait({task}, timeout=RECANCEL_S)
            if not task.done() and loop.time() >= give_up_at:
                log.error("%r did not stop within %.1f s; its flag ends it at its next step", self, timeout_s)
                return
        if not task.cancelled() and task.exception() is not None:
            log.error("%r failed", self, exc_info=task.exception())

    async def _run(self) -> None:
        raise NotImplementedError
