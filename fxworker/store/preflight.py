"""Start-up checks of the Redis a deployment names: settings it cannot honour stop `fx web`
and `fx worker` (and a Celery worker of `fxworker.celery_app`) before they serve.

- `maxmemory-policy` other than `noeviction`: Redis may evict session keys (a session half
  gone is refused `FX_SESSION_INCOMPLETE`, one gone whole is lost), unless
  `FX_ALLOW_EVICTION=1`, which starts with one warning;
- `FX_ACK=aof` on a Redis without `WAITAOF` (older than 7.2) or with `appendonly no`;
- `FX_ACK=replica` with no replica connected.

Read with one `INFO` (which managed Redis allows where `CONFIG` is disabled). A server that
does not answer is not refused here: the processes start and wait for it as at any outage.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import redis as redis_py
from redis.exceptions import RedisError

from ..settings import Settings

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
    """`server_problems` of the Redis at `REDIS_URL` (none without one, or when it does not
    answer); logs the one warning `FX_ALLOW_EVICTION=1` starts with."""
    if not settings.redis_url:
        return []
    client = redis_py.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        info = client.info()
    except RedisError as exc:
        log.warning("start-up checks skipped: Redis did not answer (%s)", type(exc).__name__)
        return []
    finally:
        client.close()
    problems = server_problems(info, settings)
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if not problems and policy != "noeviction":
        log.warning("Redis maxmemory-policy is %r and FX_ALLOW_EVICTION=1: evicted sessions are lost or refused "
                    "FX_SESSION_INCOMPLETE", policy)
    return problems
