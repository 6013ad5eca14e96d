"""The Lua scripts of `fxworker/lua/`, their loader and one typed wrapper per script.

Every write the store makes is one script run with EVALSHA. Redis forgets loaded scripts
when it restarts (or on SCRIPT FLUSH); a NOSCRIPT reply makes the runner load every
script and run the call again. A NOSCRIPT call never ran, so running it again is safe.

A wrapper (`accept(...)`, `append(...)`, ...) turns typed arguments into a `Call`: the
script, its KEYS and ARGV. `SyncRunner` and `AsyncRunner` execute calls on a redis-py
client, one at a time or several in one pipeline (one round trip, executed in order).
The store's plans parse the replies (`fxworker.store._senders`, `_workers`, `_readers`).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, NamedTuple, Union

from hiredis import pack_command as _pack_command
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .keys import IndexKeys, SessionKeys

Arg = Union[str, bytes, int]


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua file: its name (the file stem), source and SHA1 (what EVALSHA names)."""

    name: str
    source: str
    sha: str


def _load_all() -> dict[str, Script]:
    """Every `lua/<name>.lua`; a file whose name starts with `_` is a part that scripts
    include (a line `-- include: _part.lua` is replaced by that file), not a script."""
    folder = resources.files("fxworker").joinpath("lua")
    parts = {e.name: e.read_text(encoding="utf-8") for e in folder.iterdir() if e.name.startswith("_")}
    scripts: dict[str, Script] = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".lua") and not entry.name.startswith("_"):
            source = _INCLUDE.sub(lambda found: parts[found.group(1)], entry.read_text(encoding="utf-8"))
            name = entry.name[: -len(".lua")]
            scripts[name] = Script(name, source, hashlib.sha1(source.encode()).hexdigest())
    return scripts


_INCLUDE = re.compile(r"^-- include: (\S+)$", re.MULTILINE)


SCRIPTS: dict[str, Script] = _load_all()
_ACCEPT = SCRIPTS["accept"]


class Call(NamedTuple):
    """One script invocation: what EVALSHA sends (a tuple: built on every store call)."""

    script: Script
    keys: Sequence[str]
    args: Sequence[Arg]

    def evalsha_args(self) -> tuple[Any, ...]:
        return (self.script.sha, len(self.keys), *self.keys, *self.args)


class Command(NamedTuple):
    """A plain Redis command (XREAD, WAIT, ...); `key` routes it on a cluster."""

    args: tuple[Arg, ...]
    key: str | None = None


Step = Union[Call, Command]

# The batches in flight: a task the loop holds only weakly must not vanish mid-call.
_BATCHES: set[asyncio.Task[None]] = set()


