"""The nemesis of a chaos run: faults on a seeded schedule, each one recorded.

Every few seconds (a gap drawn from the seed) it does one of:

- `kill`: kill -9 a worker process, then start a replacement;
- `stop`: SIGSTOP a worker past its lease (`LEASE_S` + 1.5 s), then SIGCONT it: another
  worker takes its sessions over, and the woken one's writes must all be fenced (§11.4);
- `term`: SIGTERM a worker (a deploy: its turns yield and it exits), start a replacement;
- `redis`: restart the Redis server (SIGTERM, start again on its port; the AOF keeps the data);
- `clients`: `CLIENT KILL TYPE normal` (every client connection but the nemesis's own).

The first round does each kind once, in a seeded order, and always completes (even past
`stop_at`), so every run has each; after that the kinds are drawn at random until
`stop_at`. For a `kill` or `stop`, every session whose lease is held (a delivery runs) is
watched: one whose lease is renewed or released has a live holder; for the others, the
time until a line of a newer epoch is stored is the time to recover (`recovery`
operations; the checker keeps those whose new epoch was a takeover).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Iterator

import redis

from tests.chaos.history import History
from tests.chaos.system import LEASE_S, System
from tests.chaos.workload import ModelScript
from tests.support.workers import CeleryWorker

KINDS = ("kill", "stop", "term", "redis", "clients")
WEIGHTS = (3, 2, 1, 1, 2)
STOP_PAST_LEASE_S = LEASE_S + 1.5
RECOVERY_WATCH_S = 30.0


class Nemesis:
    """Runs the fault schedule in a thread until `stop_at`."""

    def __init__(self, system: System, script: ModelScript, sessions: dict[str, str], *, seed: int,
                 history: History, stop_at: float, gap_s: tuple[float, float] = (2.5, 5.0)) -> None:
        self.system = system
        self.script = script
        self.sessions = sessions  # session tag (s<i>) -> session id, filled by the drivers
        self.rng = random.Random(f"nemesis-{seed}")
        self.history = history
        self.stop_at = stop_at
        self.gap_s = gap_s
        self._done = threading.Event()
        self._watchers: list[threading.Thread] = []
        self._terminating: list[threading.Thread] = []
        self.thread = threading.Thread(target=self.run, name="chaos-nemesis", daemon=True)

    def start(self) -> Nemesis:
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Ends the schedule (the running fault completes, a frozen worker is woken) and waits."""
        self._done.set()
        self.thread.join(timeout_s)
        for t in self._watchers + self._terminating:
            t.join(timeout_s)

    def schedule(self) -> Iterator[str]:
        """Each kind once in a seeded order, then kinds drawn by `WEIGHTS`."""
        first = list(KINDS)
        self.rng.shuffle(first)
        yield from first
        while True:
            yield self.rng.choices(KINDS, WEIGHTS)[0]

    def run(self) -> None:
        for i, kind in enumerate(self.schedule()):
            gap = self.rng.uniform(*self.gap_s)
            if i < len(KINDS):
                time.sleep(gap)  # the first round always completes: every run has each kind
            elif self._done.wait(gap) or time.monotonic() >= self.stop_at:
                return
            try:
                getattr(self, f"fault_{kind}")()
            except Exception as exc:  # a fault that could not be applied is recorded, not fatal
                self.history.record("fault_failed", fault=kind, error=repr(exc))

    # ------------------------------------------------------------------ faults

    def _victim(self) -> CeleryWorker:
        assert self.system.pool is not None
        live = self.system.pool.live()
        busy = set(self.script.last_pid.values())
        preferred = [w for w in live if w.pid in busy] or live
        return self.rng.choice(preferred)

    def _held(self) -> dict[str, tuple[int, int]]:
        """Session id -> (epoch, expires_ms) of every session whose lease is held."""
        return self.system.held_leases([sid for sid in list(self.sessions.values()) if sid])

    def _replace(self, why: str) -> None:
        assert self.system.pool is not None
        worker = self.system.pool.start()
        self.history.record("fault", fault="replacement", pid=worker.pid, why=why)

    def fault_kill(self) -> None:
        worker = self._victim()
        held = self._held()
        t0 = time.monotonic()
        worker.kill()
        self.history.record("fault", fault="kill", pid=worker.pid)
        self._watch("kill", held, t0)
        self._replace("kill")

    def fault_stop(self) -> None:
        worker = self._victim()
        held = self._held()
        t0 = time.monotonic()
        worker.signal(signal.SIGSTOP)
        self.history.record("fault", fault="stop", pid=worker.pid)
        self._watch("stop", held, t0)
        try:
            time.sleep(STOP_PAST_LEASE_S)
        finally:
            worker.signal(signal.SIGCONT)
            self.history.record("fault", fault="cont", pid=worker.pid)

    def fault_term(self) -> None:
        worker = self._victim()
        worker.signal(signal.SIGTERM)
        self.history.record("fault", fault="term", pid=worker.pid)
        waiter = threading.Thread(target=self._reap, args=(worker,), name=f"chaos-reap-{worker.pid}", daemon=True)
        waiter.start()
        self._terminating.append(waiter)
        self._replace("term")

    def _reap(self, worker: CeleryWorker) -> None:
        assert worker.proc is not None
        try:
            code = worker.proc.wait(30)
        except Exception:
            worker.kill()
            code = None
        self.history.record("fault", fault="exited", pid=worker.pid, code=code)

    def fault_redis(self) -> None:
        assert self.system.redis is not None
        t0 = time.monotonic()
        self.system.redis.restart()
        self.history.record("fault", fault="redis", down_s=round(time.monotonic() - t0, 3))

    def fault_clients(self) -> None:
        assert self.system.redis is not None
        r = redis.Redis.from_url(self.system.redis.url, socket_timeout=5.0)
        try:
            killed = r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        finally:
            r.close()
        self.history.record("fault", fault="clients", killed=int(killed))

    # ------------------------------------------------------------------ recovery

    def _watch(self, fault: str, held: dict[str, tuple[int, int]], t0: float) -> None:
        for session_id, lease in held.items():
            t = threading.Thread(target=self._recovery, args=(fault, session_id, lease, t0),
                                 name=f"chaos-watch-{session_id}", daemon=True)
            t.start()
            self._watchers.append(t)

    def _recovery(self, fault: str, session_id: str, lease: tuple[int, int], t0: float) -> None:
        """Follows a session whose lease was held when a worker went away.

        A lease renewed (expiry moved) or released under its epoch has a live holder: not
        this worker's session, nothing is recorded. Otherwise, once a line of a newer epoch
        is stored, a `recovery` candidate is recorded with the seconds since the fault; the
        checker counts it when the worker diagnostics show that epoch took the lease over.
        """
        epoch, expires = lease
        deadline = t0 + RECOVERY_WATCH_S
        while time.monotonic() < deadline:
            try:
                now = self.system.lease(session_id)
                last = self.system.last_epoch(session_id)
            except redis.RedisError:
                time.sleep(0.05)
                continue
            if now is not None and now[0] == epoch and (now[1] > expires or now[2] != "held"):
                return  # its holder is alive
            if last is not None and last > epoch:
                self.history.record("recovery", fault=fault, session=session_id, epoch=epoch, new_epoch=last,
                                    seconds=round(time.monotonic() - t0, 3))
                return
            time.sleep(0.05)
        self.history.record("recovery", fault=fault, session=session_id, epoch=epoch, new_epoch=None, seconds=None)
