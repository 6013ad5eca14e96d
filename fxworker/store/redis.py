"""`RedisStore`: the session store on Redis (standalone or Cluster), async with a sync twin.

Every write is one Lua script (`fxworker/lua/`); reads are one XREAD or one read-only
script. Connection failures and timeouts surface as `FxStoreUnavailableError`
(`map_redis_errors`, in `_boundary`); the next call reconnects. A read that meets a
connection Redis closed runs once more on a fresh one (`retry_read`); a write never does.

An asyncio client is bound to the event loop that opened it, so the store keeps one per
loop: the web app's, each embedded worker's, the blocking twins' private loop (`Session`'s
`blocking_session()`), each `asyncio.run` of a Celery task. A loop that stopped loses its
client the next time the store opens one for a new loop. Each client's pool is bounded
(`FX_REDIS_MAX_CONNECTIONS`) and a call waits for a free connection rather than failing
(`_boundary.client_factories`); `store.sync` has its own bounded pool.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from redis.exceptions import RedisError

from .. import metrics
from ..errors import FxStoreUnavailableError
from ..scripts import Call
from ._boundary import ServerCheck, client_factories, map_redis_errors, retry_read
from ._core import AsyncStore, Op, StoreCore
from ._live import LiveOperations
from ._readers import ReaderOperations
from ._senders import SenderOperations
from ._transport import AsyncClient, AsyncTransport, SyncClient
from ._workers import WorkerOperations
from .api import SessionStore
from .persistence import LineFlusher, LineWriter, StorePersistence
from .sync import SyncRedisStore
from .types import Claim

__all__ = ["RedisStore", "SyncRedisStore", "client_factories", "map_redis_errors"]

T = TypeVar("T")


class RedisStore(SenderOperations, WorkerOperations, ReaderOperations, LiveOperations, AsyncStore):
    """The session store of docs/design.md §5 (async); `store.sync` is its blocking twin.

    Build one with `redis_store()`, `embedded_store()` or `memory_store()`. The module
    docstring of `fxworker.store` describes the protocol the runner follows.
    """

    def __init__(
        self,
        core: StoreCore,
        *,
        make_async_client: Callable[[], AsyncClient],
        make_sync_client: Callable[[], SyncClient],
        kind: str = "redis",
        max_calls: int | None = None,
        wait_s: float = 5.0,
    ) -> None:
        self._core = core
        self._make_async_client = make_async_client
        self._check = ServerCheck()
        self._errors = map_redis_errors(core.saw_outage)
        # One transport (client) per event loop; id(loop) -> (loop, transport, call slots,
        # the loop's line flusher).
        self._transports: dict[int, tuple[asyncio.AbstractEventLoop, AsyncTransport, asyncio.Semaphore | None,
                                          LineFlusher]] = {}
        self._transports_lock = threading.Lock()
        # The asyncio cluster client has no waiting pool: with `max_calls`, at most that many
        # calls per loop run at once, the others wait up to `wait_s` (then FX_STORE_UNAVAILABLE).
        self._max_calls = max_calls
        self._wait_s = wait_s
        self.kind = kind
        self.sync = SyncRedisStore(core, make_sync_client, self._check)

    def __repr__(self) -> str:
        return (
            f"<RedisStore kind={self.kind} prefix={self._core.prefix!r} ack={self._core.ack} "
            f"loops={len(self._transports)}>"
        )

    @property
    def prefix(self) -> str:
        return self._core.prefix

    @property
    def ack(self) -> str:
        return self._core.ack

    @property
    def core(self) -> StoreCore:
        """Keys, validation and the clock of this store (for tests and tools)."""
        return self._core

    @property
    def client(self) -> AsyncClient:
        """The asyncio redis-py client of the running loop."""
        return self._transport().client

    def now_ms(self) -> int:
        """The store's clock (wall time unless a `clock` was given)."""
        return self._core.clock()

    def _transport(self) -> AsyncTransport:
        return self._loop_transport()[0]

    def _loop_transport(self) -> tuple[AsyncTransport, asyncio.Semaphore | None]:
        _, transport, slots, _ = self._loop_entry()
        return transport, slots

    def _loop_entry(self) -> tuple[asyncio.AbstractEventLoop, AsyncTransport, asyncio.Semaphore | None, LineFlusher]:
        loop = asyncio.get_running_loop()
        entry = self._transports.get(id(loop))
        if entry is not None and entry[0] is loop:
            return entry
        with self._transports_lock:
            entry = self._transports.get(id(loop))
            if entry is not None and entry[0] is loop:
                return entry
            # Loops that stopped (an `asyncio.run` that returned, a closed worker loop) no
            # longer need their client; their sockets go with them.
            for key, (other, *_) in list(self._transports.items()):
                if other.is_closed() or not other.is_running():
                    del self._transports[key]
            with map_redis_errors():
                transport = AsyncTransport(self._make_async_client(), cluster=self._core.cluster)
            slots = asyncio.Semaphore(self._max_calls) if self._max_calls else None
            entry = self._transports[id(loop)] = (loop, transport, slots, LineFlusher(self))
            return entry

    async def _exec(self, op: Op[T], name: str | None = None) -> T:
        """Runs `op` on this loop's client (a read once more after a connection Redis
        closed); timed in `fxworker.metrics.STORE_LATENCY` under `name` (the operation's)
        unless it blocks, which measures a wait."""
        if not op.steps:
            return op.parse([])
        run = retry_read(lambda: self._exec_untimed(op)) if op.read else self._exec_untimed(op)
        if name is None or op.blocks:
            return await run
        started_s = time.perf_counter()
        try:
            return await run
        finally:
            metrics.observe_store(name, time.perf_counter() - started_s)

    async def _exec_untimed(self, op: Op[T]) -> T:
        transport, slots = self._loop_transport()
        if slots is None:
            return await self._run(transport, op)
        try:
            async with asyncio.timeout(self._wait_s):
                await slots.acquire()
        except TimeoutError:
            raise FxStoreUnavailableError(
                f"no store connection came free within {self._wait_s} s ({self._max_calls} calls in flight)"
            ) from None
        try:
            return await self._run(transport, op)
        finally:
            slots.release()

    async def _run(self, transport: AsyncTransport, op: Op[T]) -> T:
        with self._errors:
            if not self._check.done:
                await self._check_server(transport)
            return op.parse(await transport.run_all(op.steps))

    async def _check_server(self, transport: AsyncTransport) -> None:
        """The start-up checks (WAITAOF support, the eviction policy), on the first call."""
        client = transport.client
        info = await client.info("server") if self._core.ack == "aof" else None
        try:
            policy = await client.config_get("maxmemory-policy")
        except RedisError:
            policy = None  # CONFIG is often disabled on managed Redis
        self._core.check_server(info, policy)
        self._check.done = True

    async def run_each(self, ops: Sequence[Op[T]], name: str) -> list[T | Exception]:
        """Several operations of one script call each, in one round trip (on one server),
        each answered on its own: its result, or the fxworker error it met. A connection
        failure raises (`FxStoreUnavailableError`): it is every operation's."""
        transport, slots = self._loop_transport()
        calls = [call for op in ops if len(op.steps) == 1 and isinstance(call := op.steps[0], Call)]
        if slots is not None or len(calls) != len(ops):
            return list(await asyncio.gather(*[self._exec(op, name) for op in ops], return_exceptions=True))  # type: ignore[arg-type]
        started_s = time.perf_counter()
        with self._errors:
            if not self._check.done:
                await self._check_server(transport)
            replies = await transport.replies_of(calls)
        results: list[T | Exception] = []
        for op, reply in zip(ops, replies):
            try:
                with self._errors:
                    if isinstance(reply, Exception):
                        raise reply
                    results.append(op.parse([reply]))
            except Exception as exc:  # noqa: BLE001 - the operation's own outcome, handed back
                results.append(exc)
        took_s = time.perf_counter() - started_s
        for _ in ops:
            metrics.observe_store(name, took_s)
        return results

    def line_flusher(self) -> LineFlusher:
        """The `LineFlusher` of this store on the running loop (its writers share it)."""
        return self._loop_entry()[3]

    def persistence(self, session_id: str, epoch: int, claim: Claim) -> StorePersistence:
        """The engine-facing `Persistence` of this claim (fenced on `epoch`)."""
        return StorePersistence(self, claim, writer=LineWriter(self, session_id, epoch))

    def close(self) -> None:
        """Closes the blocking twin's client and asks every loop still running to close
        its own async client (without waiting: this may run on one of them)."""
        with self._transports_lock:
            entries, self._transports = list(self._transports.values()), {}
        for loop, transport, *_ in entries:
            if not loop.is_closed() and loop.is_running():
                asyncio.run_coroutine_threadsafe(transport.client.aclose(), loop)
        self.sync.close()

    async def aclose(self) -> None:
        """Closes the running loop's async client and the blocking twin's; the clients of
        other loops are dropped (a client can only be closed on its own loop)."""
        loop = asyncio.get_running_loop()
        with self._transports_lock:
            entries, self._transports = list(self._transports.values()), {}
        for other, transport, *_ in entries:
            if other is loop:
                await transport.client.aclose()
        self.sync.close()


def _a_session_store(store: RedisStore) -> SessionStore:
    """Where mypy checks that `RedisStore` answers every call of `SessionStore`."""
    return store