class SyncRunner:
    """Runs calls on a blocking redis-py client (`redis.Redis` or `redis.cluster.RedisCluster`)."""

    def __init__(self, client: Any, *, cluster: bool = False) -> None:
        self.client = client
        # A cluster spreads one call's keys over nodes: steps run one by one, in order.
        self.cluster = cluster

    def load(self) -> None:
        for script in SCRIPTS.values():
            self.client.script_load(script.source)

    def run(self, call: Call) -> Any:
        try:
            return self.client.execute_command("EVALSHA", *call.evalsha_args())
        except NoScriptError:
            self.load()
            return self.client.execute_command("EVALSHA", *call.evalsha_args())

    def run_all(self, steps: Sequence[Step]) -> list[Any]:
        """Runs `steps` in order: one pipeline (one round trip) when allowed, else one by one."""
        if len(steps) == 1 and isinstance(steps[0], Call):  # most calls: no pipeline to build
            return [self.run(steps[0])]
        if self.cluster:
            replies = []
            for group in _node_groups(steps):
                replies += self._run_on_node(group) if len(group) > 1 else [self._run_step(group[0])]
            return replies
        if len(steps) == 1:
            return [self._run_step(steps[0])]
        pipe = self.client.pipeline(transaction=False)
        for step in steps:
            _queue(pipe, step)
        replies = list(pipe.execute(raise_on_error=False))
        missing = _first_noscript(replies)
        if missing is not None:
            self.load()
            again = _rerun(steps, replies, missing)
            pipe = self.client.pipeline(transaction=False)  # one connection: a WAIT counts its own writes
            for i in again:
                _queue(pipe, steps[i])
            for i, reply in zip(again, pipe.execute(raise_on_error=False)):
                replies[i] = reply
        return _raise_errors(replies)

    def _run_on_node(self, group: list[Step]) -> list[Any]:
        """A cluster call and the waits after it, in one pipeline on the call's node (a
        WAIT counts the writes of its own connection)."""
        node = self.client.get_node_from_key(_route_key(group[0]))
        for attempt in (0, 1):
            pipe = self.client.pipeline(transaction=False)
            for step in group:
                _queue(pipe, step, node=node)
            replies = list(pipe.execute(raise_on_error=False))
            if attempt == 0 and _first_noscript(replies) is not None:
                self.load()
                continue
            break
        return _raise_errors(replies)

    def _run_step(self, step: Step) -> Any:
        if isinstance(step, Call):
            return self.run(step)
        if self.cluster and step.key is not None:
            return self.client.execute_command(*step.args, target_nodes=self.client.get_node_from_key(step.key))
        return self.client.execute_command(*step.args)


