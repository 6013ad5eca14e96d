"""The embedded dev mode (no `REDIS_URL`, `fx dev`): workers, waker and sweeper in one process.

The same runner runs in worker threads of this process (`start_embedded_workers`): each
has its own loop (a `fxworker.runtime.LoopThread`), and the loss of one is survivable —
its lease stops being renewed, expires, and the sweeper wakes the session for a
replacement. `InProcessWaker` hands each wake to a live worker, round-robin; the
embedded sweeper (one process, so no guard) re-wakes ready sessions every
`min(FX_SWEEP_S, 1)` seconds.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from . import registry
from .delivery import handle_wake, settle_unserved
from .liveness import PROCESS_COUNTER, Liveness
from .runtime import LoopThread
from .settings import Settings
from .store import default_store
from .sweeper import Sweeper, lost_after_ms
from .wakers import BROKER_AWAY, wake_payload

log = logging.getLogger("fxworker.embedded")

_lock = threading.Lock()
_workers: list[LoopThread] = []
_sweeper: tuple[Sweeper, LoopThread] | None = None
_rr = 0


# ---------------------------------------------------------------------------- workers


def start_embedded_workers(n: int = 1) -> list[LoopThread]:
    """Starts `n` in-process worker loops for the embedded dev mode (`fx dev`), with a sweeper.

    Wakes sent by the in-process waker are delivered round-robin to live workers.
    """
    with _lock:
        while len(_workers) < n:
            _workers.append(LoopThread(f"fx-embedded-{len(_workers)}"))
        workers = list(_workers)
    start_embedded_sweeper()
    return workers


def embedded_workers() -> list[LoopThread]:
    """The live embedded worker loops."""
    with _lock:
        return [w for w in _workers if not w.killed]


def kill_embedded_worker(index: int = 0, *, replace: bool = True) -> None:
    """Test hook: kills embedded worker `index` abruptly (its turns stop mid-step, nothing is
    released); with `replace`, starts a fresh worker in its place. The killed worker's
    leases expire after `lease_s` and the sweeper hands its sessions to a live worker."""
    with _lock:
        victim = _workers[index]
        if replace:
            _workers[index] = LoopThread(f"fx-embedded-{index}r")
        else:
            del _workers[index]
    victim.kill()


def stop_embedded_workers() -> None:
    """Stops the embedded workers and their sweeper."""
    stop_embedded_sweeper()
    with _lock:
        workers = list(_workers)
        _workers.clear()
    for w in workers:
        w.close()


def next_embedded_worker() -> LoopThread | None:
    """A live embedded worker, round-robin (None when none is started)."""
    global _rr
    live = embedded_workers()
    if not live:
        return None
    _rr = (_rr + 1) % len(live)
    return live[_rr]


def begin_warm_shutdown() -> None:
    """Asks every running turn of the embedded workers to yield within its reserve and
    requeue (a Celery worker's own loop too: `fxworker.tasks.begin_warm_shutdown`)."""
    with _lock:
        workers = list(_workers)
    for worker in workers:
        worker.stopping.set()
    log.info("warm shutdown: running turns yield and requeue")


# ---------------------------------------------------------------------------- waker


class InProcessWaker:
    """Runs the delivery on an embedded worker loop of this process (embedded dev mode).

    With no embedded worker started, the first wake starts one (and the sweeper), so a
    plain script that prompts a session gets its turn run; `start_workers=False` is for an
    application that starts its own (`start_embedded_workers`): its wakes wait in the
    ready set until one runs, and the first wake says so once.
    """

    def __init__(self, *, start_workers: bool = True) -> None:
        self.start_workers = start_workers
        self.started_workers = False  # whether this waker started the embedded workers
        self._said = False

    def __repr__(self) -> str:
        return f"<InProcessWaker start_workers={self.start_workers}>"

    # A worker loop that stopped under the wake (the process shutting down) refuses it.
    failures = (RuntimeError, *BROKER_AWAY)

    def wake(self, session_id: str, *, agent: str, reason: str) -> None:
        worker = next_embedded_worker()
        if worker is None and self.start_workers:
            log.info("no embedded worker in this process: starting one (the embedded mode runs turns in-process)")
            start_embedded_workers(1)
            self.started_workers = True
            worker = next_embedded_worker()
        if worker is None:
            if not self._said:
                log.warning("no embedded worker runs in this process: wakes wait until start_embedded_workers()")
                self._said = True
            return
        payload = wake_payload(session_id, agent=agent, reason=reason)
        future = worker.submit(handle_wake(payload, loop_thread=worker))
        future.add_done_callback(_log_failure)


def _log_failure(future: Any) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        log.warning("embedded delivery failed: %s (the sweeper retries)", exc)


# ---------------------------------------------------------------------------- sweeper


def start_embedded_sweeper(settings: Settings | None = None) -> Sweeper:
    """The embedded mode's sweeper: one process, so no guard; wakes go in-process. Its
    live mark names every agent of the process while an embedded worker lives."""
    global _sweeper
    if _sweeper is not None:
        return _sweeper[0]
    settings = settings or Settings.from_env()
    agents = list(registry.agents().values())
    store = agents[0].store if agents else default_store(settings)

    async def always(_px_ms: int) -> bool:
        return True

    def served() -> list[str]:
        return list(registry.agents()) if embedded_workers() else []

    waker = InProcessWaker()
    sweeper = Sweeper(
        store,
        interval_s=min(settings.sweep_s, 1.0),
        guard=always,
        wake=lambda sid, agent: waker.wake(sid, agent=agent, reason="sweep"),
        liveness=Liveness(store, agents=served, counter=PROCESS_COUNTER),
        unserved=lambda sid, agent: settle_unserved(sid, agent, settings=settings),
        lost_after_ms=lost_after_ms(settings),
        local_agents=served,  # its wakes stay in this process (a local store may be shared)
    )
    loop = LoopThread("fx-sweeper")
    _sweeper = (sweeper, loop)
    loop.submit(sweeper.run())
    return sweeper


def stop_embedded_sweeper() -> None:
    global _sweeper
    if _sweeper is not None:
        sweeper, loop = _sweeper
        _sweeper = None
        sweeper.stop()
        loop.close()
