"""`SessionLoop`: the start/stop lifecycle of one session's background task.

The lease keeper and the inbox watcher each run one loop beside a turn. `start()` runs
the subclass's `_run()` as a task named `<TASK_NAME>:<session id>`; `stop()` cancels it
and waits until it has finished, so nothing of it runs once the runner goes on.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar, Self


class SessionLoop:
    """One background task per session: `start()` runs `_run()`, `stop()` cancels and awaits it."""

    TASK_NAME: ClassVar[str]
    session_id: str
    _task: asyncio.Task[None] | None = None

    def start(self) -> Self:
        self._task = asyncio.create_task(self._run(), name=f"{self.TASK_NAME}:{self.session_id}")
        return self

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        raise NotImplementedError
