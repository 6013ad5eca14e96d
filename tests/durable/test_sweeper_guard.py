"""The sweeper's guard across processes (§7): one sweeps, the others try again each tick.

A process that does not hold the guard must wait a tick before trying it again. It once
tried again at once (its next sweep stayed due), so every idle worker but the guard's
holder sent Redis a `SET NX` and a `GET` about a hundred times a second, for ever.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from fxworker.settings import Settings
from fxworker.store import redis_store
from fxworker.sweeper import TICK_S, Sweeper, _redis_guard

pytestmark = [pytest.mark.redis]

WINDOW_S = 2.5


class CountedGuard:
    """The real Redis guard, counting how often it is asked."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard
        self.calls = 0
        self.granted = 0

    async def __call__(self, px_ms: int) -> bool:
        self.calls += 1
        held = bool(await self.guard(px_ms))
        self.granted += held
        return held


async def test_the_process_without_the_guard_tries_it_once_a_tick(redis_url: str, prefix: str) -> None:
    # Two sweepers as two worker processes would run them: one guard key, their own tokens.
    settings = [Settings(redis_url=redis_url, prefix=prefix, sweep_s=1.0) for _ in range(2)]
    store = redis_store(redis_url, prefix=prefix)
    guards = [CountedGuard(_redis_guard(s)) for s in settings]
    sweepers = [Sweeper(store, interval_s=1.0, guard=g, wake=lambda sid, agent: None) for g in guards]
    tasks = [asyncio.create_task(s.run()) for s in sweepers]
    started = time.monotonic()
    try:
        await asyncio.sleep(WINDOW_S)  # a rate over a window: no event marks "idle"
    finally:
        for sweeper in sweepers:
            sweeper.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), TICK_S + 2)
    elapsed = time.monotonic() - started
    holder, other = sorted(guards, key=lambda g: g.granted, reverse=True)
    assert holder.granted >= 1 and other.granted == 0, (holder.granted, other.granted)
    ticks = elapsed / TICK_S
    assert other.calls <= ticks + 2, f"the process without the guard asked for it {other.calls} times in {elapsed:.1f} s"
    assert holder.calls <= ticks + 2, f"the guard's holder asked for it {holder.calls} times in {elapsed:.1f} s"
