"""The nemesis of a chaos run: faults on a seeded schedule, each one recorded.

Every few seconds (a gap drawn from the seed) it does one of:

- `kill`: kill -9 a worker process, then start a replacement;
- `stop`: SIGSTOP a worker past its lease (`LEASE_S` + 1.5 s), then SIGCONT it: another
  worker takes its sessions over, and the woken one's writes must all be fenced (§11.4);
- `term`: SIGTERM a worker (a deploy: its turns yield and it exits), start a replacement;
- `redis`: restart the Redis server (SIGTERM, start again on its port; the AOF keeps the data);
- `clients`: `CLIENT KILL TYPE normal` (every client connection but the nemesis's own);
- `poison`: LPUSH one malformed message of each kind (`tests.chaos.poison`), in a seeded
  order, into each worker queue list: the workers must move them to the dead-letter list
  and go on serving (the run checks that no worker exited unprompted);
- `squeeze`: `CONFIG SET maxmemory` just above the server's `used_memory` (noeviction:
  writes are refused with OOM), held for 2 to 5 s, then 0 again (`restored`, with the count
  of OOM replies the server sent meanwhile);
- `stall`: the model's next stream goes silent past the workers' idle timeout, before its
  first chunk or after one; before it, sometimes twice in a row (the retry stalls too, and
  the turn ends `error`); the script records each stream it stalled (`stalled`);
- `typed`: arms a kill of the worker the model next serves an invalid answer to a typed
  turn (`ModelScript.arm_typed_kill`): kill -9 that worker a drawn offset (`TYPED_KILL_S`)
  from when the reply has been sent, just before (the refused answer is lost with the
  stream) or after it (the verdict may be journaled: the resumed turn must carry its
  errors), recorded as a `kill` (`typed=True`) and replaced; an arm that never fired is
  dropped when the schedule ends (the history's `typed_disarmed`);
- `primary` (only on a cluster store, `System(cluster=True)`): kill -9 the cluster primary
  serving a session whose lease is held (else any session's, else the first primary),
  wait until its replica serves its slots (`failover_s`), then start the node again and
  wait until it is an online replica (`rejoined`, `rejoin_s`): `FX_ACK=replica` writes of
  that shard are refused until then. Every other one (the first, the third, ...) flaps:
  once the node is a replica, a second failover is forced back to it (`CLUSTER FAILOVER
  FORCE`) while its shard serves, and the demoted node must replicate again (`failed_back`,
  `failback_s`). On a cluster `redis`, `clients` and `squeeze` act
  on the AOF server, which is then the broker alone (`tests.chaos.system`).

The first round does each kind once, in a seeded order, and always completes (even past
`stop_at`), so every run has each; after that the kinds are drawn at random until
`stop_at`. Before each fault, a worker that exited with no fault stopping it is replaced
(the run reports each such exit and fails). For a `kill` or `stop`, every session whose lease is held (a delivery runs) is
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

from tests.chaos import poison
from tests.chaos.history import History
from tests.chaos.system import LEASE_S, MODEL_IDLE_TIMEOUT_S, STORE_ERRORS, System
from tests.chaos.workload import STALL_WHERE, ModelScript, Stall
from tests.support.workers import CeleryWorker

KINDS = ("kill", "stop", "term", "redis", "clients", "poison", "squeeze", "stall", "typed")
# The kinds of a run on a cluster store: the failover of a primary besides the others.
CLUSTER_KINDS = (*KINDS, "primary")
WEIGHTS = {"kill": 3, "stop": 2, "term": 1, "redis": 1, "clients": 2, "poison": 1, "squeeze": 1, "stall": 2,
           "typed": 1, "primary": 2}
STOP_PAST_LEASE_S = LEASE_S + 1.5
RECOVERY_WATCH_S = 30.0
SQUEEZE_S = (2.0, 5.0)
SQUEEZE_HEADROOM_BYTES = (4 * 1024, 48 * 1024)  # maxmemory = used_memory + this: full in about a second
STALL_TIMES = (2.5, 4.0)  # a stall lasts this many idle timeouts
TYPED_KILL_S = (-0.05, 0.15)  # a typed kill's offset from when the invalid answer has been sent


class Nemesis:
    """Runs the fault schedule in a thread until `stop_at`."""

    def __init__(self, system: System, script: ModelScript, sessions: dict[str, str], *, seed: int,
                 history: History, stop_at: float, gap_s: tuple[float, float] = (2.5, 5.0),
                 kinds: tuple[str, ...] = KINDS) -> None:
        self.system = system
        self.script = script
        self.sessions = sessions  # session tag (s<i>) -> session id, filled by the drivers
        self.seed = seed
        self.kinds = tuple(k for k in CLUSTER_KINDS if k in kinds)
        self.rng = random.Random(f"nemesis-{seed}")
        self._poisoned = 0
        self._primaries_killed = 0  # every other primary fault flaps (counted, not drawn: the schedule's draws stay as seeded)
        self.history = history
        self.stop_at = stop_at
        self.gap_s = gap_s
        self._done = threading.Event()
        self._pool_lock = threading.Lock()  # a typed kill replaces its worker from a thread of its own
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
        dropped = self.script.disarm_typed_kills()
        if dropped:
            self.history.record("typed_disarmed", arms=dropped)
        for t in list(self._watchers) + list(self._terminating):
            t.join(timeout_s)

    def schedule(self) -> Iterator[str]:
        """Each kind once in a seeded order, then kinds drawn by `WEIGHTS`."""
        first = list(self.kinds)
        self.rng.shuffle(first)
        yield from first
        while True:
            yield self.rng.choices(self.kinds, [WEIGHTS[k] for k in self.kinds])[0]

    def run(self) -> None:
        for i, kind in enumerate(self.schedule()):
            gap = self.rng.uniform(*self.gap_s)
            if i < len(self.kinds):
                time.sleep(gap)  # the first round always completes: every run has each kind
            elif self._done.wait(gap) or time.monotonic() >= self.stop_at:
                return
            try:
                self._refill()
                getattr(self, f"fault_{kind}")()
            except Exception as exc:  # a fault that could not be applied is recorded, not fatal
                self.history.record("fault_failed", fault=kind, error=repr(exc))

    def _refill(self) -> None:
        """Replaces workers that exited with no fault stopping them (the run fails on each, but
        the schedule goes on against a full pool)."""
        assert self.system.pool is not None
        with self._pool_lock:
            while len(self.system.pool.live()) < self.system.size:
                self._replace("exited unprompted")

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

    def fault_poison(self) -> None:
        pushed = []
        for key in self.system.queue_keys():
            kinds = list(poison.KINDS)
            self.rng.shuffle(kinds)
            raws = []
            for kind in kinds:
                self._poisoned += 1
                mark = poison.marker(self.seed, self._poisoned)
                raw, variant = poison.message(kind, mark, self.rng)
                raws.append(raw)
                pushed.append({"queue": key, "kind": kind, "variant": variant, "marker": mark})
            self.system.retrying(lambda r, k=key, v=tuple(raws): r.lpush(k, *v), timeout_s=5.0, broker=True)
        self.history.record("fault", fault="poison", messages=pushed)

    def fault_squeeze(self) -> None:
        hold_s = round(self.rng.uniform(*SQUEEZE_S), 3)
        headroom = self.rng.randint(*SQUEEZE_HEADROOM_BYTES)
        oom_before = self.system.oom_replies()
        used, _ = self.system.memory()
        self.system.set_maxmemory(used + headroom)
        self.history.record("fault", fault="squeeze", used=used, maxmemory=used + headroom, hold_s=hold_s)
        try:
            time.sleep(hold_s)
        finally:
            used_then, _ = self.system.memory()
            self.system.set_maxmemory(0)
            self.history.record("fault", fault="restored", used=used_then,
                                oom_replies=self.system.oom_replies() - oom_before)

    def fault_stall(self) -> None:
        where = self.rng.choice(STALL_WHERE)
        repeat = self.rng.choice((1, 2)) if where == "before" else 1
        ms = round(self.rng.uniform(*STALL_TIMES) * MODEL_IDLE_TIMEOUT_S * 1000)
        self.script.arm_stall(Stall(where, ms, repeat))
        self.history.record("fault", fault="stall", where=where, ms=ms, repeat=repeat)

    def fault_typed(self) -> None:
        offset = round(self.rng.uniform(*TYPED_KILL_S), 3)
        self.script.arm_typed_kill(lambda pid, after_s: self._typed_kill(pid, after_s + offset))
        self.history.record("fault", fault="typed", offset_s=offset)

    def _typed_kill(self, pid: int, after_s: float) -> None:
        """Called by the model script as it serves the invalid answer: kills `pid` in a thread."""
        t = threading.Thread(target=self._kill_after, args=(pid, after_s), name=f"chaos-typed-kill-{pid}", daemon=True)
        t.start()
        self._terminating.append(t)

    def _kill_after(self, pid: int, after_s: float) -> None:
        if self._done.wait(max(0.0, after_s)):
            self.history.record("typed_disarmed", arms=1, pid=pid)  # the schedule ended meanwhile
            return
        assert self.system.pool is not None
        with self._pool_lock:
            worker = next((w for w in self.system.pool.live() if w.pid == pid), None)
            if worker is None:  # gone already (another fault): nothing to kill
                self.history.record("typed_disarmed", arms=1, pid=pid)
                return
            held = self._held()
            t0 = time.monotonic()
            worker.kill()
            self.history.record("fault", fault="kill", pid=worker.pid, typed=True)
            self._watch("kill", held, t0)
            self._replace("kill")

    def fault_primary(self) -> None:
        active = sorted(self._held()) or sorted(sid for sid in list(self.sessions.values()) if sid)
        session_id = self.rng.choice(active) if active else None
        node = self.system.primary_for(session_id)
        try:
            failover_s = self.system.kill_primary(node)
            self.history.record("fault", fault="primary", port=node.port, session=session_id,
                                failover_s=round(failover_s, 3))
        finally:  # a failover that timed out still gets its node back
            rejoin_s = self.system.rejoin(node)
            self.history.record("fault", fault="rejoined", port=node.port, rejoin_s=round(rejoin_s, 3))
        self._primaries_killed += 1
        if self._primaries_killed % 2 == 1:
            failback_s = self.system.fail_back(node)
            self.history.record("fault", fault="failed_back", port=node.port, failback_s=round(failback_s, 3))

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
            except STORE_ERRORS:
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
