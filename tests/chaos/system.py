"""The system a chaos run puts under load: its own parts, all real processes on loopback.

- a `redis-server` with `appendonly yes` and `maxmemory-policy noeviction` on a free port
  (restarted by the nemesis, its data surviving through the AOF; its memory limit lowered
  and restored by the nemesis, which `CONFIG SET` may do: the server is the run's own);
- the scripted model server (in this process), answering with random delays, stalling
  some streams when the nemesis says so (`MODEL_IDLE_TIMEOUT_S`);
- two web processes (`fx web`, `tests.web._server.WebProcess`): the workload talks HTTP to
  the first (`web`); the deciders of parked calls (`tests.chaos.approvals`) to either, and
  to both at once for one call (`web2`);
- a pool of N Celery worker processes (`tests.chaos.faults.Pool`, agents of
  `tests.chaos.agents`), which the nemesis kills, freezes and stops and refills; they
  consume `fx.default` and `fx.typed`, and run `default`, `typed` (typed answers) and `late`
  (whose queue none consumes: `tests.chaos.wakes.Valve`); the web process also declares
  `ghost`, which none runs (`WAKE_AGENTS`, `NO_AGENT_GIVE_UP_S`).

With `cluster=True` the store is a Redis Cluster of its own (3 primaries, each with a
replica: `tests.support.redis_topology.RedisClusterProcesses`, no persistence: a killed
primary's data lives on in its replica) and the AOF server above is the Celery broker
only: workers and web get `FX_STORE_URL` (the cluster's seed URL), `FX_BROKER_URL` and
`REDIS_URL` (the broker, where the fault tools also record their starts and diagnostics:
`tests.chaos.tooling`), and `FX_ACK=replica`, so an acknowledged write is on a replica
before a primary can be killed. Store reads (`retrying`) go to the cluster, broker reads
(`retrying(..., broker=True)`: queues, dead letters, tool records, memory) to the broker.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.exceptions import RedisClusterException

from fxengine.testing import ScriptedModel
from fxworker.keys import queue_name, session_keys
from fxworker.store import store_clients
from tests.chaos.faults import Pool, fault_env
from tests.support.redis_server import RedisServer
from tests.support.redis_topology import RedisClusterProcesses, replica_online
from tests.support.stored import stored_lines
from tests.support.workers import ROOT, Workers, wait_until
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
# The agents' queues the workers consume (`Pool.start`): `default`'s and `typed`'s (whose
# turns answer with a typed object, `tests.chaos.agents`), and the broker's dead-letter list
# (an entry the transport cannot decode is moved there).
QUEUES = ("default", "typed")
# Every agent's wake queue: `late` (run by every worker, its queue consumed through the
# caller's valve, `tests.chaos.wakes.Valve`) and `ghost` (known to the web process alone:
# no worker runs it) besides the consumed ones (`tests.chaos.agents`).
WAKE_AGENTS = (*QUEUES, "late", "ghost")
# A session whose agent no live worker runs ends its inputs FX_NO_AGENT this long after
# its first wake found none: short, so a run sees it happen (the default is minutes).
NO_AGENT_GIVE_UP_S = 8.0
DEAD_LETTER = "dead"
# What a store read may raise while a node restarts or a cluster shard fails over (a slot
# no node serves is a `RedisClusterException`, not a `RedisError`).
STORE_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
CLUSTER_PRIMARIES = 3  # each with one replica
# A killed primary's replica takes over within a few cluster node timeouts (2 s each); the
# restarted node's full sync of a small data set takes seconds more on a loaded machine.
FAILOVER_TIMEOUT_S = 30.0
REJOIN_TIMEOUT_S = 60.0


class System:
    """Starts and stops the parts; answers the store questions the nemesis and the run ask."""

    def __init__(self, *, workers: int, prefix: str, api_key: str, responder: Callable[[Any], Any],
                 worker_env: dict[str, str] | None = None, cluster: bool = False) -> None:
        self.size = workers
        self.prefix = prefix
        self.api_key = api_key
        self.responder = responder
        self.worker_env = dict(worker_env or {})
        self.redis: RedisServer | None = None
        self.cluster: RedisClusterProcesses | None = None
        self._cluster_wanted = cluster
        self.model: ScriptedModel | None = None
        self.web: WebProcess | None = None
        self.web2: WebProcess | None = None
        self.pool: Pool | None = None
        self._workers: Workers | None = None
        self._client: Any = None
        self._broker: redis.Redis | None = None
        self._client_lock = threading.Lock()

    def start(self) -> System:
        # noeviction stated, not assumed: a squeeze must refuse writes, never drop keys.
        self.redis = RedisServer(appendonly=True, args=("--maxmemory-policy", "noeviction"))
        store: dict[str, str] = {}
        if self._cluster_wanted:
            self.cluster = RedisClusterProcesses(primaries=CLUSTER_PRIMARIES, replicas=1)
            store = {"FX_STORE_URL": self.cluster.seed_url, "FX_BROKER_URL": self.redis.url, "FX_ACK": "replica"}
        self.model = ScriptedModel(responder=self.responder).start()
        env = fault_env(self.model, FX_LEASE_S=str(LEASE_S), FX_SWEEP_S=str(SWEEP_S), FX_RESERVE_S=str(RESERVE_S),
                        FX_DELIVERY_TIMEOUT_S=str(DELIVERY_TIMEOUT_S), FX_TEST_API_KEY=self.api_key,
                        FX_MODEL_IDLE_TIMEOUT_S=str(MODEL_IDLE_TIMEOUT_S), FX_LOG_LEVEL="WARNING",
                        FX_NO_AGENT_GIVE_UP_S=str(NO_AGENT_GIVE_UP_S), **store, **self.worker_env)
        self._workers = Workers(redis_url=self.redis.url, prefix=self.prefix)
        self.pool = Pool(self._workers, env, size=self.size, concurrency=8, queues=QUEUES)
        self.pool.fill()
        self.web = WebProcess(env=self._web_env(env))
        self.web2 = WebProcess(env=self._web_env(env))
        self.web.wait_ready()
        self.web2.wait_ready()
        return self

    def _web_env(self, worker_env: dict[str, str]) -> dict[str, str]:
        assert self.redis is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("FX_")}
        env.update(worker_env)
        # The web process alone declares the agent `ghost`, which no worker runs.
        env.update(REDIS_URL=self.redis.url, FX_PREFIX=self.prefix, FX_TEST_GHOST_AGENT="1",
                   PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
        return env

    def close(self) -> None:
        for web in (self.web, self.web2):
            if web is not None:
                web.close()
        if self._workers is not None:
            self._workers.close()
        if self.model is not None:
            self.model.close()
        if self._client is not None:
            self._client.close()
        if self._broker is not None:
            self._broker.close()
        if self.cluster is not None:
            self.cluster.close()
        if self.redis is not None:
            self.redis.close()

    # ------------------------------------------------------------------ store reads

    def client(self) -> Any:
        """The store's client: a `redis.Redis`, or on a cluster a `RedisCluster` (one
        session's keys share a slot, so a single-key command or a pipeline of them works)."""
        assert self.redis is not None
        with self._client_lock:
            if self._client is None:
                if self.cluster is not None:
                    self._client = store_clients(self.cluster.seed_url, max_connections=32)[1]()
                else:
                    self._client = redis.Redis.from_url(self.redis.url, socket_timeout=5.0)
            return self._client

    def broker(self) -> redis.Redis:
        """The broker's client (on a standalone store, `client()`: the same server)."""
        assert self.redis is not None
        if self.cluster is None:
            return self.client()  # type: ignore[no-any-return]
        with self._client_lock:
            if self._broker is None:
                self._broker = redis.Redis.from_url(self.redis.url, socket_timeout=5.0)
            return self._broker

    def retrying(self, read: Callable[[Any], T], timeout_s: float = 30.0, *, broker: bool = False) -> T:
        """`read(client)` on the store (or the broker), run again on a fresh connection while
        Redis restarts or drops us, or a cluster shard fails over."""
        deadline = time.monotonic() + timeout_s
        while True:
            client = self.broker() if broker else self.client()
            try:
                return read(client)
            except STORE_ERRORS:
                if time.monotonic() > deadline:
                    raise
                if client is self._client and self.cluster is not None:
                    self._drop_store_client(client)
                time.sleep(0.1)

    def _drop_store_client(self, client: Any) -> None:
        """Forgets a cluster client whose view of the slots failed it: the next read builds
        one from the seed nodes (another thread still using the old one fails and retries)."""
        with self._client_lock:
            if self._client is client:
                self._client = None
        try:
            client.close()
        except Exception:  # its connections to a dead node may fail to close: nothing to keep
            pass

    def each_server(self, read: Callable[[redis.Redis], list[T]]) -> list[T]:
        """`read` on every server that holds keys of this run, concatenated: the broker,
        and on a cluster each primary (a plain client of a node reads the keys of its slots)."""
        found = list(self.retrying(read, broker=True))
        if self.cluster is not None:
            for node in self.cluster.primaries():
                client = redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=5.0)
                try:
                    found.extend(read(client))
                finally:
                    client.close()
        return found

    def data_dirs(self) -> list[Path]:
        """The directories the servers write to (AOF files, cluster node configs, logs)."""
        assert self.redis is not None
        return [self.redis.dir, *(n.dir for n in (self.cluster.nodes if self.cluster is not None else ()))]

    def lines(self, session_id: str) -> list[dict[str, Any]]:
        """Every line the store holds for the session, in cursor order."""
        keys = session_keys(self.prefix, session_id)
        return [json.loads(text) for text in self.retrying(lambda r: stored_lines(r, keys, session_id))]

    def last_epoch(self, session_id: str) -> int | None:
        """The epoch of the session's newest stored line (None: no line yet)."""
        keys = session_keys(self.prefix, session_id)
        lines = self.retrying(lambda r: stored_lines(r, keys, session_id, newest=True), timeout_s=5.0)
        return int(json.loads(lines[-1])["epoch"]) if lines else None

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

    def epoch(self, session_id: str) -> int:
        """The session's epoch: the number of claims it has had (meta `epoch`, which a claim
        bumps, or the lease's; 0 before the first), whether or not they stored a line."""
        keys = session_keys(self.prefix, session_id)

        def read(r: Any) -> list[Any]:
            pipe = r.pipeline(transaction=False)
            pipe.hget(keys.meta, "epoch")
            pipe.hget(keys.lease, "epoch")
            return list(pipe.execute())

        return max(int(v or 0) for v in self.retrying(read))

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

    def wake_queue_keys(self) -> list[str]:
        """Every agent's wake queue list, consumed or not (`WAKE_AGENTS`)."""
        return [self.broker_key(queue_name(a)) for a in WAKE_AGENTS]

    def dead_letter_key(self) -> str:
        return self.broker_key(DEAD_LETTER)

    def entries(self, key: str) -> list[bytes]:
        """A broker list's entries."""
        return list(self.retrying(lambda r: r.lrange(key, 0, -1), broker=True))

    # ------------------------------------------------------------------ memory
    # The AOF server's: the store and the broker, or on a cluster the broker alone.

    def memory(self) -> tuple[int, int]:
        """(used_memory, maxmemory) of the server, in bytes."""
        info = self.retrying(lambda r: r.info("memory"), timeout_s=5.0, broker=True)
        return int(info["used_memory"]), int(info["maxmemory"])

    def set_maxmemory(self, limit: int) -> None:
        """`CONFIG SET maxmemory` (0: no limit); not in the AOF, so a restart clears it."""
        self.retrying(lambda r: r.config_set("maxmemory", limit), timeout_s=10.0, broker=True)

    def oom_replies(self) -> int:
        """How many commands the server has refused with an OOM error reply since it started."""
        stats = self.retrying(lambda r: r.info("errorstats"), timeout_s=5.0, broker=True)
        return int((stats.get("errorstat_OOM") or {}).get("count", 0))

    # ------------------------------------------------------------------ cluster

    def primary_for(self, session_id: str | None) -> RedisServer:
        """The cluster primary serving `session_id`'s keys (None: the first primary)."""
        assert self.cluster is not None
        if session_id is None:
            return self.cluster.primaries()[0]
        return self.cluster.primary_of(session_keys(self.prefix, session_id).lease)

    def kill_primary(self, node: RedisServer) -> float:
        """kill -9 of a cluster primary; returns the seconds until its replica served its
        slots and every live node said the cluster is ok."""
        assert self.cluster is not None
        return self.cluster.kill(node, timeout_s=FAILOVER_TIMEOUT_S)

    def rejoin(self, node: RedisServer) -> float:
        """Starts a killed node again (its port and directory: its node config makes it
        rejoin, as a replica of its old shard's new primary) and waits until every primary
        has an online replica: until then `FX_ACK=replica` refuses that shard's writes.
        Returns the seconds it took."""
        assert self.cluster is not None
        started = time.monotonic()
        if node.proc is None:
            node.start()
        cluster = self.cluster

        def replicated() -> bool:
            try:
                primaries = cluster.primaries()
                return len(primaries) == CLUSTER_PRIMARIES and all(replica_online(p.port) for p in primaries)
            except STORE_ERRORS:  # a node still loading, or one the cluster is reconfiguring
                return False

        wait_until(replicated, REJOIN_TIMEOUT_S, interval_s=0.05, what=f"{node!r} replicating again")
        return time.monotonic() - started

    def fail_back(self, node: RedisServer) -> float:
        """A second failover at once, back to `node` (a rejoined replica): `CLUSTER FAILOVER
        FORCE` while its shard's new primary serves, then the wait until every primary has
        an online replica again (the demoted one replicates from `node`). Returns the seconds."""
        assert self.cluster is not None
        started = time.monotonic()
        self.cluster.promote(node, timeout_s=FAILOVER_TIMEOUT_S)
        self.rejoin(node)
        return time.monotonic() - started

    # ------------------------------------------------------------------ workers

    def exits(self, *, except_pids: set[int]) -> list[dict[str, Any]]:
        """The worker processes that have exited, but for those in `except_pids` (the ones a
        fault killed or stopped): pid, exit code and the end of its log."""
        assert self.pool is not None
        return [{"pid": w.pid, "code": w.proc.returncode, "log": w.log_tail(20_000)}
                for w in self.pool.workers.started
                if w.proc is not None and w.proc.poll() is not None and w.pid not in except_pids]
