"""How a plan's steps reach Redis: the store's batching transport, one for both clients.

What goes on the wire is decided once, in plain generators (`_run_all`, `_each_reply`):
each yields what to do next, one step alone (`_One`), steps in one pipeline (`_Pipeline`),
script calls in one round trip (`_Batch`), the cluster node of a key (`_NodeOf`) or loading
the scripts (`_LOAD`), and takes back its answer, or its error raised where it yielded.
`SyncTransport` answers them on a blocking redis-py client and `AsyncTransport` on an
asyncio one; the two differ in nothing else, besides what only a loop can do: on one
server the single calls of one loop iteration leave together (`run_batched`), packed by
hiredis on one pooled connection (`_send_packed`).

Every write is one script run with EVALSHA. Redis forgets loaded scripts when it restarts
(or on SCRIPT FLUSH); a NOSCRIPT reply makes the transport load every script and run the
call again. A NOSCRIPT call never ran, so running it again is safe.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Generator, Sequence
from typing import Any, NamedTuple, TypeVar

from hiredis import pack_command as _pack_command
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.connection import ConnectionPool as AsyncConnectionPool
from redis.client import Pipeline
from redis.cluster import ClusterPipeline, RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..scripts import SCRIPTS, Arg, Call, Command, Step

T = TypeVar("T")

SyncClient = Redis | RedisCluster
"""A blocking redis-py client of the store (fakeredis's `FakeRedis` is a `Redis`)."""
AsyncClient = AsyncRedis | AsyncRedisCluster
"""An asyncio redis-py client of the store (fakeredis's `FakeAsyncRedis` is a `Redis`)."""


class _One(NamedTuple):
    """One step alone: its reply, or its error raised. `node`: where a cluster sends it."""

    step: Step
    node: object = None


class _Pipeline(NamedTuple):
    """Steps in one pipeline (one round trip, in order, on one connection): their replies,
    an error reply as its exception. `node`: where a cluster sends its plain commands."""

    steps: Sequence[Step]
    node: object = None


class _Batch(NamedTuple):
    """Script calls in one round trip: their replies, an error reply as its exception (a
    loop's transport may pack them by hand; a pipeline does the same otherwise)."""

    calls: Sequence[Call]


class _NodeOf(NamedTuple):
    """The cluster node that owns `key` (the slot map read first where the client has none)."""

    key: str


class _Load:
    """Load every script (after a NOSCRIPT reply)."""

    __slots__ = ()


_LOAD = _Load()

_Request = _One | _Pipeline | _Batch | _NodeOf | _Load
Program = Generator[_Request, object, T]
"""What to send, as a generator: it yields each request and gets its answer back."""


def _command(step: Step) -> tuple[Arg, ...]:
    # Plain EVALSHA: redis-py's Script objects would add a SCRIPT EXISTS round trip.
    return ("EVALSHA", *step.evalsha_args()) if isinstance(step, Call) else step.args


def _packed(call: Call) -> bytes:
    # hiredis's stub types a command as a tuple of one part; it takes any number.
    parts: tuple[Any, ...] = _command(call)
    return bytes(_pack_command(parts))


# -- what to send, written once -----------------------------------------------------------


def _replies(request: _Pipeline | _Batch) -> Program[list[object]]:
    replies = yield request
    assert isinstance(replies, list)
    return replies


def _run_call(call: Call) -> Program[object]:
    try:
        return (yield _One(call))
    except NoScriptError:
        yield _LOAD
        return (yield _One(call))


def _reply_or_error(call: Call) -> Program[object]:
    try:
        return (yield from _run_call(call))
    except RedisError as exc:  # an error reply (or a failure) of this call alone
        return exc


def _run_step(step: Step, *, cluster: bool) -> Program[object]:
    if isinstance(step, Call):
        return (yield from _run_call(step))
    if cluster and step.key is not None:
        return (yield _One(step, (yield _NodeOf(step.key))))
    return (yield _One(step))


def _run_all(steps: Sequence[Step], *, cluster: bool) -> Program[list[object]]:
    """Runs `steps` in order: one pipeline (one round trip) when allowed, else one by one.

    A cluster spreads one call's keys over nodes: there the steps run one by one, in order,
    but for a call and the waits after it (`_node_groups`).
    """
    if len(steps) == 1 and isinstance(steps[0], Call):  # most calls: no pipeline to build
        return [(yield from _run_call(steps[0]))]
    if cluster:
        replies: list[object] = []
        for group in _node_groups(steps):
            if len(group) > 1:
                replies += yield from _run_on_node(group)
            else:
                replies.append((yield from _run_step(group[0], cluster=True)))
        return replies
    if len(steps) == 1:
        return [(yield from _run_step(steps[0], cluster=False))]
    replies = yield from _replies(_Pipeline(steps))
    missing = _first_noscript(replies)
    if missing is not None:
        yield _LOAD
        again = _rerun(steps, replies, missing)
        # One pipeline, so one connection: a WAIT counts its own connection's writes.
        for i, reply in zip(again, (yield from _replies(_Pipeline([steps[i] for i in again])))):
            replies[i] = reply
    return _raise_errors(replies)


def _run_on_node(group: list[Step]) -> Program[list[object]]:
    """A cluster call and the waits after it, in one pipeline on the call's node (a WAIT
    counts the writes of its own connection)."""
    node = yield _NodeOf(_route_key(group[0]))
    replies = yield from _replies(_Pipeline(group, node))
    if _first_noscript(replies) is not None:
        yield _LOAD
        replies = yield from _replies(_Pipeline(group, node))
    return _raise_errors(replies)


def _each_reply(calls: Sequence[Call], *, one_by_one: bool) -> Program[list[object]]:
    """The replies of `calls`, each the call's own: its value, or the error reply it met as
    an exception; sent in one round trip unless `one_by_one`. A connection failure raises:
    it is every call's."""
    replies: list[object] = []
    if one_by_one:
        for call in calls:
            replies.append((yield from _reply_or_error(call)))
        return replies
    replies = yield from _replies(_Batch(calls))
    if _first_noscript(replies) is not None:  # a NOSCRIPT call did not run
        yield _LOAD
        for i, call in enumerate(calls):
            if isinstance(replies[i], NoScriptError):
                replies[i] = yield from _reply_or_error(call)
    return replies


def _is_wait(step: Step) -> bool:
    return isinstance(step, Command) and step.key is None and step.args[0] in ("WAIT", "WAITAOF")


def _route_key(step: Step) -> str:
    key = step.keys[0] if isinstance(step, Call) else step.key
    assert key is not None  # a group starts with a call or a keyed read
    return key


def _node_groups(steps: Sequence[Step]) -> list[list[Step]]:
    """`steps` cut into runs of one step each, except that a call keeps the waits that
    follow it (they must go to its node, on its connection), and a read keeps the call in
    its slot that follows it (`ack_read`: its WAIT must count that read's node)."""
    groups: list[list[Step]] = []
    for step in steps:
        last = groups[-1] if groups else None
        if last is not None and _is_wait(step) and any(isinstance(s, Call) for s in last):
            last.append(step)
        elif (last is not None and len(last) == 1 and isinstance(step, Call) and isinstance(last[0], Command)
              and last[0].key is not None and key_slot(last[0].key.encode()) == key_slot(step.keys[0].encode())):
            last.append(step)
        else:
            groups.append([step])
    return groups


def _first_noscript(replies: list[object]) -> int | None:
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            return i
    return None


def _rerun(steps: Sequence[Step], replies: list[object], first: int) -> list[int]:
    # A NOSCRIPT call did not run; run it again, in order, with every plain command after
    # the first one (a WAIT must follow the write it waits for). Calls that ran stay.
    return [
        i
        for i in range(first, len(steps))
        if isinstance(replies[i], NoScriptError) or isinstance(steps[i], Command)
    ]


def _raise_errors(replies: list[object]) -> list[object]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _queue(
    pipe: Pipeline | ClusterPipeline | AsyncPipeline | AsyncClusterPipeline, steps: Sequence[Step], node: object
) -> None:
    for step in steps:
        # A call goes where its keys live; a plain command of a group to the group's node.
        if node is None or isinstance(step, Call):
            pipe.execute_command(*_command(step))
        else:
            pipe.execute_command(*step.args, target_nodes=node)


# -- the two edges: how each request is answered ---------------------------------------


class SyncTransport:
    """Runs steps on a blocking redis-py client (`redis.Redis` or `redis.cluster.RedisCluster`)."""

    def __init__(self, client: SyncClient, *, cluster: bool = False) -> None:
        self.client = client
        self.cluster = cluster

    def run_all(self, steps: Sequence[Step]) -> list[object]:
        """The replies of `steps`, run in order (`_run_all`)."""
        return self._drive(_run_all(steps, cluster=self.cluster))

    def _drive(self, program: Program[T]) -> T:
        answer: object = None
        error: Exception | None = None
        while True:
            try:
                request = program.send(answer) if error is None else program.throw(error)
            except StopIteration as done:
                result: T = done.value
                return result
            try:
                answer, error = self._answer(request), None
            except Exception as exc:  # noqa: BLE001 - raised in the program, where it asked
                answer, error = None, exc

    def _answer(self, request: _Request) -> object:
        client = self.client
        if isinstance(request, _One):
            if request.node is not None:
                return client.execute_command(*_command(request.step), target_nodes=request.node)
            return client.execute_command(*_command(request.step))
        if isinstance(request, _NodeOf):
            assert isinstance(client, RedisCluster)  # asked on a cluster only
            return client.get_node_from_key(request.key)
        if isinstance(request, _Load):
            for script in SCRIPTS.values():
                client.script_load(script.source)
            return None
        steps, node = (request.steps, request.node) if isinstance(request, _Pipeline) else (request.calls, None)
        pipe = client.pipeline(transaction=False)
        _queue(pipe, steps, node)
        return list(pipe.execute(raise_on_error=False))


# The batches in flight: a task the loop holds only weakly must not vanish mid-call.
_BATCHES: set[asyncio.Task[None]] = set()


class AsyncTransport:
    """Runs steps on an asyncio redis-py client (`redis.asyncio.Redis` or its cluster client).

    On one server, the single calls of one loop iteration (every session's line flushes,
    records, renewals of a busy worker) leave together as one pipeline (`run_batched`):
    one round trip and one socket write for all of them, each script still atomic on its
    own and answered on its own.
    """

    def __init__(self, client: AsyncClient, *, cluster: bool = False) -> None:
        self.client = client
        self.cluster = cluster
        self._batch: list[tuple[Call, asyncio.Future[object]]] = []
        # A redis-py client on its own connections (not a stand-in such as fakeredis):
        # a batch is packed and sent here, on one of its pooled connections.
        pool = client.connection_pool if isinstance(client, AsyncRedis) and not cluster else None
        self._pool: AsyncConnectionPool | None = (
            pool if pool is not None and pool.connection_class.__module__.startswith("redis.asyncio") else None
        )
        self._packs = self._pool is not None

    async def run_all(self, steps: Sequence[Step]) -> list[object]:
        """The replies of `steps`, run in order (`_run_all`); a single call on one server
        leaves with the other calls of this loop iteration."""
        if len(steps) == 1 and isinstance(steps[0], Call) and not self.cluster:
            return [await self.run_batched(steps[0])]
        return await self._drive(_run_all(steps, cluster=self.cluster))

    async def replies_of(self, calls: Sequence[Call]) -> list[object]:
        """The replies of `calls` in one round trip (on one server), each the call's own
        (`_each_reply`). A connection failure raises: it is every call's."""
        # Packed, one call too: it skips redis-py's per-command layers.
        one_by_one = not self._packs and (len(calls) == 1 or self.cluster)
        return await self._drive(_each_reply(calls, one_by_one=one_by_one))

    def run_batched(self, call: Call) -> asyncio.Future[object]:
        """The reply of `call`, sent with the other calls of this loop iteration."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        if not self._batch:
            loop.call_soon(self._send_batch)
        self._batch.append((call, future))
        return future

    def _send_batch(self) -> None:
        batch, self._batch = self._batch, []
        task = asyncio.ensure_future(self._run_batch(batch))
        _BATCHES.add(task)
        task.add_done_callback(_BATCHES.discard)

    async def _run_batch(self, batch: list[tuple[Call, asyncio.Future[object]]]) -> None:
        try:
            replies = await self.replies_of([call for call, _ in batch])
        except BaseException as exc:  # the connection failed: every call of the batch meets it
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), reply in zip(batch, replies):
            if future.done():  # its caller was cancelled
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _drive(self, program: Program[T]) -> T:
        answer: object = None
        error: Exception | None = None
        while True:
            try:
                request = program.send(answer) if error is None else program.throw(error)
            except StopIteration as done:
                result: T = done.value
                return result
            try:
                answer, error = await self._answer(request), None
            except Exception as exc:  # noqa: BLE001 - raised in the program, where it asked
                answer, error = None, exc

    async def _answer(self, request: _Request) -> object:
        client = self.client
        if isinstance(request, _One):
            if request.node is not None:
                return await client.execute_command(*_command(request.step), target_nodes=request.node)
            return await client.execute_command(*_command(request.step))
        if isinstance(request, _NodeOf):
            assert isinstance(client, AsyncRedisCluster)  # asked on a cluster only
            await client.initialize()  # the slot map: a new client has none yet
            return client.get_node_from_key(request.key)
        if isinstance(request, _Load):
            for script in SCRIPTS.values():
                await client.script_load(script.source)
            return None
        if isinstance(request, _Batch) and self._packs:
            return await self._send_packed(request.calls)
        steps, node = (request.steps, request.node) if isinstance(request, _Pipeline) else (request.calls, None)
        pipe = client.pipeline(transaction=False)
        _queue(pipe, steps, node)
        return list(await pipe.execute(raise_on_error=False))

    async def _send_packed(self, calls: Sequence[Call]) -> list[object]:
        """The calls in one write on one pooled connection, packed by hiredis, and their
        replies (an error reply as its exception): what a redis-py pipeline sends, without
        its per-argument encoding and per-command bookkeeping, the most of a busy worker's
        store CPU."""
        pool = self._pool
        assert pool is not None  # packing is for a redis-py client's own pool
        connection = await pool.get_connection()
        try:
            await connection.send_packed_command(b"".join([_packed(call) for call in calls]))
            replies: list[object] = []
            # One deadline for the batch's replies, not a timer per reply.
            try:
                async with asyncio.timeout(connection.socket_timeout):
                    for _ in calls:
                        try:
                            replies.append(await connection.read_response(timeout=math.inf))
                        except ResponseError as exc:  # the script's own error: the others still answer
                            replies.append(exc)
            except TimeoutError:
                raise RedisTimeoutError(f"no reply to a batch of {len(calls)} calls "
                                        f"within {connection.socket_timeout} s") from None
            return replies
        except BaseException:
            await connection.disconnect()  # replies may be left unread on it
            raise
        finally:
            await pool.release(connection)
