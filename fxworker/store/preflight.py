"""Start-up checks of the store and broker a deployment names: settings they cannot honour
stop `fx web` and `fx worker` (and a Celery worker of `fxworker.celery_app`) before they
serve.

- a store URL the server contradicts (`redis+cluster://` on one Redis), a broker URL
  fxworker cannot run on (a Redis Cluster, an unknown scheme), a broker that does not answer;
- `maxmemory-policy` other than `noeviction`: Redis may evict session keys (a session half
  gone is refused `FX_SESSION_INCOMPLETE`, one gone whole is lost), unless
  `FX_ALLOW_EVICTION=1`, which starts with one warning;
- `FX_ACK=aof` on a Redis without `WAITAOF` (older than 7.2) or with `appendonly no`;
- `FX_ACK=replica` with no replica connected.

Read with one `INFO` per primary (which managed Redis allows where `CONFIG` is disabled). A
store that does not answer is not refused here: the processes start and wait for it as at
any outage.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from redis.exceptions import RedisError

from ..errors import FxConfigError
from ..settings import Settings
from ._boundary import client_factories, is_cluster
from ..urls import StoreAddress, masked, parse_store_url

log = logging.getLogger("fxworker.store")


def server_problems(info: Mapping[str, Any], settings: Settings) -> list[str]:
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
        elif not int(info.get("aof_enabled", 0) or 0):
            problems.append("FX_ACK=aof needs appendonly yes on the server (CONFIG SET appendonly yes), "
                            "or set FX_ACK=primary or replica")
    if settings.ack == "replica" and not int(info.get("connected_slaves", 0) or 0):
        problems.append("FX_ACK=replica needs a replica connected to the server (none is): "
                        "add one, or set FX_ACK=primary or aof")
    return problems


def check_server(settings: Settings) -> list[str]:
    """What keeps the store and the broker `settings` name from serving: `server_problems`
    of the store's server (each primary of a cluster), a store URL the server contradicts
    (`redis+cluster://` on a server not in cluster mode), a broker URL fxworker cannot run
    on or that does not answer. A store that does not answer is not refused: the processes
    start and wait for it as at any outage. Logs the one warning `FX_ALLOW_EVICTION=1`
    starts with."""
    problems: list[str] = []
    if settings.store_url:
        try:
            address = parse_store_url(settings.store_url)
        except FxConfigError as exc:
            return [f"FX_STORE_URL: {exc}"]
        infos = _store_infos(address, problems)
        for where, info in infos:
            found = server_problems(info, settings)
            problems += [f"{where}: {p}" if where else p for p in found]
            policy = str(info.get("maxmemory_policy", "noeviction"))
            if not found and policy != "noeviction":
                log.warning("Redis maxmemory-policy is %r and FX_ALLOW_EVICTION=1: evicted sessions are lost or "
                            "refused FX_SESSION_INCOMPLETE", policy)
    problems += broker_problems(settings)
    return problems


def _store_infos(address: StoreAddress, problems: list[str]) -> list[tuple[str, Mapping[str, Any]]]:
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
            from redis.cluster import RedisCluster

            replies = client.info(target_nodes=RedisCluster.PRIMARIES)
            if not isinstance(replies, dict) or "redis_version" in replies:
                return [("", replies)]
            return [(f"cluster node {node}", info) for node, info in replies.items()]
        finally:
            client.close()
    except RedisError as exc:
        log.warning("start-up checks skipped: the store did not answer (%s)", type(exc).__name__)
        return []


def broker_problems(settings: Settings) -> list[str]:
    """What keeps the broker `FX_BROKER_URL` (default `REDIS_URL`) names from carrying wakes:
    a URL fxworker cannot run on, a Redis Cluster (kombu runs on one Redis), no answer."""
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
