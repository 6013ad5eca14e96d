"""A delivery's deadline (§7): when its turn yields, and when a running call is cut off.

- soft, `deadline_ms - reserve_ms`: the engine sends no further model request
  (`yield_at`); the runner writes `turn_yield`, releases and the delivery requeues a wake;
- hard, `deadline_ms - min(2 s, reserve_ms / 2)`: a call still running is cut off.

A warm shutdown (SIGTERM sets the worker loop's `stopping` signal) pulls the deadline in
to `now + reserve_ms`: the turn yields at once, a request or tool call that ends within
the reserve finishes first, and what still runs at the pulled-in hard stop is cut off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .ids import now_ms
from .runtime import StopSignal

HARD_STOP_MAX_MS = 2000  # the hard stop comes at most this long before the deadline


class Deadline:
    """The soft and hard stops of one delivery, and its warm-shutdown watch."""

    def __init__(self, deadline_ms: int, reserve_ms: int, stopping: StopSignal | None = None) -> None:
        self.deadline_ms = deadline_ms
        self.reserve_ms = reserve_ms
        self.stopping = stopping

    def __repr__(self) -> str:
        return f"<Deadline in_ms={self.deadline_ms - now_ms()} reserve_ms={self.reserve_ms} stopping={self.shutting_down}>"

    @property
    def shutting_down(self) -> bool:
        """Whether a warm shutdown began."""
        return self.stopping is not None and self.stopping.is_set()

    @property
    def yield_at_ms(self) -> int:
        return self.deadline_ms - self.reserve_ms

    @property
    def hard_stop_ms(self) -> int:
        return self.deadline_ms - min(HARD_STOP_MAX_MS, self.reserve_ms // 2)

    def past_soft(self) -> bool:
        """Whether no further turn may start in this delivery."""
        return now_ms() >= self.yield_at_ms or self.shutting_down

    def yield_at(self) -> int:
        """The engine's `yield_at` (ms on `time.time()`'s clock); now, once a warm shutdown began."""
        return now_ms() if self.shutting_down else self.yield_at_ms

    def arm(self, *, on_hard_stop: Callable[[], None], on_shutdown: Callable[[], None]) -> Callable[[], None]:
        """Calls `on_hard_stop` at the hard stop, and on a warm shutdown `on_shutdown` at
        once and `on_hard_stop` at the pulled-in hard stop. Returns the disarm."""
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        disarmed = False

        def hard_stop_at_its_time() -> None:
            nonlocal timer
            if timer is not None:
                timer.cancel()
            timer = loop.call_later(max(0.0, (self.hard_stop_ms - now_ms()) / 1000), on_hard_stop)

        def shutdown() -> None:
            if disarmed:  # set() had already queued this when the disarm came
                return
            self.deadline_ms = min(self.deadline_ms, now_ms() + self.reserve_ms)
            on_shutdown()
            hard_stop_at_its_time()

        if self.reserve_ms > 0:
            hard_stop_at_its_time()
        unwatch = self.stopping.on_set(shutdown) if self.stopping is not None else None

        def disarm() -> None:
            nonlocal disarmed
            disarmed = True
            if timer is not None:
                timer.cancel()
            if unwatch is not None:
                unwatch()

        return disarm
