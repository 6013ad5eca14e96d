"""`SyncRedisStore`: the blocking twin of `RedisStore` (`store.sync`).

Same methods, arguments and results as the async store, for Django, Flask or Celery
prefork code; both run the same operation plans of `fxworker.store._core`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..scripts import SyncRunner
from ._boundary import ServerCheck, map_redis_errors, policy_or_none, retry_read_sync
from ._core import UNCHECKED, Op, RecordLike, StoreCore
from .types import (
    Accepted, Appended, Claim, Idle, Input, InputKind, Mark, ReadySession, Released, Serving, SessionState, Unserved,
)

T = TypeVar("T")


class SyncRedisStore:
    """The blocking twin of `RedisStore` (`store.sync`), for Django, Flask or Celery code.

    Same methods, same arguments, same results; nothing here awaits.
    """

    def __init__(self, core: StoreCore, make_client: Callable[[], Any], check: ServerCheck) -> None:
        self._core = core
        self._make_client = make_client
        self._check = check
        self._runner: SyncRunner | None = None

    def __repr__(self) -> str:
        return f"<SyncRedisStore prefix={self._core.prefix!r} ack={self._core.ack}>"

    @property
    def client(self) -> Any:
        return self._get_runner().client

    def _get_runner(self) -> SyncRunner:
        if self._runner is None:
            with map_redis_errors():
                self._runner = SyncRunner(self._make_client(), cluster=self._core.cluster)
        return self._runner

    def _exec(self, op: Op[T]) -> T:
        runner = self._get_runner()
        with map_redis_errors():
            if not self._check.done:
                client = runner.client
                info = client.info("server") if self._core.ack == "aof" else None
                self._core.check_server(info, policy_or_none(lambda: client.config_get("maxmemory-policy")))
                self._check.done = True
            return op.parse(runner.run_all(op.steps))

    def accept(
        self, session_id: str, *, agent: str, kind: InputKind = "prompt", message_id: str, input: Any,
        context: Any = None, settings: Any = None, now_ms: int | None = None, create: bool = True,
        traceparent: str | None = None,
    ) -> Accepted:
        """See `RedisStore.accept`."""
        return self._exec(self._core.op_accept(
            session_id, agent=agent, kind=kind, message_id=message_id, input=input, context=context,
            settings=settings, now_ms=now_ms, create=create, traceparent=traceparent))

    def session_for_message(self, message_id: str, session_id: str, *, scope: str = "") -> str:
        """See `RedisStore.session_for_message`."""
        return self._exec(self._core.op_created_session(message_id, session_id, scope=scope))

    def request_cancel(self, session_id: str, *, now_ms: int | None = None, message_id: str | None = None) -> str | None:
        """See `RedisStore.request_cancel`."""
        return self._exec(self._core.op_cancel(session_id, now_ms=now_ms, message_id=message_id))

    def claim(
        self, session_id: str, *, holder: str, lease_ms: int, now_ms: int | None = None, only_work: bool = False,
        serving: Serving | None = None,
    ) -> Claim | Idle | Unserved | None:
        """See `RedisStore.claim`."""
        return self._exec(
            self._core.op_claim(
                session_id, holder=holder, lease_ms=lease_ms, now_ms=now_ms, only_work=only_work, serving=serving
            )
        )

    def append(
        self, session_id: str, epoch: int, *, records: Sequence[RecordLike] = (),
        lines: Sequence[Mapping[str, Any]] = (), marks: Sequence[Mark] = (), expected: Any = UNCHECKED,
        durable: bool = False, now_ms: int | None = None, idempotency_key: str | None = None,
    ) -> Appended:
        """See `RedisStore.append`."""
        return self._exec(self._core.op_append(
            session_id, epoch, records=records, lines=lines, marks=marks, expected=expected, durable=durable,
            now_ms=now_ms, idempotency_key=idempotency_key))

    def renew(self, session_id: str, epoch: int, *, lease_ms: int, now_ms: int | None = None) -> int:
        """See `RedisStore.renew`."""
        return self._exec(self._core.op_renew(session_id, epoch, lease_ms=lease_ms, now_ms=now_ms))

    def release(self, session_id: str, epoch: int, *, cutoff: bool = False, now_ms: int | None = None) -> Released:
        """See `RedisStore.release`."""
        return self._exec(self._core.op_release(session_id, epoch, cutoff=cutoff, now_ms=now_ms))

    def save_checkpoint(
        self, session_id: str, epoch: int, *, through: str | None, data: bytes, now_ms: int | None = None
    ) -> int:
        """See `RedisStore.save_checkpoint`."""
        return self._exec(self._core.op_save_checkpoint(session_id, epoch, through=through, data=data, now_ms=now_ms))

    def read_raw_lines(
        self, session_id: str, cursor: int = 0, *, block_ms: int | None = None, count: int | None = None
    ) -> list[tuple[int, bytes]]:
        """See `RedisStore.read_raw_lines`."""
        op = self._core.op_read_raw_lines(session_id, cursor, block_ms=block_ms, count=count)
        return retry_read_sync(lambda: self._exec(op))

    def read_lines(
        self, session_id: str, cursor: int = 0, *, block_ms: int | None = None, count: int | None = None
    ) -> list[dict[str, Any]]:
        """See `RedisStore.read_lines`."""
        return StoreCore.decode_lines(self.read_raw_lines(session_id, cursor, block_ms=block_ms, count=count))

    def watch_inbox(
        self, session_id: str, after: int, *, block_ms: int | None = 1000, count: int | None = None
    ) -> list[Input]:
        """See `RedisStore.watch_inbox`."""
        op = self._core.op_watch_inbox(session_id, after, block_ms=block_ms, count=count)
        return retry_read_sync(lambda: self._exec(op))

    def state(self, session_id: str, *, now_ms: int | None = None) -> SessionState:
        """See `RedisStore.state`."""
        op = self._core.op_state(session_id, now_ms=now_ms)
        return retry_read_sync(lambda: self._exec(op))

    def list_sessions(self, limit: int = 100) -> list[str]:
        """See `RedisStore.list_sessions`."""
        core = self._core
        index = core.op_index(core.index.sessions, limit, newest_first=True)
        ids = [sid for sid, _ in retry_read_sync(lambda: self._exec(index))]
        found = core.op_states(ids, now_ms=None)
        states = retry_read_sync(lambda: self._exec(found)) if ids else []
        return [sid for sid, st in zip(ids, states) if st is not None]

    def mark_ready(self, session_id: str, *, now_ms: int | None = None) -> None:
        """See `RedisStore.mark_ready`."""
        self._exec(self._core.op_mark_ready(session_id, now_ms=now_ms))

    def clear_ready(self, session_id: str, *, now_ms: int | None = None, grace_ms: int | None = None) -> bool:
        """See `RedisStore.clear_ready`."""
        core = self._core
        now = core.now(now_ms)
        op = core.op_states([session_id], now_ms=now)
        state = retry_read_sync(lambda: self._exec(op))[0]
        if state is not None and state.has_work:
            return False
        return self._exec(core.op_clear(
            [session_id], older_than_ms=now - core.grace(grace_ms), forget=[state is None]
        ))[0]

    def ready_sessions(
        self, *, now_ms: int | None = None, limit: int = 1000, grace_ms: int | None = None,
        include_held: bool = False,
    ) -> list[ReadySession]:
        """See `RedisStore.ready_sessions`."""
        core = self._core
        now = core.now(now_ms)
        index = core.op_index(core.index.ready, limit, newest_first=False)
        marked = retry_read_sync(lambda: self._exec(index))
        ids = [sid for sid, _ in marked]
        found = core.op_states(ids, now_ms=now)
        states = retry_read_sync(lambda: self._exec(found)) if ids else []
        idle = [(sid, st is None) for sid, st in zip(ids, states) if st is None or not st.has_work]
        if idle:
            self._exec(core.op_clear(
                [s for s, _ in idle], older_than_ms=now - core.grace(grace_ms), forget=[f for _, f in idle]
            ))
        return core.ready_from(marked, states, include_held=include_held)

    def close(self) -> None:
        """Closes the blocking client's connections."""
        if self._runner is not None:
            self._runner.client.close()
            self._runner = None
