"""Which agents live worker processes run, and whether a queued wake can still arrive (§7).

Every worker process (a Celery worker, or the embedded workers of one process) counts the
deliveries running on it against its capacity (`DeliveryCounter`) and writes its mark to
the store every `HEARTBEAT_MS` (`Liveness.beat`, from its sweeper's loop): the agents it
runs, since when it has had a free slot, and the send time of the newest wake it started.
A mark holds for `MARK_TTL_MS`, so a worker killed is gone from the served agents within
that.

The sweeper reads the marks (`Liveness.served`) and decides with them:
- an agent no live worker runs is not served: its sessions are never woken through the
  broker (the wake would sit in a queue nobody reads, one more each sweep); they show
  `noWorker` and end `FX_NO_AGENT` after `FX_NO_AGENT_GIVE_UP_S` (fxworker/sweeper.py);
- a session's outstanding wake (meta `woken`, taken by the next claim) is trusted until
  there is evidence it was lost (`Service.wake_lost`): a worker of its agent started a
  wake sent `REORDER_SLACK_MS` after it (queues are first in, first out), or one has had
  a free slot for `FREE_PROOF_MS` since it was sent (a worker with a free slot takes what
  its queue holds: Celery reserves up to its concurrency),
  or it is older than the broker's own redelivery bound (`lost_after_ms`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .ids import now_ms
from .store import RedisStore
from .store.types import LAYOUT_LEVEL, WorkerMark

log = logging.getLogger("fxworker.liveness")

HEARTBEAT_MS = 1000  # how often a worker writes its mark
MARK_TTL_MS = 3500  # a mark not renewed for this long is a worker gone
FREE_PROOF_MS = 2000  # a worker with a free slot this long since a wake was queued would have taken it
REORDER_SLACK_MS = 5000  # wakes of one queue start in the order sent, give or take this
# A sender sends no wake while one sent this recently is outstanding (accept.lua keeps the
# same figure): past it, a wake the broker lost costs a sender no more than this.
SENDER_TRUST_MS = 10_000


class DeliveryCounter:
    """The deliveries running in this process against its `capacity` (a Celery worker's
    concurrency; the embedded workers take any number), and what its mark says of them
    (thread-safe: Celery's task threads and the embedded loops count into one). A delivery
    that never finishes (its loop was killed) holds one slot, not the whole process."""

    def __init__(self, capacity: int = 1 << 30, consuming: Callable[[int], int | None] | None = None) -> None:
        self._lock = threading.Lock()
        self.capacity = capacity
        # Since when its consumer has heard from the broker (None: not now); None for the
        # embedded workers, whose wakes reach them with no broker.
        self.consuming = consuming
        self.running = 0
        self.free_since_ms: int | None = now_ms()
        self.took_sent_ms = 0

    def __repr__(self) -> str:
        return f"<DeliveryCounter running={self.running}/{self.capacity} free_since_ms={self.free_since_ms}>"

    def started(self, sent_ms: object) -> None:
        """A delivery of a wake sent at `sent_ms` (its payload's `sentMs`, if any) starts."""
        with self._lock:
            self.running += 1
            if self.running >= self.capacity:
                self.free_since_ms = None
            if isinstance(sent_ms, int) and sent_ms > self.took_sent_ms:
                self.took_sent_ms = sent_ms

    def finished(self) -> None:
        with self._lock:
            self.running -= 1
            if self.free_since_ms is None and self.running < self.capacity:
                self.free_since_ms = now_ms()

    def free_since(self, now: int) -> int | None:
        """Since when it has had a free slot and taken from its queues: None while full, or
        while its consumer has not heard from the broker (down, or not back after a restart)."""
        free = self.free_since_ms
        if free is None or self.consuming is None:
            return free
        consuming = self.consuming(now)
        return None if consuming is None else max(free, consuming)


@dataclass(frozen=True, slots=True)
class Service:
    """What the live workers of one agent say: the earliest moment since which one of
    them has had a free slot (None: all full) and the newest send time of a wake one started."""

    free_since_ms: int | None
    took_sent_ms: int

    def wake_lost(self, woken_ms: int, now: int, lost_after_ms: int) -> bool:
        """Whether a wake queued at `woken_ms` and not taken yet must have been lost."""
        if now - woken_ms >= lost_after_ms:
            return True
        if self.took_sent_ms > woken_ms + REORDER_SLACK_MS:
            return True  # a later wake of its queue started: this one is not coming
        idle = self.free_since_ms
        return idle is not None and now - max(idle, woken_ms) >= FREE_PROOF_MS


def layout_all_read(marks: Iterable[WorkerMark], *, own: int = LAYOUT_LEVEL) -> int:
    """The newest stored layout level every live process reads (`own` at most): the gate a
    writer of a new layout consults, so that no live process of an older release meets
    what it cannot read (docs/operations.md, "Upgrading"). A process of a release before
    the marks announced `reads` counts as level 1."""
    return min([own, *(mark.reads for mark in marks)])


def served_by(marks: Iterable[WorkerMark]) -> dict[str, Service]:
    """The agents the `marks` run, each with what its workers say (`Service`)."""
    idle: dict[str, int | None] = {}
    took: dict[str, int] = {}
    for mark in marks:
        for agent in mark.agents:
            took[agent] = max(took.get(agent, 0), mark.took_sent_ms)
            if agent not in idle:
                idle[agent] = mark.free_since_ms
            elif mark.free_since_ms is not None:
                known = idle[agent]
                idle[agent] = mark.free_since_ms if known is None else min(known, mark.free_since_ms)
    return {agent: Service(idle[agent], took[agent]) for agent in idle}


class Liveness:
    """This process's mark (`beat`) and every live worker's (`served`), on one store.

    `agents()` names the agents this process runs now (a Celery worker: those whose queue
    it consumes); an empty answer writes no mark (the process serves nothing).
    """

    def __init__(self, store: RedisStore, *, agents: Callable[[], Iterable[str]], counter: DeliveryCounter,
                 worker_id: str | None = None, always: bool = False) -> None:
        self.store = store
        self.agents = agents
        self.counter = counter
        self.always = always  # a mark even with no agent: a web process announcing what it reads
        self.host = socket.gethostname()
        self.worker_id = worker_id or f"{self.host}:{os.getpid()}:{id(self):x}"
        self._next_beat_ms = 0

    def __repr__(self) -> str:
        return f"<Liveness {self.worker_id} agents={sorted(self.agents())}>"

    async def beat(self, *, force: bool = False) -> None:
        """Writes this process's mark, at most once per `HEARTBEAT_MS` unless `force`."""
        now = now_ms()
        if not force and now < self._next_beat_ms:
            return
        agents = tuple(sorted(self.agents()))
        if not agents and not self.always:
            return
        self._next_beat_ms = now + HEARTBEAT_MS
        counter = self.counter
        await self.store.heartbeat(WorkerMark(self.worker_id, agents, now + MARK_TTL_MS, counter.free_since(now),
                                              counter.took_sent_ms, self.host, os.getpid()))

    async def served(self, now: int) -> dict[str, Service]:
        """The agents live workers run (this process's own always among them)."""
        served = served_by(await self.store.live_workers(now_ms=now))
        counter = self.counter
        for agent in self.agents():
            if agent not in served:
                served[agent] = Service(counter.free_since(now), counter.took_sent_ms)
        return served

    async def announce(self) -> None:
        """Writes this process's mark every `HEARTBEAT_MS` until cancelled, then deletes it
        (a web process: it runs no agent, and reads stored layouts)."""
        try:
            while True:
                try:
                    await self.beat()
                except Exception:  # noqa: BLE001 - the store away: the next beat tries again
                    log.debug("writing the live mark of %s failed", self.worker_id, exc_info=True)
                await asyncio.sleep(HEARTBEAT_MS / 1000)
        finally:
            await self.forget()

    async def forget(self) -> None:
        """Deletes this process's mark (a worker stopping): its agents stop being served by it."""
        try:
            await self.store.forget_worker(self.worker_id)
        except Exception:  # noqa: BLE001 - the mark expires on its own
            log.debug("forgetting the mark of %s failed", self.worker_id, exc_info=True)


PROCESS_COUNTER = DeliveryCounter()
"""The deliveries of this process (Celery's task threads and embedded workers alike)."""