class AsyncRunner:
    """Runs calls on an asyncio redis-py client (`redis.asyncio.Redis` or its cluster client).

    On one server, the single calls of one loop iteration (every session's line flushes,
    records, renewals of a busy worker) leave together as one pipeline (`run_batched`):
    one round trip and one socket write for all of them, each script still atomic on its
    own and answered on its own.
    """

    def __init__(self, client: Any, *, cluster: bool = False) -> None:
        self.client = client
        # A cluster spreads one call's keys over nodes: steps run one by one, in order.
        self.cluster = cluster
        self._batch: list[tuple[Call, asyncio.Future[Any]]] = []
        # A redis-py client on its own connections (not a stand-in such as fakeredis):
        # a batch is packed and sent here, on one of its pooled connections.
        connection_class = getattr(getattr(client, "connection_pool", None), "connection_class", None)
        self._packs = not cluster and getattr(connection_class, "__module__", "").startswith("redis.asyncio")

    def run_batched(self, call: Call) -> asyncio.Future[Any]:
        """The reply of `call`, sent with the other calls of this loop iteration."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._batch:
            loop.call_soon(self._send_batch)
        self._batch.append((call, future))
        return future

    def _send_batch(self) -> None:
        batch, self._batch = self._batch, []
        task = asyncio.ensure_future(self._run_batch(batch))
        _BATCHES.add(task)
        task.add_done_callback(_BATCHES.discard)

    async def _run_batch(self, batch: list[tuple[Call, asyncio.Future[Any]]]) -> None:
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

    async def replies_of(self, calls: list[Call]) -> list[Any]:
        """The replies of `calls`, sent in one round trip (on one server), each the call's
        own: its value, or the error reply it met as an exception. A connection failure
        raises: it is every call's."""
        if self._packs:  # one call too: packed, it skips redis-py's per-command layers
            replies = await self._send_packed(calls)
        elif len(calls) == 1 or self.cluster:
            return [await self._reply_or_error(call) for call in calls]
        else:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                pipe.execute_command("EVALSHA", *call.evalsha_args())
            replies = list(await pipe.execute(raise_on_error=False))
        if _first_noscript(replies) is not None:  # a NOSCRIPT call did not run
            await self.load()
            for i, call in enumerate(calls):
                if isinstance(replies[i], NoScriptError):
                    replies[i] = await self._reply_or_error(call)
        return replies

    async def _send_packed(self, calls: list[Call]) -> list[Any]:
        """The calls in one write on one pooled connection, packed by hiredis, and their
        replies (an error reply as its exception): what a redis-py pipeline sends, without
        its per-argument encoding and per-command bookkeeping, the most of a busy worker's
        store CPU."""
        pool = self.client.connection_pool
        connection = await pool.get_connection()
        try:
            await connection.send_packed_command(
                b"".join([_pack_command(("EVALSHA", *call.evalsha_args())) for call in calls]))
            replies: list[Any] = []
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

    async def _reply_or_error(self, call: Call) -> Any:
        try:
            return await self.run(call)
        except RedisError as exc:  # an error reply (or a failure) of this call alone
            return exc

    async def load(self) -> None:
        for script in SCRIPTS.values():
            await self.client.script_load(script.source)

    async def run(self, call: Call) -> Any:
        try:
            return await self.client.execute_command("EVALSHA", *call.evalsha_args())
        except NoScriptError:
            await self.load()
            return await self.client.execute_command("EVALSHA", *call.evalsha_args())

    async def run_all(self, steps: Sequence[Step]) -> list[Any]:
        """Runs `steps` in order: one pipeline (one round trip) when allowed, else one by one."""
        if len(steps) == 1 and isinstance(steps[0], Call):  # most calls: one script
            if self.cluster:
                return [await self.run(steps[0])]
            return [await self.run_batched(steps[0])]
        if self.cluster:
            replies = []
            for group in _node_groups(steps):
                replies += await self._run_on_node(group) if len(group) > 1 else [await self._run_step(group[0])]
            return replies
        if len(steps) == 1:
            return [await self._run_step(steps[0])]
        pipe = self.client.pipeline(transaction=False)
        for step in steps:
            _queue(pipe, step)
        replies = list(await pipe.execute(raise_on_error=False))
        missing = _first_noscript(replies)
        if missing is not None:
            await self.load()
            again = _rerun(steps, replies, missing)
            pipe = self.client.pipeline(transaction=False)  # one connection: a WAIT counts its own writes
            for i in again:
                _queue(pipe, steps[i])
            for i, reply in zip(again, await pipe.execute(raise_on_error=False)):
                replies[i] = reply
        return _raise_errors(replies)

    async def _run_on_node(self, group: list[Step]) -> list[Any]:
        """A cluster call and the waits after it, in one pipeline on the call's node (a
        WAIT counts the writes of its own connection)."""
        await self.client.initialize()  # the slot map: a new client has none yet
        node = self.client.get_node_from_key(_route_key(group[0]))
        for attempt in (0, 1):
            pipe = self.client.pipeline(transaction=False)
            for step in group:
                _queue(pipe, step, node=node)
            replies = list(await pipe.execute(raise_on_error=False))
            if attempt == 0 and _first_noscript(replies) is not None:
                await self.load()
                continue
            break
        return _raise_errors(replies)

    async def _run_step(self, step: Step) -> Any:
        if isinstance(step, Call):
            return await self.run(step)
        if self.cluster and step.key is not None:
            node = self.client.get_node_from_key(step.key)
            return await self.client.execute_command(*step.args, target_nodes=node)
        return await self.client.execute_command(*step.args)


def _queue(pipe: Any, step: Step, *, node: Any = None) -> None:
    # Plain EVALSHA on the pipeline: redis-py's Script objects would add a SCRIPT EXISTS
    # round trip before every pipeline.
    if isinstance(step, Call):
        pipe.execute_command("EVALSHA", *step.evalsha_args())
    elif node is not None:
        pipe.execute_command(*step.args, target_nodes=node)
    else:
        pipe.execute_command(*step.args)


def _is_wait(step: Step) -> bool:
    return isinstance(step, Command) and step.key is None and step.args[0] in ("WAIT", "WAITAOF")


def _route_key(step: Step) -> str | None:
    return step.keys[0] if isinstance(step, Call) else step.key


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


def _first_noscript(replies: list[Any]) -> int | None:
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            return i
    return None


