"""`SyncRedisStore`: the blocking twin of `RedisStore` (`store.sync`).

Same methods, arguments and results as the async store, for Django, Flask or Celery
prefork code; both run the same operation plans, declared once (`fxworker.store._core.operation`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ._boundary import ServerCheck, map_redis_errors, policy_or_none, retry_read_sync
from ._core import Op, StoreCore, SyncStore
from ._live import LiveOperations
from ._readers import ReaderOperations
from ._senders import SenderOperations
from ._transport import SyncClient, SyncTransport
from ._workers import WorkerOperations

T = TypeVar("T")


class SyncRedisStore(SenderOperations, WorkerOperations, ReaderOperations, LiveOperations, SyncStore):
    """The blocking twin of `RedisStore` (`store.sync`), for Django, Flask or Celery code.

    Same methods, same arguments, same results; nothing here awaits.
    """

    def __init__(self, core: StoreCore, make_client: Callable[[], SyncClient], check: ServerCheck) -> None:
        self._core = core
        self._make_client = make_client
        self._check = check
        self._errors = map_redis_errors(core.saw_outage)
        self._current: SyncTransport | None = None

    def __repr__(self) -> str:
        return f"<SyncRedisStore prefix={self._core.prefix!r} ack={self._core.ack}>"

    @property
    def client(self) -> SyncClient:
        return self._transport().client

    def _transport(self) -> SyncTransport:
        if self._current is None:
            with map_redis_errors():
                self._current = SyncTransport(self._make_client(), cluster=self._core.cluster)
        return self._current

    def _exec(self, op: Op[T], name: str | None = None) -> T:
        """Runs `op` on the blocking client (a read once more after a connection Redis closed)."""
        if not op.steps:
            return op.parse([])
        if op.read:
            return retry_read_sync(lambda: self._run(op))
        return self._run(op)

    def _run(self, op: Op[T]) -> T:
        transport = self._transport()
        with self._errors:
            if not self._check.done:
                client = transport.client
                info = client.info("server") if self._core.ack == "aof" else None
                self._core.check_server(info, policy_or_none(lambda: client.config_get("maxmemory-policy")))
                self._check.done = True
            return op.parse(transport.run_all(op.steps))

    def close(self) -> None:
        """Closes the blocking client's connections."""
        if self._current is not None:
            self._current.client.close()
            self._current = None
