"""The sweeper (§7): re-wakes ready sessions whose lease is free or dead.

It runs inside the workers — a task on each worker process's loop, no separate beat — and a
Redis `SET NX PX` guard lets one sweep at a time across the pool. Every `FX_SWEEP_S` it
asks the store for sessions with pending work and no live lease (`ready_sessions`) and
sends each a wake to its owner's queue. Duplicate wakes are harmless (the lease decides);
a wake lost between accept and the broker only delays the turn until the next sweep.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

from .ids import now_ms
from .keys import sweeper_guard_key, worker_ready_key
from .settings import Settings
from .store.timed import TimedStore

log = logging.getLogger("fxworker.sweeper")


def mark_worker_ready(settings: Settings, *, hostname: str, pid: int) -> None:
    """Records that this worker is consuming (the event tests wait for instead of a sleep)."""
    import redis

    client = redis.Redis.from_url(settings.redis_url or "")
    try:
        client.set(worker_ready_key(settings.prefix, hostname), str(pid), ex=3600)
    finally:
        client.close()


class Sweeper:
    """One sweeping loop: `sweep_once()` every `interval_s` while it holds the guard."""

    def __init__(self, store: Any, *, interval_s: float, guard: Any, wake: Any) -> None:
        self.store = TimedStore(store)
        self.interval_s = interval_s
        self.guard = guard  # async callable(px_ms) -> bool: may this process sweep now?
        self.wake = wake  # callable(session_id, agent) -> None
        self.swept = 0
        self._stop = threading.Event()

    def __repr__(self) -> str:
        return f"<Sweeper every {self.interval_s}s swept={self.swept}>"

    async def sweep_once(self) -> int:
        """Wakes each ready session once; returns how many were woken."""
        if not await self.guard(int(self.interval_s * 1000 * 0.9)):
            return 0
        ready = await self.store.ready_sessions(now_ms=now_ms())
        n = 0
        for item in ready:
            session_id, agent = item.session_id, item.agent
            try:
                await asyncio.to_thread(self.wake, session_id, agent)
                n += 1
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.warning("sweeper could not wake %s", session_id, exc_info=True)
        if n:
            log.info("sweeper woke %d ready session(s)", n)
        self.swept += n
        return n

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.sweep_once()
            except Exception:  # noqa: BLE001 - Redis away: sweep again later
                log.warning("sweep failed", exc_info=True)
            await asyncio.sleep(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


# ---------------------------------------------------------------- worker wiring (the embedded mode's: fxworker.embedded)

_worker: tuple[Sweeper, Any] | None = None


def _redis_guard(settings: Settings) -> Any:
    import redis.asyncio as aioredis

    client: Any = None
    token = f"{os.getpid()}:{id(settings)}"

    async def guard(px_ms: int) -> bool:
        nonlocal client
        if client is None:
            client = aioredis.Redis.from_url(settings.redis_url or "")
        key = sweeper_guard_key(settings.prefix)
        if await client.set(key, token, nx=True, px=max(px_ms, 50)):
            return True
        return (await client.get(key)) == token.encode()

    return guard


def start_worker_sweeper(settings: Settings) -> Sweeper | None:
    """Starts this worker process's sweeper on the process loop (Celery `worker_ready`)."""
    global _worker
    if _worker is not None or not settings.redis_url:
        return None
    from .runtime import process_loop
    from .store import default_store
    from .wakers import CeleryWaker

    waker = CeleryWaker()
    sweeper = Sweeper(
        default_store(settings),
        interval_s=settings.sweep_s,
        guard=_redis_guard(settings),
        wake=lambda sid, agent: waker.wake(sid, agent=agent, reason="sweep"),
    )
    future = process_loop().submit(sweeper.run())
    _worker = (sweeper, future)
    return sweeper


def stop_worker_sweeper() -> None:
    global _worker
    if _worker is not None:
        _worker[0].stop()
        _worker = None
