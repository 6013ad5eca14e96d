"""UI lines of a running turn: coalesced, ordered, and written with the records (§4, §5).

`LineWriter` queues the lines a turn produces. Consecutive text (or reasoning) deltas of
one step are merged while they wait (at most `COALESCE_MS` or `COALESCE_BYTES`), never
reordered or lost; one fenced store call writes a batch. `RunnerPersistence` is the
engine's `Persistence`: each journal record goes out in the same fenced call as the lines
queued before it, so a step's lines are stored no later than its record — after a
crash, a step the journal holds has all its lines in the stream.

A store outage (`FxStoreUnavailableError`, e.g. a Redis restart) is transient: both
retry the same call with a bounded backoff while this worker's lease still stands
(`lease_due_ms`); a retried record keeps its idempotency key, so a call whose reply was
lost is answered from the store and stores nothing twice. Past the lease the error is
raised, and the runner leaves the turn open for the next delivery.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fxengine.persistence import Loaded, Mark

from .errors import FxLeaseLostError, FxStoreUnavailableError

T = TypeVar("T")
log = logging.getLogger("fxworker.lines")

COALESCE_MS = 5
COALESCE_BYTES = 4096
_MERGEABLE = ("text_delta", "reasoning_delta")
RETRY_FIRST_MS = 50
RETRY_MAX_MS = 500
RETRY_MARGIN_MS = 100  # the last try starts this long before `due_ms`


def now_ms() -> int:
    return int(time.time() * 1000)


async def retry_unavailable(
    call: Callable[[], Awaitable[T]],
    *,
    due_ms: Callable[[], int] | None,
    what: str,
    stop: Callable[[], bool] | None = None,
) -> T:
    """`await call()`, retried on `FxStoreUnavailableError` with a doubling backoff
    (`RETRY_FIRST_MS` to `RETRY_MAX_MS`) until `due_ms()` (a wall-clock ms, e.g. when the
    lease would expire) is near or `stop()` says so; then the last error is raised.
    Without `due_ms`, one try."""
    delay_ms = RETRY_FIRST_MS
    attempt = 0
    while True:
        try:
            return await call()
        except FxStoreUnavailableError as exc:
            attempt += 1
            left_ms = (due_ms() if due_ms is not None else 0) - RETRY_MARGIN_MS - now_ms()
            if left_ms <= 0 or (stop is not None and stop()):
                log.warning("%s failed after %d tries, giving up: %s", what, attempt, exc)
                raise
            wait_ms = min(delay_ms, left_ms)
            log.warning("%s failed (%s); retry %d in %d ms", what, exc, attempt, wait_ms)
            await asyncio.sleep(wait_ms / 1000)
            delay_ms = min(delay_ms * 2, RETRY_MAX_MS)


class LineWriter:
    """Queues one runner's UI lines and writes them in order, fenced by its epoch."""

    def __init__(
        self,
        store: Any,
        session_id: str,
        epoch: int,
        *,
        on_fenced: Callable[[], None] | None = None,
        lease_due_ms: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.epoch = epoch
        self.on_fenced = on_fenced
        self.lease_due_ms = lease_due_ms  # when this worker's lease would expire (retry bound)
        self.lock = asyncio.Lock()
        self._queue: list[dict[str, Any]] = []
        self._queued_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None
        self.closed = False

    def __repr__(self) -> str:
        return f"<LineWriter session={self.session_id} epoch={self.epoch} queued={len(self._queue)}>"

    def push(self, line: dict[str, Any]) -> None:
        if self.closed:
            return
        line = {**line, "epoch": self.epoch}
        last = self._queue[-1] if self._queue else None
        kind = line.get("type")
        if (
            last is not None
            and kind in _MERGEABLE
            and last.get("type") == kind
            and last.get("step") == line.get("step")
            and last.get("messageId") == line.get("messageId")
        ):
            last["delta"] = last["delta"] + line["delta"]
        else:
            self._queue.append(line)
        self._queued_bytes += len(str(line.get("delta", ""))) + 64
        if self._queued_bytes >= COALESCE_BYTES:
            self._schedule(0)
        elif self._timer is None:
            self._schedule(COALESCE_MS / 1000)

    def _schedule(self, delay_s: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(delay_s, self._background_flush)

    def _background_flush(self) -> None:
        self._timer = None
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.ensure_future(self._flush_quietly())

    async def _flush_quietly(self) -> None:
        try:
            await self.flush()
        except FxLeaseLostError:
            pass
        except Exception:  # noqa: BLE001 - the next flush (or the record) retries
            log.warning("writing lines of %s failed", self.session_id, exc_info=True)

    def take(self) -> list[dict[str, Any]]:
        """Removes and returns the queued lines (the caller writes them; hold `lock`)."""
        lines, self._queue, self._queued_bytes = self._queue, [], 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return lines

    def requeue(self, lines: list[dict[str, Any]]) -> None:
        """Puts back lines a failed write did not store, ahead of newer ones."""
        self._queue[:0] = lines

    async def flush(self) -> None:
        """Writes every queued line now (one fenced call)."""
        async with self.lock:
            lines = self.take()
            if not lines:
                return
            try:
                await retry_unavailable(
                    lambda: self.store.append(self.session_id, self.epoch, records=[], lines=lines),
                    due_ms=self.lease_due_ms,
                    what=f"writing {len(lines)} line(s) of {self.session_id}",
                    stop=lambda: self.closed,
                )
            except FxLeaseLostError:
                self.closed = True
                if self.on_fenced:
                    self.on_fenced()
                raise
            except BaseException:
                self.requeue(lines)
                raise


class RunnerPersistence:
    """The engine's `Persistence` for one claim: fenced appends that carry the queued lines.

    `load()` is the claim's snapshot (checkpoint, records after it, head); `append()` is
    one fenced store call with the record and every line queued before it; a repeated
    idempotency key returns the stored cursor (the store's own dedup).
    """

    def __init__(
        self,
        store: Any,
        session_id: str,
        claim: Any,
        writer: LineWriter,
        *,
        on_record: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.claim = claim
        self.epoch = claim.epoch
        self.writer = writer
        self.on_record = on_record

    def __repr__(self) -> str:
        return f"<RunnerPersistence session={self.session_id} epoch={self.epoch}>"

    async def load(self) -> Loaded:
        loaded: Loaded = self.claim.loaded()
        return loaded

    async def append(
        self,
        *,
        expected: str | None,
        idempotency_key: str,
        data: bytes,
        barrier: bool,
        marks: list[Mark],
    ) -> str:
        from .store.types import StoreRecord

        record = StoreRecord(idempotency_key, bytes(data), list(marks))
        async with self.writer.lock:
            lines = self.writer.take()
            try:
                # A retry sends the same idempotency key: a call that ran but lost its
                # reply is answered from the store and stores nothing again.
                appended = await retry_unavailable(
                    lambda: self.store.append(
                        self.session_id,
                        self.epoch,
                        records=[record],
                        lines=lines,
                        expected=expected,
                        durable=barrier,
                    ),
                    due_ms=self.writer.lease_due_ms,
                    what=f"appending record {idempotency_key} of {self.session_id}",
                    stop=lambda: self.writer.closed,
                )
            except FxLeaseLostError:
                self.writer.closed = True
                if self.writer.on_fenced:
                    self.writer.on_fenced()
                raise
            except BaseException:
                self.writer.requeue(lines)
                raise
        if self.on_record:
            self.on_record()
        return str(appended.records[0])

    async def save_checkpoint(self, *, through: str, data: bytes) -> None:
        await self.store.save_checkpoint(self.session_id, self.epoch, through=through, data=data)