def _rerun(steps: Sequence[Step], replies: list[Any], first: int) -> list[int]:
    # A NOSCRIPT call did not run; run it again, in order, with every plain command after
    # the first one (a WAIT must follow the write it waits for). Calls that ran stay.
    return [
        i
        for i in range(first, len(steps))
        if isinstance(replies[i], NoScriptError) or isinstance(steps[i], Command)
    ]


def _raise_errors(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


# -- one typed wrapper per script -------------------------------------------------------


def accept(
    keys: SessionKeys,
    *,
    kind: str,
    message_id: str,
    input_json: str,
    context_json: str,
    settings_json: str,
    agent: str,
    now_ms: int,
    create: bool,
    steer_max_bytes: int,
    steer_max_count: int,
    steer_max_total_bytes: int,
    ready: IndexKeys | None = None,
    session_id: str = "",
    steer_bytes: int | None = None,
    traceparent: str = "",
) -> Call:
    """accept.lua: store a prompt (`kind="p"`) or steer (`"s"`) once per message id.

    `steer_bytes` is what a steer counts against its limits: the UTF-8 bytes of its text
    (the script checks it and keeps the queued totals); without it, its JSON's length.

    With `ready` (standalone Redis only: those keys sit in another cluster slot) the same
    script first marks `session_id` ready, as `mark_ready` does; without it the caller
    runs `mark_ready` before this call.
    """
    args: list[Arg] = [kind, message_id, input_json, agent, now_ms, "1" if create else "0", session_id]
    # Trailing arguments are sent only when needed: most prompts carry no context or
    # settings, and only a steer is checked against the limits.
    if kind == "s" or traceparent:
        args += (context_json, settings_json, steer_max_bytes, steer_max_count, steer_max_total_bytes,
                 steer_bytes if steer_bytes is not None else "")
        if traceparent:
            args.append(traceparent)
    elif context_json or settings_json:
        args += (context_json, settings_json)
    return Call(_ACCEPT, keys.names if ready is None else keys.names + ready.names, args)


def mark_ready(index: IndexKeys, *, session_id: str, now_ms: int) -> Call:
    """mark_ready.lua: put a session in the ready set and the session index."""
    return Call(SCRIPTS["mark_ready"], index.names, [session_id, now_ms])


def clear_ready(index: IndexKeys, *, session_id: str, older_than_ms: int, forget: bool = False) -> Call:
    """clear_ready.lua: drop a ready mark no newer than `older_than_ms` (and the index entry if `forget`)."""
    return Call(SCRIPTS["clear_ready"], index.names, [session_id, older_than_ms, "1" if forget else "0"])


def claim(
    keys: SessionKeys, *, holder: str, lease_ms: int, now_ms: int, only_work: bool = False,
    agents: Sequence[str] = (), give_up_ms: int = 0, retry_max_ms: int = 0, outage_ms: int = 0,
    reads: int | None = None,
) -> Call:
    """claim.lua: take the lease when no live one stands; bumps the epoch; reads the session.

    With `only_work`, a session with no open turn, no waiting input and no lease held is
    left as it is (reply `idle`). With `agents`, a session another agent owns is not
    claimed (reply `unserved`) until it waited `give_up_ms` (then `give_up` is set).
    `outage_ms`: when the caller last met a store outage; a takeover from a holder silent
    since before it counts no death. `reads`: the newest layout level the caller reads; a
    session a holder let go for a newer one is not claimed below it (reply `newer`).
    """
    args: list[Arg] = [holder, lease_ms, now_ms, "1" if only_work else "0",
                       ",".join(agents), give_up_ms, retry_max_ms, outage_ms, "" if reads is None else reads]
    return Call(SCRIPTS["claim"], keys.names, args)


def append(
    keys: SessionKeys,
    *,
    epoch: int,
    now_ms: int,
    ttl_ms: int,
    expected: str | None,
    check_expected: bool,
    records: Sequence[tuple[str, bytes, str, Sequence[tuple[str, str]]]],
    marks: Sequence[tuple[str, str | bytes]],
    lines: Sequence[tuple[str, str]],
    call_key: str = "",
    ready: IndexKeys | None = None,
) -> Call:
    """append.lua: the fenced write. `records` are (key, data, marks JSON, flat marks);
    `marks` apply without a record; `lines` are (JSON text without its last brace, the
    message id a `turn_end` line ends or ""); `call_key` is the idempotency key of a call
    with no records (a line-only flush), "" for none. `ready` (standalone Redis only)
    goes with a `release` mark: a release that leaves nothing to run leaves that set."""
    args: list[Arg] = [epoch, now_ms, ttl_ms, (expected or "0") if check_expected else "", len(records),
                       len(lines), len(marks), call_key]
    for key, data, marks_json, flat in records:
        args += [key, data, marks_json, len(flat)]
        for name, value in flat:
            args += [name, value]
    for mark, mark_value in marks:
        args += [mark, mark_value]
    for text, ends in lines:
        args += [text, ends]
    return Call(SCRIPTS["append"], keys.names if ready is None else [*keys.names, ready.names[0]], args)


def renew(keys: SessionKeys, *, epoch: int, lease_ms: int, now_ms: int) -> Call:
    """renew.lua: extend the head's lease; refused once released, expired or claimed again."""
    return Call(SCRIPTS["renew"], keys.names, [epoch, lease_ms, now_ms])


def release(
    keys: SessionKeys, *, epoch: int, cutoff: bool, now_ms: int, ttl_ms: int,
    ready: IndexKeys | None = None, session_id: str = "", newer: int | None = None,
) -> Call:
    """release.lua: let the session go, counting a deadline cut-off when `cutoff`.

    With `ready` (standalone Redis only), a release that leaves nothing to run also takes
    `session_id` out of the ready set.
    """
    names = keys.names if ready is None else [*keys.names, ready.names[0]]
    return Call(SCRIPTS["release"], names, [epoch, "1" if cutoff else "0", now_ms, ttl_ms, session_id,
                                            "" if newer is None else newer])


def save_checkpoint(
    keys: SessionKeys, *, epoch: int, now_ms: int, through: int, data: bytes, max_bytes: int, ttl_ms: int
) -> Call:
    """save_checkpoint.lua: store a checkpoint through a log cursor and trim what it covers."""
    return Call(SCRIPTS["save_checkpoint"], keys.names, [epoch, now_ms, through, data, max_bytes, ttl_ms])


def cancel(keys: SessionKeys, *, now_ms: int, message_id: str | None = None) -> Call:
    """cancel.lua: target the open (or next waiting) turn, or `message_id`'s while it is
    open or waiting, and notify the inbox."""
    return Call(SCRIPTS["cancel"], keys.names, [now_ms, message_id or ""])


def woken(keys: SessionKeys, *, now_ms: int, trust_ms: int = 0) -> Call:
    """woken.lua: note a wake of the session queued at `now_ms` (untaken till a claim),
    unless one noted less than `trust_ms` ago is outstanding (reply 0: send none)."""
    return Call(SCRIPTS["woken"], (keys.meta,), [now_ms, trust_ms])


def state(keys: SessionKeys) -> Call:
    """state.lua: one atomic snapshot of a session."""
    return Call(SCRIPTS["state"], keys.names, [])


def ack_read(keys: SessionKeys, *, after: int) -> Call:
    """ack_read.lua: after a read of `keys`' lines after cursor `after`, the write a WAIT
    on its connection waits for (none when no line follows `after`)."""
    return Call(SCRIPTS["ack_read"], (keys.meta,), [after])


def load(keys: SessionKeys) -> Call:
    """load.lua: the checkpoint, the log and `rest` of a session, in one atomic read."""
    return Call(SCRIPTS["load"], keys.names, [])
