"""The system a chaos run puts under load: its own parts, all real processes on loopback.

- a `redis-server` with `appendonly yes` and `maxmemory-policy noeviction` on a free port
  (restarted by the nemesis, its data surviving through the AOF; its memory limit lowered
  and restored by the nemesis, which `CONFIG SET` may do: the server is the run's own);
- the scripted model server (in this process), answering with random delays, stalling
  some streams when the nemesis says so (`MODEL_IDLE_TIMEOUT_S`);
- one web process (`fx web`, `tests.web._server.WebProcess`), which the workload talks HTTP to;
- a pool of N Celery worker processes (`tests.chaos.faults.Pool`, agents of
  `tests.chaos.agents`), which the nemesis kills, freezes and stops and refills.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from fxengine.testing import ScriptedModel
from fxworker.keys import queue_name, session_keys
from tests.chaos.faults import Pool, fault_env
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, Workers
from tests.web._server import WebProcess

T = TypeVar("T")

# A short lease and a fast sweep make takeovers quick; a short delivery makes long turns
# yield (soft stop at timeout - reserve) and a tool that outlasts it be cut off.
LEASE_S = 2.0
SWEEP_S = 0.5
RESERVE_S = 4.0
DELIVERY_TIMEOUT_S = 12.0
# A model stream silent this long fails its step FX_PROVIDER_TIMEOUT: short, so a stalled
# stream costs seconds; the script's longest ordinary pause stays well below it.
MODEL_IDLE_TIMEOUT_S = 2.0
# The agents' queues the workers consume (`Pool.start`), and the broker's dead-letter list
# (an entry the transport cannot decode is moved there).
QUEUES = ("default",)
DEAD_LETTER = "dead"


class System:
    """Starts and stops the parts; answers the store questions the nemesis and the run ask."""

    def __init__(self, *, workers: int, prefix: str, api_key: str, responder: Callable[[Any], Any],
                 worker_env: dict[str, str] | None = None) -> None:
        self.size = workers
        self.prefix = prefix
        self.api_key = api_key
        self.responder = responder
        self.worker_env = dict(worker_env or {})
        self.redis: RedisServer | None = None
        self.model: ScriptedModel | None = None
        self.web: WebProcess | None = None
        self.pool: Pool | None = None
        self._workers: Workers | None = None
        self._client: redis.Redis | None = None

    def start(self) -> System:
        # noeviction stated, not assumed: a squeeze must refuse writes, never drop keys.
        self.redis = RedisServer(appendonly=True, args=("--maxmemory-policy", "noeviction"))
        self.model = ScriptedModel(responder=self.responder).start()
        env = fault_env(self.model, FX_LEASE_S=str(LEASE_S), FX_SWEEP_S=str(SWEEP_S), FX_RESERVE_S=str(RESERVE_S),
                        FX_DELIVERY_TIMEOUT_S=str(DELIVERY_TIMEOUT_S), FX_TEST_API_KEY=self.api_key,
                        FX_MODEL_IDLE_TIMEOUT_S=str(MODEL_IDLE_TIMEOUT_S), FX_LOG_LEVEL="WARNING",
                        **self.worker_env)
        self._workers = Workers(redis_url=self.redis.url, prefix=self.prefix)
        self.pool = Pool(self._workers, env, size=self.size, concurrency=8)
        self.pool.fill()
        self.web = WebProcess(env=self._web_env(env)).wait_ready()
        return self

    def _web_env(self, worker_env: dict[str, str]) -> dict[str, str]:
        assert self.redis is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("FX_")}
        env.update(worker_env)
        env.update(REDIS_URL=self.redis.url, FX_PREFIX=self.prefix,
                   PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
        return env

    def close(self) -> None:
        if self.web is not None:
            self.web.close()
        if self._workers is not None:
            self._workers.close()
        if self.model is not None:
            self.model.close()
        if self._client is not None:
            self._client.close()
        if self.redis is not None:
            self.redis.close()

    # ------------------------------------------------------------------ store reads

    def client(self) -> redis.Redis:
        assert self.redis is not None
        if self._client is None:
            self._client = redis.Redis.from_url(self.redis.url, socket_timeout=5.0)
        return self._client

    def retrying(self, read: Callable[[redis.Redis], T], timeout_s: float = 30.0) -> T:
        """`read(client)`, run again on a fresh connection while Redis restarts or drops us."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return read(self.client())
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def lines(self, session_id: str) -> list[dict[str, Any]]:
        """Every line the store holds for the session, in cursor order."""
        key = session_keys(self.prefix, session_id).ui
        entries = self.retrying(lambda r: r.xrange(key))
        return [json.loads(fields[b"l"]) for _, fields in entries]

    def last_epoch(self, session_id: str) -> int | None:
        """The epoch of the session's newest stored line (None: no line yet)."""
        key = session_keys(self.prefix, session_id).ui
        entries = self.retrying(lambda r: r.xrevrange(key, count=1), timeout_s=5.0)
        return int(json.loads(entries[0][1][b"l"])["epoch"]) if entries else None

    def held_leases(self, session_ids: list[str]) -> dict[str, tuple[int, int]]:
        """Session id -> (lease epoch, expires_ms) of those whose lease is held (a delivery runs)."""
        def read(r: redis.Redis) -> list[Any]:
            pipe = r.pipeline(transaction=False)
            for session_id in session_ids:
                pipe.hmget(session_keys(self.prefix, session_id).lease, "state", "epoch", "expires_ms")
            return list(pipe.execute())

        replies = self.retrying(read, timeout_s=5.0)
        held: dict[str, tuple[int, int]] = {}
        for session_id, (state, epoch, expires) in zip(session_ids, replies):
            if state == b"held" and epoch is not None and expires is not None:
                held[session_id] = (int(epoch), int(expires))
        return held

    def lease(self, session_id: str) -> tuple[int, int, str] | None:
        """(epoch, expires_ms, state) of the session's lease, None when it has none."""
        keys = session_keys(self.prefix, session_id)
        state, epoch, expires = self.retrying(lambda r: r.hmget(keys.lease, "state", "epoch", "expires_ms"),
                                              timeout_s=5.0)
        if epoch is None:
            return None
        return int(epoch), int(expires or 0), (state or b"").decode()

    # ------------------------------------------------------------------ broker

    def broker_key(self, name: str) -> str:
        """A broker key: kombu prefixes every key with `<prefix>:celery:` (`global_keyprefix`,
        fxworker/celery_app.py); a queue's list is its name (priority 0 has no suffix)."""
        return f"{self.prefix}:celery:{name}"

    def queue_keys(self) -> list[str]:
        """The Celery queue lists the workers pop wakes from."""
        return [self.broker_key(queue_name(q)) for q in QUEUES]

    def dead_letter_key(self) -> str:
        return self.broker_key(DEAD_LETTER)

    def entries(self, key: str) -> list[bytes]:
        return list(self.retrying(lambda r: r.lrange(key, 0, -1)))

    # ------------------------------------------------------------------ memory

    def memory(self) -> tuple[int, int]:
        """(used_memory, maxmemory) of the server, in bytes."""
        info = self.retrying(lambda r: r.info("memory"), timeout_s=5.0)
        return int(info["used_memory"]), int(info["maxmemory"])

    def set_maxmemory(self, limit: int) -> None:
        """`CONFIG SET maxmemory` (0: no limit); not in the AOF, so a restart clears it."""
        self.retrying(lambda r: r.config_set("maxmemory", limit), timeout_s=10.0)

    def oom_replies(self) -> int:
        """How many commands the server has refused with an OOM error reply since it started."""
        stats = self.retrying(lambda r: r.info("errorstats"), timeout_s=5.0)
        return int((stats.get("errorstat_OOM") or {}).get("count", 0))

    # ------------------------------------------------------------------ workers

    def exits(self, *, except_pids: set[int]) -> list[dict[str, Any]]:
        """The worker processes that have exited, but for those in `except_pids` (the ones a
        fault killed or stopped): pid, exit code and the end of its log."""
        assert self.pool is not None
        return [{"pid": w.pid, "code": w.proc.returncode, "log": w.log_tail(20_000)}
                for w in self.pool.workers.started
                if w.proc is not None and w.proc.poll() is not None and w.pid not in except_pids]
