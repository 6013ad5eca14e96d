"""Start-up checks of the store and broker a deployment names: settings they cannot honour
stop `fx web` and `fx worker` (and a Celery worker of `fxworker.celery_app`) before they
serve.

- a store URL the server contradicts (`redis+cluster://` on one Redis), a broker URL
  fxworker cannot run on (a Redis Cluster, an unknown scheme), a broker that does not answer;
- `maxmemory-policy` other than `noeviction`: Redis may evict session keys (a session half
  gone is refused `FX_SESSION_INCOMPLETE`, one gone whole is lost), unless
  `FX_ALLOW_EVICTION=1`, which starts with one warning;
- `FX_ACK=aof` on a Redis without `WAITAOF` (older than 7.2) or with `appendonly no`;
- `FX_ACK=replica` with no replica connected;
- a store or broker URL that names a read-only replica (every write would be refused: point
  the URL at the primary, or name it through Sentinel, which follows failovers);
- a Redis Cluster whose `cluster_state` is not `ok` on some node (slots no node serves).

Read with one `INFO` per primary (which managed Redis allows where `CONFIG` is disabled) and
one `CLUSTER INFO` per primary of a cluster. A store that does not answer is not refused
here: the processes start and wait for it as at any outage; nor is a Sentinel-named primary
caught mid-failover, which the client follows. `write_refusal` and `cluster_refusal` read
the same answers for `/healthz` (web/health.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from redis.cluster import RedisCluster
from redis.exceptions import RedisError

from ..errors import FxConfigError
from ..settings import Settings
from ._boundary import client_factories, is_cluster
from ..urls import StoreAddress, masked, parse_store_url

log = logging.getLogger("fxworker.store")

REPLICA_ROLES = frozenset({"slave", "replica"})  # `role` in INFO replication of a read-only replica


def write_refusal(info: Mapping[str, object], *, min_replicas_to_write: int | None = None) -> str | None:
    """Why the Redis whose `INFO replication` is `info` refuses every write now, or None;
    names no address (it reaches HTTP clients).

    A replica answers READONLY. A primary under `min-replicas-to-write` answers NOREPLICAS
    while fewer replicas are in reach: INFO shows `min_slaves_good_slaves` only when that
    setting is on, so none good is a refusal whatever `min_replicas_to_write` (CONFIG GET,
    None where CONFIG is disabled) says; more than none is one only under a known setting.
    A full Redis (OOM) is not a refusal here: reads serve, and writes answer `FX_STORE_FULL`.
    """
    if str(info.get("role", "master")) in REPLICA_ROLES:
        return "the store is a read-only replica: writes are refused (READONLY)"
    good = info.get("min_slaves_good_slaves")
    if good is None:
        return None
    needed = max(1, min_replicas_to_write or 0)
    if _number(good) < needed:
        return (f"the store refuses writes (NOREPLICAS): {_number(good)} replica(s) in reach, "
                f"min-replicas-to-write is {min_replicas_to_write or 'at least 1'}")
    return None


def _number(value: object) -> int:
    """An INFO field that counts, as `int()` reads it (redis-py parses most to int already)."""
    if isinstance(value, (int, float, str, bytes)):
        return int(value)
    raise TypeError(f"an INFO field that is not a number: {value!r}")


def cluster_refusal(info: Mapping[str, object]) -> str | None:
    """Why a Redis Cluster node whose `CLUSTER INFO` is `info` refuses commands (CLUSTERDOWN),
    or None: its `cluster_state` is not `ok` (some slots have no node serving them)."""
    state = str(info.get("cluster_state", "ok"))
    if state == "ok":
        return None
    return (f"the Redis Cluster is down (cluster_state:{state}, {info.get('cluster_slots_ok', '?')} of 16384 "
            "slots served)")


def _replica_problem(where: str, info: Mapping[str, object], url_name: str) -> str:
    primary = f"{info.get('master_host', '?')}:{info.get('master_port', '?')}"
    return (f"{where} is a read-only replica (of {primary}, link {info.get('master_link_status', '?')}): it refuses "
            f"every write. Point {url_name} at the primary, or use Sentinel (redis+sentinel://host:26379,"
            "host:26379/<master>/0), which follows the primary through a failover")


def server_problems(info: Mapping[str, object], settings: Settings) -> list[str]:
    """What in `info` (Redis `INFO`) keeps `settings` from being honoured; each says what to change."""
    problems = []
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction" and not settings.allow_eviction:
        problems.append(
            f"Redis maxmemory-policy is {policy!r}: under memory pressure it may evict session keys. Set it to "
            "noeviction (CONFIG SET maxmemory-policy noeviction, or your provider's parameter), or set "
            "FX_ALLOW_EVICTION=1 to accept that evicted sessions are lost (404) or refused (410 FX_SESSION_INCOMPLETE)"
        )
    if settings.ack == "aof":
        version = str(info.get("redis_version", "0"))
        if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < (7, 2):
            problems.append(f"FX_ACK=aof needs WAITAOF (Redis 7.2 or newer, or Valkey); this server is {version}: "
                            "upgrade it or set FX_ACK=primary or replica")
        elif not _number(info.get("aof_enabled", 0) or 0):
            problems.append("FX_ACK=aof needs appendonly yes on the server (CONFIG SET appendonly yes), "
                            "or set FX_ACK=primary or replica")
    if settings.ack == "replica" and not _number(info.get("connected_slaves", 0) or 0):
        problems.append("FX_ACK=replica needs a replica connected to the server (none is): "
                        "add one, or set FX_ACK=primary or aof")
    return problems


def check_server(settings: Settings) -> list[str]:
    """What keeps the store and the broker `settings` name from serving: `server_problems`
    of the store's server (each primary of a cluster), a store URL the server contradicts
    (`redis+cluster://` on a server not in cluster mode), a plain URL on a read-only replica,
    a cluster whose `cluster_state` is not ok, a broker URL fxworker cannot run on, on a
    replica, or that does not answer. A store that does not answer is not refused: the processes
    start and wait for it as at any outage. Logs the one warning `FX_ALLOW_EVICTION=1`
    starts with."""
    problems: list[str] = []
    if settings.store_url:
        try:
            address = parse_store_url(settings.store_url)
        except FxConfigError as exc:
            return [f"FX_STORE_URL: {exc}"]
        infos = _store_infos(address, problems)
        if address.kind == "redis" and infos and str(infos[0][1].get("role", "master")) in REPLICA_ROLES:
            # A primary Sentinel names may be caught mid-failover (the client follows it);
            # a plain URL on a replica stays one.
            problems.append(_replica_problem(f"the store at {masked(address.url)}", infos[0][1],
                                             "REDIS_URL (or FX_STORE_URL)"))
            infos = []  # what else it says is moot
        for where, info in infos:
            found = server_problems(info, settings)
            problems += [f"{where}: {p}" if where else p for p in found]
            policy = str(info.get("maxmemory_policy", "noeviction"))
            if not found and policy != "noeviction":
                log.warning("Redis maxmemory-policy is %r and FX_ALLOW_EVICTION=1: evicted sessions are lost or "
                            "refused FX_SESSION_INCOMPLETE", policy)
    problems += broker_problems(settings)
    return problems


def _store_infos(address: StoreAddress, problems: list[str]) -> list[tuple[str, Mapping[str, object]]]:
    """(where, INFO) of each primary of the store, read with the store's own kind of client;
    adds to `problems` what contradicts the URL."""
    try:
        cluster = is_cluster(address)  # asked once per process: the store reuses the answer
        if cluster is None:
            log.warning("start-up checks skipped: the store at %s did not answer", masked(address.url))
            return []
        if address.kind == "cluster" and not cluster:
            problems.append(f"FX_STORE_URL names a Redis Cluster ({masked(address.url)}) but the server is not in "
                            "cluster mode: write redis://host:port/db for one Redis")
            return []
        _, make_sync = client_factories(address, cluster=cluster, socket_timeout_s=5.0, max_connections=2,
                                        pool_timeout_s=5.0)
        client = make_sync()
        try:
            if not cluster:
                return [("", client.info())]
            assert isinstance(client, RedisCluster)  # the factories' client of a cluster
            down = _cluster_down(client)
            if down:
                problems.append(f"the store at {masked(address.url)}: {down}: bring back or replace the failed "
                                "primaries (or add replicas that take over) until CLUSTER INFO says cluster_state:ok")
                return []
            replies = client.info(target_nodes=RedisCluster.PRIMARIES)
            if not isinstance(replies, dict) or "redis_version" in replies:
                return [("", replies)]
            return [(f"cluster node {node}", info) for node, info in replies.items()]
        finally:
            client.close()
    except RedisError as exc:
        log.warning("start-up checks skipped: the store did not answer (%s)", type(exc).__name__)
        return []


def _cluster_down(client: RedisCluster) -> str | None:
    """`cluster_refusal` of the first primary that says the cluster is down, with its address;
    a primary that does not answer is skipped (the others say whether its slots are lost)."""
    for node in client.get_primaries():
        try:
            info = node.redis_connection.execute_command("CLUSTER INFO")
        except RedisError:
            continue
        down = cluster_refusal(info)
        if down:
            return f"{down} on node {node.name}"
    return None


def broker_problems(settings: Settings) -> list[str]:
    """What keeps the broker `FX_BROKER_URL` (default `REDIS_URL`) names from carrying wakes:
    a URL fxworker cannot run on, a Redis Cluster (kombu runs on one Redis), a read-only
    replica (said once when the store's URL is the same), no answer."""
    if not settings.broker_url:
        return []
    from ..broker import broker_config

    try:
        broker = broker_config(settings.broker_url)
    except FxConfigError as exc:
        return [f"FX_BROKER_URL: {exc}"]
    if broker.kind == "redis" and is_cluster(parse_store_url(settings.broker_url)):
        return [f"the broker at {masked(settings.broker_url)} is a Redis Cluster, which Celery cannot use: set "
                "FX_BROKER_URL to a standalone (or Sentinel-managed) Redis or to RabbitMQ (amqp://)"]
    if broker.kind == "memory":
        return []
    if broker.kind == "redis":
        info = _replication_or_none(broker.url)
        if info is not None and str(info.get("role", "master")) in REPLICA_ROLES:
            if settings.broker_url == settings.store_url:
                return []  # the store's check says it
            return [_replica_problem(f"the broker at {masked(broker.url)}", info, "FX_BROKER_URL (default REDIS_URL)")]
    from kombu.connection import Connection

    conn = Connection(broker.url, transport=broker.transport, transport_options=broker.options,
                      connect_timeout=5)
    try:
        conn.ensure_connection(max_retries=1, interval_start=0, timeout=10)
    except Exception as exc:  # noqa: BLE001 - whatever the transport raised: it did not answer
        return [f"the broker at {masked(settings.broker_url)} did not answer ({type(exc).__name__}: {exc}): "
                "check FX_BROKER_URL (default REDIS_URL) and that the broker runs"]
    finally:
        conn.release()
    return []


def _replication_or_none(url: str) -> Mapping[str, object] | None:
    """`INFO replication` of the Redis at `url`, or None when it does not answer (said later)."""
    import redis as redis_py

    client = redis_py.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
    try:
        return dict(client.info("replication"))
    except RedisError:
        return None
    finally:
        client.close()
