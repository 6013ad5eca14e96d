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
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from redis.exceptions import RedisError

from fxengine.persistence import Loaded

from .. import metrics
from ..errors import FxStoreUnavailableError
from ..scripts import AsyncRunner
from ._boundary import ServerCheck, client_factories, map_redis_errors, retry_read
from ._core import UNCHECKED, Op, RecordLike, StoreCore
from .persistence import LineWriter, StorePersistence
from .sync import SyncRedisStore
from .types import (
    Accepted, Appended, Claim, Idle, Input, InputKind, Mark, ReadySession, Released, Serving, SessionState, Unserved,
)

__all__ = ["RedisStore", "SyncRedisStore", "client_factories", "map_redis_errors"]

T = TypeVar("T")


class RedisStore:
    """The session store of docs/design.md §5 (async); `store.sync` is its blocking twin.

    Build one with `redis_store()`, `embedded_store()` or `memory_store()`. The module
    docstring of `fxworker.store` describes the protocol the runner follows.
    """

    def __init__(
        self,
        core: StoreCore,
        *,
        make_async_client: Callable[[], Any],
        make_sync_client: Callable[[], Any],
        kind: str = "redis",
        max_calls: int | None = None,
        wait_s: float = 5.0,
    ) -> None:
        self._core = core
        self._make_async_client = make_async_client
        self._check = ServerCheck()
        # One runner (client) per event loop; id(loop) -> (loop, runner, call slots).
        self._runners: dict[int, tuple[asyncio.AbstractEventLoop, AsyncRunner, asyncio.Semaphore | None]] = {}
        self._runners_lock = threading.Lock()
        # The asyncio cluster client has no waiting pool: with `max_calls`, at most that many
        # calls per loop run at once, the others wait up to `wait_s` (then FX_STORE_UNAVAILABLE).
        self._max_calls = max_calls
        self._wait_s = wait_s
        self.kind = kind
        self.sync = SyncRedisStore(core, make_sync_client, self._check)

    def __repr__(self) -> str:
        return (
            f"<RedisStore kind={self.kind} prefix={self._core.prefix!r} ack={self._core.ack} "
            f"loops={len(self._runners)}>"
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
    def client(self) -> Any:
        """The asyncio redis-py client of the running loop."""
        return self._get_runner().client

    def now_ms(self) -> int:
        """The store's clock (wall time unless a `clock` was given)."""
        return self._core.clock()

    def _get_runner(self) -> AsyncRunner:
        return self._loop_runner()[0]

    def _loop_runner(self) -> tuple[AsyncRunner, asyncio.Semaphore | None]:
        loop = asyncio.get_running_loop()
        entry = self._runners.get(id(loop))
        if entry is not None and entry[0] is loop:
            return entry[1], entry[2]
        with self._runners_lock:
            entry = self._runners.get(id(loop))
            if entry is not None and entry[0] is loop:
                return entry[1], entry[2]
            # Loops that stopped (an `asyncio.run` that returned, a closed worker loop) no
            # longer need their client; their sockets go with them.
            for key, (other, _, _) in list(self._runners.items()):
                if other.is_closed() or not other.is_running():
                    del self._runners[key]
            with map_redis_errors():
                runner = AsyncRunner(self._make_async_client(), cluster=self._core.cluster)
            slots = asyncio.Semaphore(self._max_calls) if self._max_calls else None
            self._runners[id(loop)] = (loop, runner, slots)
            return runner, slots

    async def _exec(self, op: Op[T], name: str | None = None) -> T:
        """Runs `op` on this loop's client; timed in `fxworker.metrics.STORE_LATENCY` under
        `name` (the public method's: None for a blocking read, which measures a wait)."""
        if name is None:
            return await self._exec_untimed(op)
        with metrics.store_timer(name):
            return await self._exec_untimed(op)

    async def _exec_untimed(self, op: Op[T]) -> T:
        runner, slots = self._loop_runner()
        if slots is None:
            return await self._run(runner, op)
        try:
            async with asyncio.timeout(self._wait_s):
                await slots.acquire()
        except TimeoutError:
            raise FxStoreUnavailableError(
                f"no store connection came free within {self._wait_s} s ({self._max_calls} calls in flight)"
            ) from None
        try:
            return await self._run(runner, op)
        finally:
            slots.release()

    async def _run(self, runner: AsyncRunner, op: Op[T]) -> T:
        with map_redis_errors():
            if not self._check.done:
                client = runner.client
                info = await client.info("server") if self._core.ack == "aof" else None
                try:
                    policy = await client.config_get("maxmemory-policy")
                except RedisError:
                    policy = None  # CONFIG is often disabled on managed Redis
                self._core.check_server(info, policy)
                self._check.done = True
            return op.parse(await runner.run_all(op.steps))

    # -- senders (web processes) --------------------------------------------------------

    async def accept(
        self, session_id: str, *, agent: str, kind: InputKind = "prompt", message_id: str, input: Any,
        context: Any = None, settings: Any = None, now_ms: int | None = None, create: bool = True,
        traceparent: str | None = None,
    ) -> Accepted:
        """Stores a prompt or steer; returns once Redis (and the `ack` level) has it.

        The session is marked ready first, then one script checks the message id (the
        same id and kind again: `repeated=True` with the original; a steer reusing a
        prompt's id: `FxMessageIdInUseError`), enforces the steer limits
        (`FxLimitError` / `FxQueueFullError`), appends to the inbox and records the owning
        agent on first input. `create=False` refuses an unknown session
        (`FxUnknownSessionError`). `Accepted.agent` is the owner: compare it with `agent`
        to detect a forwarded session. `traceparent` (a W3C trace context) is kept with the
        input, for the worker that runs it to continue the trace.
        """
        return await self._exec(self._core.op_accept(
            session_id, agent=agent, kind=kind, message_id=message_id, input=input, context=context,
            settings=settings, now_ms=now_ms, create=create, traceparent=traceparent), "accept")

    async def session_for_message(self, message_id: str, session_id: str, *, scope: str = "") -> str:
        """The session a create with `message_id` names within `scope`: `session_id` if this
        call is the first.

        One `SET NX` claims `message_id` for `session_id` (with the session TTL); a later
        call with the same id gets the first call's session back, so a repeated create
        prompts that session and its `accept` answers `repeated=True`. Call it before the
        session's first `accept`: if that accept never lands, the repeat creates the session.
        """
        return await self._exec(self._core.op_created_session(message_id, session_id, scope=scope), "session_for_message")

    async def request_cancel(self, session_id: str, *, now_ms: int | None = None,
                             message_id: str | None = None) -> str | None:
        """Asks for the open turn (or, with none, the next waiting one) to be cancelled;
        with `message_id`, that prompt's turn only, while it is open or waiting.

        Returns the targeted message id, or None when nothing (or not that turn) runs or
        waits. A worker running the session sees it on `watch_inbox()`; a later claim
        reports it.
        """
        return await self._exec(self._core.op_cancel(session_id, now_ms=now_ms, message_id=message_id), "request_cancel")

    async def mark_ready(self, session_id: str, *, now_ms: int | None = None) -> None:
        """Puts the session in the ready set (the sweeper's list; `accept` does it first)."""
        await self._exec(self._core.op_mark_ready(session_id, now_ms=now_ms), "mark_ready")

    # -- workers -------------------------------------------------------------------------

    async def claim(
        self, session_id: str, *, holder: str, lease_ms: int, now_ms: int | None = None, only_work: bool = False,
        serving: Serving | None = None,
    ) -> Claim | Idle | Unserved | None:
        """Takes the lease when none is live (none held, or expired by `now_ms`).

        Returns None when another holder's lease stands. The epoch goes up by one; the
        `Claim` carries the checkpoint, the records after it, the pending inputs, the open
        turn and the cut-off and death counts. With `only_work`, a session with no turn
        open, no input waiting and no lease held is left as it is: `Idle`, epoch unchanged.
        With `serving`, a session owned by an agent not in `serving.agents` is left as it
        is too (`Unserved`, its wakes backing off) until it waited `serving.give_up_ms`;
        then it is claimed with `Claim.give_up` set, to end its inputs. Raises
        `FxSessionIncompleteError` for a session with a key gone.
        """
        return await self._exec(
            self._core.op_claim(
                session_id, holder=holder, lease_ms=lease_ms, now_ms=now_ms, only_work=only_work, serving=serving
            )
        , "claim")

    async def append(
        self, session_id: str, epoch: int, *, records: Sequence[RecordLike] = (),
        lines: Sequence[Mapping[str, Any]] = (), marks: Sequence[Mark] = (), expected: Any = UNCHECKED,
        durable: bool = False, now_ms: int | None = None, idempotency_key: str | None = None,
    ) -> Appended:
        """The fenced write: log records (with their marks), store marks and UI lines, in one call.

        Raises `FxLeaseLostError` and stores nothing when `epoch` no longer holds a live
        lease. `records` are `(idempotency_key, data, marks)` (or `StoreRecord`); a
        repeated key returns what the first call stored and stores nothing. `lines` get
        `epoch` and `cursor` added. `marks` without a record: `{"drop": id}` consumes an
        input no turn takes, `{"end": True}` closes the open turn. `expected` (a cursor or
        None) refuses with `FxFencedError` unless it is the log head. `durable=True`
        also waits for the store's `ack` level. `idempotency_key` keys a call without
        records (a line-only flush): repeated, it returns the first call's line cursors
        (`repeated=True`) and stores nothing. The session keeps its newest such key only
        (a writer retries a call before its next one); compaction drops it once a later
        record is covered.
        """
        return await self._exec(self._core.op_append(
            session_id, epoch, records=records, lines=lines, marks=marks, expected=expected, durable=durable,
            now_ms=now_ms, idempotency_key=idempotency_key), "append")

    async def renew(self, session_id: str, epoch: int, *, lease_ms: int, now_ms: int | None = None) -> int:
        """Extends the lease to `now_ms + lease_ms` and returns that; `FxLeaseLostError` if it is gone."""
        return await self._exec(self._core.op_renew(session_id, epoch, lease_ms=lease_ms, now_ms=now_ms), "renew")

    async def release(
        self, session_id: str, epoch: int, *, cutoff: bool = False, now_ms: int | None = None
    ) -> Released:
        """Lets the session go. `cutoff=True` counts one more deadline cut-off of the open step (§6)."""
        return await self._exec(self._core.op_release(session_id, epoch, cutoff=cutoff, now_ms=now_ms), "release")

    async def save_checkpoint(
        self, session_id: str, epoch: int, *, through: str | None, data: bytes, now_ms: int | None = None
    ) -> int:
        """Stores a checkpoint (<= 4 MiB) covering the log through `through`, trims the
        covered records and returns the log's remaining length. Fenced like `append`."""
        return await self._exec(self._core.op_save_checkpoint(
            session_id, epoch, through=through, data=data, now_ms=now_ms), "save_checkpoint")

    async def watch_inbox(
        self, session_id: str, after: int, *, block_ms: int | None = 1000, count: int | None = None
    ) -> list[Input]:
        """Inbox entries (prompts, steers, cancels) after seq `after`, blocking up to `block_ms`.

        A running worker follows this from `Claim.inbox_cursor` to see steers and cancels
        within a second.
        """
        op = self._core.op_watch_inbox(session_id, after, block_ms=block_ms, count=count)
        return await retry_read(lambda: self._exec(op, None if block_ms else "watch_inbox"))

    async def watch_inboxes(self, after: Mapping[str, int]) -> dict[str, list[Input]]:
        """The inbox entries after `after[sid]` of each session, in one round trip (a
        pipeline of one XREAD each); sessions with nothing new are left out."""
        if not after:
            return {}
        op = self._core.op_watch_inboxes(after)
        return await retry_read(lambda: self._exec(op, "watch_inboxes"))

    def persistence(self, session_id: str, epoch: int, claim: Claim) -> StorePersistence:
        """The engine-facing `Persistence` of this claim (fenced on `epoch`)."""
        return StorePersistence(self, claim, writer=LineWriter(self, session_id, epoch))

    # -- readers -------------------------------------------------------------------------

    async def read_raw_lines(
        self, session_id: str, cursor: int = 0, *, block_ms: int | None = None, count: int | None = None
    ) -> list[tuple[int, bytes]]:
        """UI lines after `cursor` as (cursor, JSON bytes): one XREAD from `cursor-0`.

        At most `count` lines a call (default `READ_PAGE_LINES`): a reader of a long session
        pages through it from its last cursor instead of loading it whole. With `block_ms`
        it waits (at most the store's `max_block_ms`) for a first line. Cursors are
        contiguous, so a reader resuming from any cursor sees each line once. A cursor
        past the stream's id space (2^64 - 1) is `FxInvalidCursorError`.
        """
        op = self._core.op_read_raw_lines(session_id, cursor, block_ms=block_ms, count=count)
        return await retry_read(lambda: self._exec(op, None if block_ms else "read_raw_lines"))

    async def read_lines(
        self, session_id: str, cursor: int = 0, *, block_ms: int | None = None, count: int | None = None
    ) -> list[dict[str, Any]]:
        """UI lines after `cursor` as dicts, each with its `cursor` and writer `epoch`."""
        return StoreCore.decode_lines(await self.read_raw_lines(session_id, cursor, block_ms=block_ms, count=count))

    async def state(self, session_id: str, *, now_ms: int | None = None) -> SessionState:
        """Agent, status (idle / waiting / running), last cursor, turns, epoch; `FxUnknownSessionError` if none."""
        op = self._core.op_state(session_id, now_ms=now_ms)
        return await retry_read(lambda: self._exec(op, "state"))

    async def load(self, session_id: str) -> Loaded:
        """The session's checkpoint and the log records after it (what a claim loads), read
        without a lease: `session.checkpoint()` exports from it. `FxUnknownSessionError` if none."""
        return await self._exec(self._core.op_load(session_id), "load")

    async def list_sessions(self, limit: int = 100) -> list[str]:
        """Ids of the newest sessions the store still holds, newest first."""
        core = self._core
        index = core.op_index(core.index.sessions, limit, newest_first=True)
        ids = [sid for sid, _ in await retry_read(lambda: self._exec(index, "list_sessions"))]
        if not ids:
            return []
        found = core.op_states(ids, now_ms=None)
        states = await retry_read(lambda: self._exec(found, "list_sessions"))
        return [sid for sid, st in zip(ids, states) if st is not None]

    async def clear_ready(
        self, session_id: str, *, now_ms: int | None = None, grace_ms: int | None = None
    ) -> bool:
        """Removes the session from the ready set when nothing is pending or open and its
        mark is older than `grace_ms` (an accept may still be landing; default: 5 s on one
        server, where the accept makes the mark itself, 30 s on a cluster). True if removed."""
        core = self._core
        now = core.now(now_ms)
        op = core.op_states([session_id], now_ms=now)
        state = (await retry_read(lambda: self._exec(op, "clear_ready")))[0]
        if state is not None and state.has_work:
            return False
        return (await self._exec(core.op_clear(
            [session_id], older_than_ms=now - core.grace(grace_ms), forget=[state is None]
        ), "clear_ready"))[0]

    async def ready_sessions(
        self, *, now_ms: int | None = None, limit: int = 1000, grace_ms: int | None = None,
        include_held: bool = False,
    ) -> list[ReadySession]:
        """Sessions to wake: in the ready set, work pending or open, and no live lease
        (with `include_held`, also those a live lease holds: reason `held`).

        Also prunes marks of sessions with nothing to do once they are older than `grace_ms`.
        """
        core = self._core
        now = core.now(now_ms)
        index = core.op_index(core.index.ready, limit, newest_first=False)
        marked = await retry_read(lambda: self._exec(index, "ready_sessions"))
        ids = [sid for sid, _ in marked]
        found = core.op_states(ids, now_ms=now)
        states = await retry_read(lambda: self._exec(found, "ready_sessions")) if ids else []
        idle = [(sid, st is None) for sid, st in zip(ids, states) if st is None or not st.has_work]
        if idle:
            await self._exec(core.op_clear(
                [s for s, _ in idle], older_than_ms=now - core.grace(grace_ms), forget=[f for _, f in idle]
            ), "ready_sessions")
        return core.ready_from(marked, states, include_held=include_held)

    async def states(self, session_ids: Sequence[str], *, now_ms: int | None = None) -> list[SessionState | None]:
        """`state()` of each session, in one round trip (None for one the store does not know)."""
        if not session_ids:
            return []
        op = self._core.op_states(list(session_ids), now_ms=now_ms)
        return await retry_read(lambda: self._exec(op, "states"))

    def close(self) -> None:
        """Closes the blocking twin's client and asks every loop still running to close
        its own async client (without waiting: this may run on one of them)."""
        with self._runners_lock:
            entries, self._runners = list(self._runners.values()), {}
        for loop, runner, _ in entries:
            if not loop.is_closed() and loop.is_running():
                asyncio.run_coroutine_threadsafe(runner.client.aclose(), loop)
        self.sync.close()

    async def aclose(self) -> None:
        """Closes the running loop's async client and the blocking twin's; the clients of
        other loops are dropped (a client can only be closed on its own loop)."""
        loop = asyncio.get_running_loop()
        with self._runners_lock:
            entries, self._runners = list(self._runners.values()), {}
        for other, runner, _ in entries:
            if other is loop:
                await runner.client.aclose()
        self.sync.close()
