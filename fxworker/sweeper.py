"""The sweeper (§7): re-wakes ready sessions whose lease is free or dead.

It runs inside the workers — a task on each worker process's loop, no separate beat — and a
Redis `SET NX PX` guard lets one sweep at a time across the pool (every process tries it
each second, so a successor takes over within `GUARD_MS` of the holder's death). Every
`FX_SWEEP_S` it asks the store for sessions with work and no live lease (`ready_sessions`)
and sends each a wake to its owner's queue; a session whose worker died is woken when its
lease expires (see `Sweeper`). Duplicate wakes are harmless (the lease decides), but every
wake is bounded: a session has at most one outstanding wake the sweeper sent or trusts
(meta `woken`, taken by the next claim), and a session whose agent no live worker runs is
never woken through the broker (fxworker/liveness.py). A wake lost between accept and the
broker is sent again once the workers' marks show it cannot be on its way.

During a rolling deploy the guard may be held by a process of an older release, whose
sweeps skip the sessions let go for a newer layout (meta `newer`). So a process that does
not hold the guard, while some live process reads an older layout than it, sweeps those
sessions itself (`sweep_newer`), under a guard of its own level: one such sweep at a time,
every `FX_SWEEP_S`, each session bounded by its outstanding wake as in a full sweep.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fxengine.errors import FxInputError

from .ids import now_ms
from .keys import sweeper_guard_key, worker_ready_key
from .liveness import PROCESS_COUNTER, Liveness, Service, layout_all_read
from .runtime import LoopThread
from .settings import Settings
from .store import RedisStore, default_store, store_clients
from .store.types import LAYOUT_LEVEL
from .wakers import Waker

log = logging.getLogger("fxworker.sweeper")


def mark_worker_ready(settings: Settings, *, hostname: str, pid: int) -> None:
    """Records in the store that this worker is consuming (the event tests wait for
    instead of a sleep)."""
    client = store_clients(settings.store_url or "", max_connections=1)[1]()
    try:
        client.set(worker_ready_key(settings.prefix, hostname), str(pid), ex=3600)
    finally:
        client.close()


GUARD_MS = 2500  # the guard's life: the holder renews it every tick, a successor takes over soon after
TICK_S = 1.0  # how often a process tries the guard (and the holder looks at due lease expiries)
IN_FLIGHT_MS = 2000  # a session marked ready this recently most likely has its sender's wake on the way
EXPIRY_MARGIN_MS = 50  # a lease is looked at this long after it was due to expire

# Settles a session whose agent no live worker runs, in this process (session id, agent):
# a claim that records `noWorker` (or, past the give-up, ends its inputs FX_NO_AGENT).
Unserved = Callable[[str, str], Awaitable[None]]


class Sweeper:
    """One sweeping loop: while this process holds the guard, a full sweep every
    `interval_s`, and a look at each running session the moment its lease would expire.

    A full sweep (`sweep_once`) wakes the ready sessions no live lease holds, except those
    marked ready within `IN_FLIGHT_MS` (or `interval_s`, if shorter): their sender's wake is
    still on its way. It also notes when each running session's lease expires, and the loop
    looks at those sessions then (`check_expired`): a renewed lease is noted again, a dead
    one is woken at once. So a session whose worker died is woken about `lease_s` after
    its last renewal, not at the next full sweep (this needs `interval_s` < `lease_s`).

    With `liveness` (every worker process has it), each tick also writes this process's
    mark, and a sweep reads everyone's: a session whose agent no live worker runs is
    handed to `unserved` (in this process, no broker) once its backoff is due; one whose
    wake is outstanding is woken again only once `Service.wake_lost` says so (or after
    `lost_after_ms`, the broker's redelivery bound). A sweep runs at once when an agent
    starts being served, so its waiting sessions do not wait for the next interval.
    """

    def __init__(
        self, store: RedisStore, *, interval_s: float, guard: Callable[[int], Awaitable[bool]], wake: Any,
        liveness: Liveness | None = None, unserved: Unserved | None = None, lost_after_ms: int = 600_000,
        newer_guard: Callable[[int], Awaitable[bool]] | None = None,
        local_agents: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.guard = guard  # async callable(px_ms) -> bool: may this process sweep now?
        # async callable(px_ms) -> bool: may this process sweep the sessions let go for its
        # layout level while the guard is another's (`sweep_newer`)? One per level.
        self.newer_guard = newer_guard
        self._next_newer_ms = 0
        # With in-process wakes (the embedded mode): the agents this process runs. A session
        # of another agent is left to the process that runs it (several processes may share
        # one local store), except to settle one nobody runs.
        self.local_agents = local_agents
        self.wake = wake  # callable(session_id, agent) -> None
        self.liveness = liveness
        self.unserved = unserved
        self.lost_after_ms = lost_after_ms
        self._served: dict[str, Service] | None = None  # at the last sweep (None: not known)
        self.swept = 0
        self.in_flight_ms = int(min(IN_FLIGHT_MS, interval_s * 1000))
        self.tick_s = min(TICK_S, interval_s)
        self._held: dict[str, tuple[str, int]] = {}  # session -> (agent, lease expiry ms)
        self._next_sweep_ms = 0
        self._stop = threading.Event()

    def __repr__(self) -> str:
        return f"<Sweeper every {self.interval_s}s swept={self.swept} watching_leases={len(self._held)}>"

    async def sweep_once(self, *, guarded: bool | None = None) -> int:
        """A full sweep, if this process holds the guard (`guarded`: already asked); returns
        how many sessions it woke."""
        if not (await self.guard(GUARD_MS) if guarded is None else guarded):
            # Another process sweeps: try the guard again at the next tick (not at once,
            # which would spin on SET NX and GET while that process lives).
            self._held.clear()
            self._next_sweep_ms = now_ms() + int(self.tick_s * 1000)
            await self.sweep_newer()
            return 0
        now = now_ms()
        self._next_sweep_ms = now + int(self.interval_s * 1000)
        ready = await self.store.ready_sessions(now_ms=now, include_held=True)
        served = self._served = await self.liveness.served(now) if self.liveness is not None else None
        self._held = {r.session_id: (r.agent, r.lease_expires_ms or now) for r in ready if r.reason == "held"}
        wake, unserved = [], []
        for r in ready:
            if r.reason == "held" or r.marked_ms > now - self.in_flight_ms:
                continue
            if r.newer is not None and r.newer > LAYOUT_LEVEL:
                continue  # let go for a newer release: its own sweeper wakes it
            if served is not None and r.agent not in served:
                # Nobody runs its agent: a wake would wait in a queue nobody reads. Its
                # claim here records `noWorker`, and past the give-up ends its inputs.
                if r.unserved_next_ms is None or r.unserved_next_ms <= now:
                    unserved.append((r.session_id, r.agent))
            elif self._runs_here(r.agent) and self._wake_due(r.agent, r.woken_ms, served, now):
                wake.append((r.session_id, r.agent))
        await self._settle_unserved(unserved)
        woken = await self._wake_all(wake)
        await self.end_waits(now)
        return woken

    async def sweep_newer(self) -> int:
        """While another process holds the guard and some live process reads an older
        layout than this one, wakes the ready sessions let go for a layout only processes
        like this one read (meta `newer` above that older level, at most this release's):
        a guard holder of an older release skips them. Returns how many it woke."""
        now = now_ms()
        if self.newer_guard is None or now < self._next_newer_ms:
            return 0
        self._next_newer_ms = now + int(self.interval_s * 1000)
        oldest = layout_all_read(await self.store.live_workers(now_ms=now))
        if oldest >= LAYOUT_LEVEL or not await self.newer_guard(int(self.interval_s * 1000) + GUARD_MS):
            return 0
        ready = await self.store.ready_sessions(now_ms=now)
        served = await self.liveness.served(now) if self.liveness is not None else None
        wake = [(r.session_id, r.agent) for r in ready
                if r.reason != "held" and r.marked_ms <= now - self.in_flight_ms
                and r.newer is not None and oldest < r.newer <= LAYOUT_LEVEL
                and (served is None or r.agent in served) and self._wake_due(r.agent, r.woken_ms, served, now)]
        if wake:
            log.info("waking %d session(s) let go for stored layout %d (a live process reads only %d)", len(wake),
                     LAYOUT_LEVEL, oldest)
        return await self._wake_all(wake)

    async def end_waits(self, now: int) -> int:
        """Ends the waits of parked turns past their timeout (`Agent(decision_timeout_s=)`,
        noted as they parked): each call still waiting is denied, "no decision came within
        N s", through the same door as a person's decision (a later answer for it is
        `FX_DECISION_EXPIRED`), and the session is woken. Returns how many calls it denied."""
        due = await self.store.waits_due(now_ms=now)
        if not due:
            return 0
        denied = 0
        for _member, timeout_s, session_id in due:
            state = await self.store.state(session_id) if session_id else None
            if state is None or not state.paused_calls:
                continue  # decided, cancelled or gone meanwhile
            wake = False
            for call_id in state.paused_calls:
                body = {"callId": call_id, "by": "timeout",
                        "decision": {"type": "deny", "reason": f"no decision came within {timeout_s:g} s"}}
                try:
                    accepted = await self.store.accept(
                        session_id, agent=state.agent, kind="decision", message_id=timeout_message_id(call_id),
                        input=body, now_ms=now, create=False, call_id=call_id, decision="d", expired=True)
                except FxInputError:
                    continue  # decided at the door meanwhile: that decision stands
                denied += 0 if accepted.repeated else 1
                wake = wake or accepted.wake
            if wake:
                await self._wake_all([(session_id, state.agent)])
        await self.store.forget_waits([member for member, _, _ in due])
        if denied:
            log.info("sweeper denied %d call(s) whose wait timed out", denied)
        return denied

    def _runs_here(self, agent: str) -> bool:
        """Whether a wake this sweeper sends for `agent` reaches a process that runs it."""
        return self.local_agents is None or agent in set(self.local_agents())

    def _wake_due(self, agent: str, woken_ms: int | None, served: dict[str, Service] | None, now: int) -> bool:
        """Whether to queue a wake for a session of `agent` whose outstanding wake (if any)
        was queued at `woken_ms`: none is, or that one was lost."""
        if woken_ms is None:
            return True
        service = served.get(agent) if served is not None else None
        if service is None:  # no marks to judge by: trust it up to the broker's bound
            return now - woken_ms >= self.lost_after_ms
        return service.wake_lost(woken_ms, now, self.lost_after_ms)

    async def _settle_unserved(self, sessions: list[tuple[str, str]]) -> None:
        if self.unserved is None or not sessions:
            return
        for session_id, agent in sessions:
            try:
                await self.unserved(session_id, agent)
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.warning("sweeper could not settle %s (agent %r runs nowhere)", session_id, agent, exc_info=True)
        log.info("%d session(s) wait for an agent no live worker runs", len(sessions))

    async def check_expired(self) -> int:
        """Looks at the running sessions whose lease was due to expire; wakes those it did."""
        now = now_ms()
        due = [sid for sid, (_, expires_ms) in self._held.items() if expires_ms + EXPIRY_MARGIN_MS <= now]
        if not due:
            return 0
        woken = []
        served = self._served
        for sid, state in zip(due, await self.store.states(due, now_ms=now)):
            if state is not None and state.has_work and state.lease_expires_ms is not None:
                self._held[sid] = (state.agent, state.lease_expires_ms)  # renewed
                continue
            del self._held[sid]
            if state is None or state.status != "waiting" or (state.newer or 0) > LAYOUT_LEVEL:
                continue
            if served is not None and state.agent not in served:
                continue  # the next sweep settles it
            if self._runs_here(state.agent) and self._wake_due(state.agent, state.woken_ms, served, now):
                woken.append((sid, state.agent))
        return await self._wake_all(woken)

    async def _wake_all(self, sessions: list[tuple[str, str]]) -> int:
        if not sessions:
            return 0
        # Noted before it is sent: a claim that takes the wake at once clears the note.
        await self.store.mark_woken([sid for sid, _ in sessions], now_ms=now_ms())
        n = 0
        for session_id, agent in sessions:
            try:
                await asyncio.to_thread(self.wake, session_id, agent)
                n += 1
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.warning("sweeper could not wake %s", session_id, exc_info=True)
        if n:
            log.info("sweeper woke %d ready session(s)", n)
        self.swept += n
        return n

    async def tick(self) -> bool:
        """One tick; True when this process held the guard and looked at sessions."""
        if self.liveness is not None:
            await self.liveness.beat()
        if now_ms() >= self._next_sweep_ms or await self._newly_served():
            swept = await self.guard(GUARD_MS)
            await self.sweep_once(guarded=swept)
            return swept
        if await self.guard(GUARD_MS):
            await self.check_expired()
            return True
        self._held.clear()
        await self.sweep_newer()
        return False

    async def _newly_served(self) -> bool:
        """Whether an agent is served now that was not at the last sweep (a worker of it
        just started): its waiting sessions are swept at once, not at the next interval."""
        known = self._served
        if self.liveness is None or known is None:
            return False
        served = await self.liveness.served(now_ms())
        return any(agent not in known for agent in served)

    def _sleep_s(self) -> float:
        """Until the next tick, the next full sweep or the first lease due, whichever is first."""
        now = now_ms()
        due = [self._next_sweep_ms, *(expires + EXPIRY_MARGIN_MS for _, expires in self._held.values())]
        return max(0.01, min(self.tick_s, (min(due) - now) / 1000))

    async def run(self) -> None:
        # What failed sweeps met since the last one that worked: each kind logged once per
        # outage, not per tick; "work again" only once a tick held the guard and swept (a
        # tick that found another holder proves nothing while Redis refuses writes).
        failing: set[str] = set()
        while not self._stop.is_set():
            try:
                worked = await self.tick()
            except Exception as exc:  # noqa: BLE001 - Redis away or full: sweep again later
                kind = type(exc).__name__
                if kind not in failing:
                    log.warning("sweeps fail (%s: %s); trying again every tick", kind, exc, exc_info=not failing)
                    failing.add(kind)
            else:
                if failing and worked:
                    log.warning("sweeps work again")
                    failing = set()
            await asyncio.sleep(self._sleep_s())

    def stop(self) -> None:
        self._stop.set()


def timeout_message_id(call_id: str) -> str:
    """The message id of a wait's timeout for `call_id`: the same from every sweeper, so two
    that race store one decision (accept.lua: a repeated id stores nothing)."""
    return "timeout:" + hashlib.sha1(call_id.encode("utf-8", "surrogatepass")).hexdigest()


# ---------------------------------------------------------------- worker wiring (the embedded mode's: fxworker.embedded)


def _redis_guard(settings: Settings, *, level: int | None = None) -> Callable[[int], Awaitable[bool]]:
    """The sweep guard (`level`: the guard of the sweeps of sessions let go for that layout
    level, `Sweeper.sweep_newer`)."""
    client: Any = None
    token = f"{os.getpid()}:{id(settings)}"

    async def guard(px_ms: int) -> bool:
        nonlocal client
        if client is None:
            client = store_clients(settings.store_url or "", max_connections=2)[0]()
        key = sweeper_guard_key(settings.prefix) + (f":newer:{level}" if level is not None else "")
        if await client.set(key, token, nx=True, px=max(px_ms, 50)):
            return True
        if (await client.get(key)) != token.encode():
            return False
        await client.pexpire(key, max(px_ms, 50))  # still ours: keep it (a lost race only doubles a wake)
        return True

    return guard


def start_worker_sweeper(
    settings: Settings, *, loop: LoopThread, waker: Waker, agents: Callable[[], Any], unserved: Unserved,
) -> tuple[Sweeper, concurrent.futures.Future[None]] | None:
    """Starts a worker process's sweeper on `loop`, waking through `waker` (Celery
    `worker_ready`, in `fxworker.tasks`); None without a store URL. `agents()` names the
    agents the process serves (its mark); `unserved` settles a session nobody serves.

    Returns the sweeper and the future of its run, for the caller to keep: asyncio holds
    a running task only weakly.
    """
    if not settings.store_url:
        return None
    store = default_store(settings)
    sweeper = Sweeper(
        store,
        interval_s=settings.sweep_s,
        guard=_redis_guard(settings),
        wake=lambda sid, agent: waker.wake(sid, agent=agent, reason="sweep"),
        liveness=Liveness(store, agents=agents, counter=PROCESS_COUNTER),
        unserved=unserved,
        lost_after_ms=lost_after_ms(settings),
        newer_guard=_redis_guard(settings, level=LAYOUT_LEVEL),
    )
    return sweeper, loop.submit(sweeper.run())


def lost_after_ms(settings: Settings) -> int:
    """How long a queued wake is trusted with no evidence either way: the broker's own
    bound (its visibility timeout, fxworker/celery_app.py), past which a wake a worker
    took and lost would have come back."""
    return int((settings.delivery_timeout_s * 3 + 60) * 1000)
