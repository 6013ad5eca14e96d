"""The boundary with redis-py: error translation, start-up checks and client factories.

Third-party errors are translated here, once: connection failures, timeouts and error
replies become `FxStoreUnavailableError` (`map_redis_errors`), with a message that names
the failure but not the server's address. redis-py's own retries are off, because a
blind retry of a claim whose reply was lost would bump the epoch twice.

A connection Redis closed while it sat in the pool (a restart, `CLIENT KILL`, an idle
`timeout`) must not cost a caller an error: the pool checks a connection for a close
before handing it out and reconnects (redis-py 8 skips that check while its maintenance
notifications are on, so they are turned off), and a read-only call that still meets a
closed connection runs once more on a fresh one (`retry_read`). Writes are not retried:
their first attempt may have run.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Literal, TypedDict, TypeVar

import redis as redis_py
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, RedisClusterException, RedisError
from redis.retry import Retry

from fxengine.errors import FxError

from ..errors import FxStoreFullError, FxStoreUnavailableError
from ..urls import StoreAddress
from ._transport import AsyncClient, SyncClient

T = TypeVar("T")

# `host:port`, `[v6]:port`, a bare IP, and "connecting to <host>" in redis-py's messages:
# a client of the HTTP API has no business learning where the store lives.
_ADDRESS = re.compile(
    r"\('[^']*',\s*\d+(?:,\s*\d+)*\)"  # a socket address tuple: ('127.0.0.1', 6379)
    r"|\[[0-9A-Fa-f:.]+\](?::\d+)?"  # [::1]:6379
    r"|(?<!@)\b(?!user_script:)[\w.-]+:\d{1,5}\b"  # host:6379 (not a script's line number)
    r"|\b\d{1,3}(?:\.\d{1,3}){3}\b"  # a bare IPv4 address
    r"|(?<=connecting to )\S+"  # redis-py's "Error 111 connecting to <host>."
)


def describe_redis_error(exc: BaseException) -> str:
    """`Kind: message` of a redis-py or socket error, with any server address replaced."""
    text = _ADDRESS.sub("<server>", str(exc)).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _MapRedisErrors:
    # A plain class, not @contextmanager: it wraps every store call, and a generator-based
    # manager costs more than a small script does on the server.
    __slots__ = ("on_outage",)

    def __init__(self, on_outage: Callable[[], None] | None = None) -> None:
        self.on_outage = on_outage

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if exc is None:
            return False
        mapped: FxError | None = None
        if isinstance(exc, FxError):
            outage = isinstance(exc, FxStoreUnavailableError)  # e.g. an ack no replica gave
        # By class, not text: inside a pipeline redis-py rewrites the message ("Command # 1
        # (...) of pipeline caused error: ...") but keeps the class of the OOM reply.
        elif isinstance(exc, OutOfMemoryError):
            outage, mapped = True, FxStoreFullError(
                "the session store is full (Redis is at its maxmemory): nothing was stored; "
                "send it again with the same messageId once memory is freed"
            )
        elif isinstance(exc, (RedisError, RedisClusterException, OSError)):
            outage = True
            mapped = FxStoreUnavailableError(f"the session store is unavailable: {describe_redis_error(exc)}")
        else:
            return False
        if outage and self.on_outage is not None:
            self.on_outage()
        if mapped is not None:
            raise mapped from exc
        return False


_MAP_REDIS_ERRORS = _MapRedisErrors()


def map_redis_errors(on_outage: Callable[[], None] | None = None) -> _MapRedisErrors:
    """Translates redis-py's connection and server errors into `FxStoreUnavailableError`.

    Use as `with map_redis_errors(): ...`. `on_outage` is called for each outage it meets
    (the store unavailable or full; a store keeps one mapper that notes when).
    """
    return _MAP_REDIS_ERRORS if on_outage is None else _MapRedisErrors(on_outage)


def closed_connection(exc: BaseException) -> bool:
    """Whether `exc` is a connection redis-py found closed (worth one retry of a read)."""
    cause = exc.__cause__ if isinstance(exc, FxStoreUnavailableError) else exc
    # A timeout is not here: the server may be slow, and a retry would double the wait.
    return isinstance(cause, RedisConnectionError) and not isinstance(cause, RedisClusterException)


async def retry_read(call: Callable[[], Awaitable[T]]) -> T:
    """Runs a read-only `call`; once more if it met a closed connection.

    redis-py disconnects the connection that failed, so the second attempt connects
    afresh. Only for calls that change nothing in Redis: a write's first attempt may have
    run before the connection dropped.
    """
    try:
        return await call()
    except FxStoreUnavailableError as exc:
        if not closed_connection(exc):
            raise
    return await call()


def retry_read_sync(call: Callable[[], T]) -> T:
    """The blocking twin of `retry_read`."""
    try:
        return call()
    except FxStoreUnavailableError as exc:
        if not closed_connection(exc):
            raise
    return call()


def _no_maintenance_notifications() -> dict[str, object]:
    """Pool options that keep redis-py's check for closed connections at checkout.

    redis-py 8 turns RESP3 maintenance notifications on by default ("auto"), and while
    they are on its pool hands out a pooled connection without checking whether Redis
    closed it; the caller then fails on the dead socket. Older redis-py has no such option.
    """
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:
        return {}
    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}


class ServerCheck:
    """Start-up checks run once per store (maxmemory-policy warning, WAITAOF support)."""

    def __init__(self) -> None:
        self.done = False


def policy_or_none(get: Callable[[], T]) -> T | None:
    try:
        return get()
    except RedisError:
        return None  # CONFIG is often disabled on managed Redis


def _no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


def _no_async_retry() -> AsyncRetry:
    return AsyncRetry(NoBackoff(), 0)


class _Timeouts(TypedDict):
    """What every client of the store is built with."""

    socket_timeout: float
    socket_connect_timeout: float


class _Auth(TypedDict):
    """The credentials a cluster client given its nodes is built with."""

    username: str | None
    password: str | None
    ssl: bool


class _Primary(_Timeouts, _Auth):
    """What the client of a Sentinel-managed primary is built with."""

    db: int
    max_connections: int


def _driver_info() -> dict[str, object]:
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
    address: StoreAddress, *, cluster: bool, socket_timeout_s: float, max_connections: int, pool_timeout_s: float
) -> tuple[Callable[[], AsyncClient], Callable[[], SyncClient]]:
    """(async factory, sync factory) of redis-py clients for `address`, retries off.

    Each client draws on a `BlockingConnectionPool` of at most `max_connections`: a call
    finding every connection busy waits for one up to `pool_timeout_s`, then fails with
    redis-py's `ConnectionError` (`FxStoreUnavailableError` once mapped) — redis-py's
    default pool fails such a call at once. On a cluster the blocking client's per-node
    pools wait alike; the asyncio cluster client has no waiting pool (its per-node limit
    fails a call at once), so it keeps its unbounded default and the store bounds its
    calls itself (`RedisStore`). A Sentinel-managed primary is found through the
    sentinels for each new connection, so a failover is followed once the old
    connections fail; its pool does not wait either (the store bounds its calls).
    """
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections}")
    common: _Timeouts = {"socket_timeout": socket_timeout_s, "socket_connect_timeout": socket_timeout_s}
    if cluster:
        import redis.asyncio.cluster as async_cluster
        import redis.cluster as sync_cluster

        if address.kind == "redis":  # a node's URL: the client finds the others
            return (
                lambda: async_cluster.RedisCluster.from_url(address.url, **common),
                lambda: sync_cluster.RedisCluster.from_url(
                    address.url, connection_pool_class=redis_py.BlockingConnectionPool,
                    max_connections=max_connections, timeout=pool_timeout_s, **common,
                ),
            )
        auth: _Auth = {"username": address.username, "password": address.password, "ssl": address.tls}
        return (
            lambda: async_cluster.RedisCluster(
                startup_nodes=[async_cluster.ClusterNode(h, p) for h, p in address.nodes], **auth, **common),
            lambda: sync_cluster.RedisCluster(
                startup_nodes=[sync_cluster.ClusterNode(h, p) for h, p in address.nodes],
                connection_pool_class=redis_py.BlockingConnectionPool, max_connections=max_connections,
                timeout=pool_timeout_s, **auth, **common,
            ),
        )
    if address.kind == "sentinel":
        return _sentinel_factories(address, common, max_connections)
    import redis.asyncio as async_redis

    pooled = {**common, **_driver_info(), **_no_maintenance_notifications()}

    def make_async() -> AsyncClient:
        pool = async_redis.BlockingConnectionPool.from_url(
            address.url, max_connections=max_connections, timeout=pool_timeout_s, retry=_no_async_retry(), **pooled
        )
        return async_redis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it

    def make_sync() -> SyncClient:
        pool = redis_py.BlockingConnectionPool.from_url(
            address.url, max_connections=max_connections, timeout=pool_timeout_s, retry=_no_retry(), **pooled
        )
        return redis_py.Redis.from_pool(pool)

    return make_async, make_sync


def _sentinel_factories(
    address: StoreAddress, common: _Timeouts, max_connections: int
) -> tuple[Callable[[], AsyncClient], Callable[[], SyncClient]]:
    import redis.asyncio.sentinel as async_sentinel
    import redis.sentinel as sync_sentinel

    assert address.master is not None
    master = address.master
    sentinel_kwargs = {**common, "password": address.sentinel_password}
    data: _Primary = {**common, "username": address.username, "password": address.password, "db": address.db,
            "ssl": address.tls, "max_connections": max_connections}
    nodes = list(address.nodes)

    def make_async() -> AsyncClient:
        sentinels = async_sentinel.Sentinel(nodes, sentinel_kwargs=sentinel_kwargs, **common)
        client: AsyncClient = sentinels.master_for(master, retry=_no_async_retry(), **data)
        return client

    def make_sync() -> SyncClient:
        sentinels = sync_sentinel.Sentinel(nodes, sentinel_kwargs=sentinel_kwargs, **common)
        client: SyncClient = sentinels.master_for(master, retry=_no_retry(), **data)
        return client

    return make_async, make_sync


_cluster_answers: dict[str, bool] = {}  # store URL -> whether its server said it runs in cluster mode


def is_cluster(address: StoreAddress, *, timeout_s: float = 5.0) -> bool | None:
    """Whether the server `address` names (a cluster's first seed) runs in cluster mode
    (`INFO cluster`, asked once per URL and process: the start checks, the start line and
    the store all need it); None when it does not answer; False for a Sentinel address."""
    if address.kind == "sentinel":
        return False
    known = _cluster_answers.get(address.url)
    if known is not None:
        return known
    client = redis_py.Redis.from_url(address.first_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        found = _cluster_answers[address.url] = bool(int(client.info("cluster").get("cluster_enabled", 0)))
        return found
    except RedisError:
        return None
    finally:
        client.close()
