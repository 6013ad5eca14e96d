"""The boundary with redis-py: error translation, start-up checks and client factories.

Third-party errors are translated here, once: connection failures, timeouts and error
replies become `FxStoreUnavailableError` (`map_redis_errors`). redis-py's own retries are
off, because a blind retry of a claim whose reply was lost would bump the epoch twice;
the next call simply reconnects.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import redis as redis_py
from redis.exceptions import RedisClusterException, RedisError

from fxengine.errors import FxError

from ..errors import FxStoreUnavailableError


class _MapRedisErrors:
    # A plain class, not @contextmanager: it wraps every store call, and a generator-based
    # manager costs more than a small script does on the server.
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc is None or isinstance(exc, FxError):
            return False
        if isinstance(exc, (RedisError, RedisClusterException, OSError)):
            raise FxStoreUnavailableError(f"the session store is unavailable: {type(exc).__name__}: {exc}") from exc
        return False


_MAP_REDIS_ERRORS = _MapRedisErrors()


def map_redis_errors() -> _MapRedisErrors:
    """Translates redis-py's connection and server errors into `FxStoreUnavailableError`.

    Use as `with map_redis_errors(): ...`.
    """
    return _MAP_REDIS_ERRORS


class ServerCheck:
    """Start-up checks run once per store (maxmemory-policy warning, WAITAOF support)."""

    def __init__(self) -> None:
        self.done = False


def policy_or_none(get: Callable[[], Any]) -> Any:
    try:
        return get()
    except RedisError:
        return None  # CONFIG is often disabled on managed Redis


def _no_retry(asyncio_client: bool) -> Any:
    from redis.backoff import NoBackoff

    if asyncio_client:
        from redis.asyncio.retry import Retry as AsyncRetry

        return AsyncRetry(NoBackoff(), 0)
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


def _driver_info() -> dict[str, Any]:
    """One `DriverInfo` for every connection of a pool, where redis-py has it (7.1+).

    Without it each new connection builds its own, which looks the installed redis-py
    version up in the package metadata on disk: at a burst of new connections (100 turns
    starting at once) that lookup was an eighth of the worker loop's CPU. Older redis-py
    reads the version once at import.
    """
    try:
        from redis.driver_info import DriverInfo
    except ImportError:
        return {}
    return {"driver_info": DriverInfo()}


def client_factories(
    url: str, *, cluster: bool, socket_timeout_s: float, max_connections: int, pool_timeout_s: float
) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(async factory, sync factory) of redis-py clients for `url`, retries off.

    Each client draws on a `BlockingConnectionPool` of at most `max_connections`: a call
    finding every connection busy waits for one up to `pool_timeout_s`, then fails with
    redis-py's `ConnectionError` (`FxStoreUnavailableError` once mapped) — redis-py's
    default pool fails such a call at once. On a cluster the blocking client's per-node
    pools wait alike; the asyncio cluster client has no waiting pool (its per-node limit
    fails a call at once), so it keeps its unbounded default and the store bounds its
    calls itself (`RedisStore`).
    """
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections}")
    common: dict[str, Any] = {"socket_timeout": socket_timeout_s, "socket_connect_timeout": socket_timeout_s}
    if cluster:
        import redis.asyncio.cluster as async_cluster
        import redis.cluster as sync_cluster

        return (
            lambda: async_cluster.RedisCluster.from_url(url, **common),
            lambda: sync_cluster.RedisCluster.from_url(
                url, connection_pool_class=redis_py.BlockingConnectionPool, max_connections=max_connections,
                timeout=pool_timeout_s, **common,
            ),
        )
    import redis.asyncio as async_redis

    common.update(_driver_info())

    def make_async() -> Any:
        pool = async_redis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=pool_timeout_s, retry=_no_retry(True), **common
        )
        return async_redis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it

    def make_sync() -> Any:
        pool = redis_py.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=pool_timeout_s, retry=_no_retry(False), **common
        )
        return redis_py.Redis.from_pool(pool)

    return make_async, make_sync
