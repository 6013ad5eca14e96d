"""The machinery of the store's operations: plans, and one declaration for both stores.

An operation is a plan: a function of `StoreCore` and the caller's arguments that
validates and encodes them and returns an `Op` (the steps to run in order, script calls
and plain commands, and the parser of their replies), or a generator of `Op`s for one
that reads before it writes. `operation(plan)` declares it once: on `RedisStore` the
attribute is an `async` method that runs the plan on the loop's client, on its blocking
twin `store.sync` a plain one, both with the plan's own signature and docstring, so the
two never differ in anything but how they wait.

The plans live by role, each beside the parser of its replies: `_senders`, `_workers`,
`_readers`. A new operation touches its script (`fxworker/lua/`), its wrapper in
`fxworker.scripts`, and its plan with its declaration.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any, Concatenate, Final, Generic, NamedTuple, ParamSpec, Self, TypeVar, overload

from fxengine.persistence import Mark

from ..errors import FxAckUnsupportedError, FxConfigError, FxStoreUnavailableError
from ..ids import now_ms, validate_session_id
from ..keys import SessionKeys, check_prefix, index_keys, session_keys
from .. import scripts
from ..scripts import Arg, Command, Step
from .types import StoreRecord

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
C = TypeVar("C", bound=Callable[..., object])
log = logging.getLogger("fxworker.store")

# A ready mark younger than this is never cleared: on a cluster it may belong to an accept
# still in flight (the sender marks first, then accepts). Well above any accept's socket
# timeout.
READY_GRACE_MS = 30_000
# On one server the accept script makes the mark itself, atomically, so no accept is in
# flight behind a mark; what is left is clock skew between the sender (whose clock scores
# the mark) and the sweeper (whose clock decides what is old).
READY_SKEW_MS = 5_000


class Unchecked:
    def __repr__(self) -> str:
        return "UNCHECKED"


UNCHECKED: Final = Unchecked()
"""`append(expected=UNCHECKED)`: the call does not compare the log head (the default)."""

RecordLike = StoreRecord | tuple[str, bytes, Sequence[Mark]]


class Op(NamedTuple, Generic[T_co]):
    """Steps to run in order (one round trip when pipelined) and the parser of their replies.

    `read`: the steps change nothing, so a call that met a connection Redis closed runs
    once more on a fresh one (a write never does: its first attempt may have run).
    `blocks`: the steps wait for data (XREAD BLOCK); their time is not the store's latency.
    """

    steps: list[Step]
    parse: Callable[[list[Any]], T_co]
    read: bool = False
    blocks: bool = False


Plan = Generator["Op[object]", Any, T]
"""A plan of several calls: it yields each `Op`, gets its parsed result, returns the answer."""

P = ParamSpec("P")


class StoreCore:
    """Validation, keys, the clock and the ack level: what every plan reads."""

    def __init__(
        self,
        *,
        prefix: str = "fx",
        ack: str = "primary",
        memory_ids: bool = False,
        session_ttl_s: float | None = None,
        clock: Callable[[], int] | None = None,
        cluster: bool = False,
        ack_timeout_ms: int = 1000,
        max_block_ms: int = 4000,
    ) -> None:
        if ack not in ("primary", "aof", "replica"):
            raise FxConfigError(f"ack must be 'primary', 'aof' or 'replica', got {ack!r}")
        self.prefix = check_prefix(prefix)
        self.ack = ack
        self.memory_ids = memory_ids
        self.ttl_ms = int(session_ttl_s * 1000) if session_ttl_s else 0
        self.clock = clock or now_ms
        self.cluster = cluster
        self.ready_grace_ms = READY_GRACE_MS if cluster else READY_SKEW_MS
        self.ack_timeout_ms = ack_timeout_ms
        self.max_block_ms = max_block_ms
        self.index = index_keys(self.prefix)
        self._keys: dict[str, SessionKeys] = {}
        # When a call of this process last met the store unavailable (epoch ms; 0: never).
        # A claim passes it on: holders silent since then may have been cut off, not dead.
        self.outage_ms = 0

    # -- helpers ---------------------------------------------------------------------

    def now(self, now_ms: int | None) -> int:
        return self.clock() if now_ms is None else int(now_ms)

    def saw_outage(self) -> None:
        """Notes that a call of this process met the store unavailable, now."""
        self.outage_ms = self.clock()

    def grace(self, grace_ms: int | None) -> int:
        """How old a ready mark must be before it may be cleared (None: this store's own)."""
        return self.ready_grace_ms if grace_ms is None else int(grace_ms)

    def keys(self, session_id: str) -> SessionKeys:
        """The keys of a valid session id (`FxInvalidSessionIdError` otherwise), cached."""
        keys = self._keys.get(session_id)
        if keys is None:
            keys = session_keys(self.prefix, validate_session_id(session_id, memory=self.memory_ids))
            if len(self._keys) >= 4096:
                self._keys.clear()
            self._keys[session_id] = keys
        return keys

    def ack_steps(self) -> list[Step]:
        if self.ack == "replica":
            return [Command(("WAIT", 1, self.ack_timeout_ms))]
        if self.ack == "aof":
            return [Command(("WAITAOF", 1, 0, self.ack_timeout_ms))]
        return []

    def read_ack_steps(self, keys: SessionKeys, after: int) -> list[Step]:
        """After a read of `keys`' lines after cursor `after`: what makes the ack level
        hold for what it returned.

        A line flush does not wait for the ack level, so a read can find lines only the
        primary holds. A failover would lose them and the next writer would store others at
        their cursors: a reader sent them would hold lines the store does not. `ack_read`
        writes after the read, on its connection, and the wait after it covers the read.
        """
        if self.ack == "primary":
            return []
        return [scripts.ack_read(keys, after=after), *self.ack_steps()]

    def check_ack(
        self, replies: list[Any], what: str, *, then: str = "repeating the call with the same ids is safe"
    ) -> None:
        if self.ack == "replica" and int(replies[0]) < 1:
            raise FxStoreUnavailableError(
                f"{what} is stored on the primary but no replica acknowledged it within {self.ack_timeout_ms} ms; {then}"
            )
        if self.ack == "aof" and int(replies[0][0]) < 1:
            raise FxStoreUnavailableError(
                f"{what} is stored but not yet fsynced to the AOF within {self.ack_timeout_ms} ms; {then}"
            )

    def xread(self, key: str, after: int, *, block_ms: int | None, count: int | None) -> Command:
        """One XREAD of `key` after entry `after`-0 (a blocking one waits at most `max_block_ms`)."""
        args: list[Arg] = ["XREAD"]
        if count is not None:
            args += ["COUNT", int(count)]
        if block_ms is not None:
            args += ["BLOCK", max(1, min(int(block_ms), self.max_block_ms))]
        return Command((*args, "STREAMS", key, f"{after}-0"), key=key)

    def check_server(self, info: Mapping[str, object] | None, policy: object) -> None:
        """Start-up checks on the answers of INFO server and CONFIG GET maxmemory-policy."""
        if self.ack == "aof" and info is not None:
            version = tuple(int(p) for p in str(info.get("redis_version", "0")).split(".")[:2])
            if version < (7, 2):
                raise FxAckUnsupportedError(
                    f"ack='aof' needs WAITAOF (Redis 7.2 or newer); this server is {info.get('redis_version')}"
                )
        value = _find_policy(policy)
        if value is not None and value != "noeviction":
            log.warning(
                "Redis maxmemory-policy is %r: under memory pressure Redis may evict session keys; "
                "set it to 'noeviction'", value,
            )


def _find_policy(policy: object) -> str | None:
    if isinstance(policy, Mapping):
        for key, value in policy.items():
            k = key.decode() if isinstance(key, bytes) else key
            if k == "maxmemory-policy":
                return value.decode() if isinstance(value, bytes) else str(value)
            if isinstance(value, Mapping):  # a cluster client answers per node
                found = _find_policy(value)
                if found is not None:
                    return found
    return None


# -- one declaration for both stores ----------------------------------------------------


class AsyncStore:
    """What `operation` needs of the async store: its core and how it runs one `Op`."""

    _core: StoreCore

    async def _exec(self, op: Op[T], name: str | None = None) -> T:
        raise NotImplementedError

    def _bind(self, declared: operation[P, T]) -> Callable[P, Awaitable[T]]:
        name, core, run, several = declared.name, self._core, self._exec, declared.several
        if several is not None:
            async def call(*args: P.args, **kwargs: P.kwargs) -> T:
                steps = several(core, *args, **kwargs)
                try:
                    op = next(steps)
                    while True:
                        op = steps.send(await run(op, name))
                except StopIteration as done:
                    result: T = done.value
                    return result
            return declared.named(call)
        one = declared.one
        assert one is not None

        async def call_one(*args: P.args, **kwargs: P.kwargs) -> T:
            return await run(one(core, *args, **kwargs), name)
        return declared.named(call_one)


class SyncStore:
    """What `operation` needs of the blocking store: its core and how it runs one `Op`."""

    _core: StoreCore

    def _exec(self, op: Op[T], name: str | None = None) -> T:
        raise NotImplementedError

    def _bind(self, declared: operation[P, T]) -> Callable[P, T]:
        name, core, run, several = declared.name, self._core, self._exec, declared.several
        if several is not None:
            def call(*args: P.args, **kwargs: P.kwargs) -> T:
                steps = several(core, *args, **kwargs)
                try:
                    op = next(steps)
                    while True:
                        op = steps.send(run(op, name))
                except StopIteration as done:
                    result: T = done.value
                    return result
            return declared.named(call)
        one = declared.one
        assert one is not None

        def call_one(*args: P.args, **kwargs: P.kwargs) -> T:
            return run(one(core, *args, **kwargs), name)
        return declared.named(call_one)


class operation(Generic[P, T]):
    """Declares a store operation once, from its plan: an awaitable method of `RedisStore`
    and a plain one of `store.sync`, with the plan's signature (after its `core`) and
    docstring. Timed in `STORE_LATENCY` under its name.

    The plan is `one` (it returns one `Op`) or `several` (it yields several). The bound
    method is made on first use and kept on the instance: a call costs what a hand-written
    method does.
    """

    def __init__(
        self,
        one: Callable[Concatenate[StoreCore, P], Op[T]] | None = None,
        *,
        several: Callable[Concatenate[StoreCore, P], Plan[T]] | None = None,
    ) -> None:
        plan = one or several
        assert plan is not None and (one is None or several is None), "one plan: one= or several="
        self.one, self.several = one, several
        self.name = plan.__name__.lstrip("_")
        self.__doc__ = plan.__doc__

    def __set_name__(self, owner: type[object], name: str) -> None:
        self.name = name

    def named(self, call: C) -> C:
        call.__name__ = call.__qualname__ = self.name
        call.__doc__ = self.__doc__
        return call

    @overload
    def __get__(self, obj: None, owner: type[object]) -> Self: ...
    @overload
    def __get__(self, obj: AsyncStore, owner: type[object]) -> Callable[P, Awaitable[T]]: ...
    @overload
    def __get__(self, obj: SyncStore, owner: type[object]) -> Callable[P, T]: ...
    def __get__(
        self, obj: AsyncStore | SyncStore | None, owner: type[object]
    ) -> Self | Callable[P, Awaitable[T]] | Callable[P, T]:
        if obj is None:
            return self
        bound = obj._bind(self)
        obj.__dict__[self.name] = bound
        return bound


def one_call(plan: Callable[Concatenate[StoreCore, P], Op[T]]) -> operation[P, T]:
    """`operation` of a plan that is one `Op`."""
    return operation(plan)


def several_calls(plan: Callable[Concatenate[StoreCore, P], Plan[T]]) -> operation[P, T]:
    """`operation` of a plan that yields several `Op`s (a read, then a write that depends on it)."""
    return operation(several=plan)
