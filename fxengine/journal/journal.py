"""The journal writer: one append in flight, batching, barriers, fencing (docs/design.md §9).

Events are queued with `add()`; a single pump task sends everything queued since the
last append as one batch (after one turn of the event loop, so records committed in the
same burst by other tasks join it), naming the cursor it believes is last (`expected`). A batch
is a barrier when any of its events is; the caller that needs durability (the first
record of a turn, the intent of a tool with effects) awaits `wait(future)`. Any failed
append (`FxFencedError` included) stops the journal for good: nothing more is written,
queued events are dropped, and `on_failure` tells the turn to stop at once.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import FxJournalAppendError
from ..persistence import Mark, Persistence
from .records import JournalEvent, encode_batch

Diagnostic = Callable[[dict[str, object]], None]


class JournalStopped(Exception):
    """The journal was detached while a caller waited for a record; nothing more is written."""


@dataclass
class _Queued:
    event: JournalEvent
    marks: list[Mark]
    barrier: bool
    future: asyncio.Future[str | None] | None = field(default=None)


# Whether an `append` function takes `marks`, by function: an engine is made per turn, and
# reading a signature costs more than the rest of its set-up.
_takes_marks: weakref.WeakKeyDictionary[object, bool] = weakref.WeakKeyDictionary()


def wants_marks(persistence: Persistence | None) -> bool:
    """Whether `persistence.append` takes `marks`: its `marks` attribute when it sets one
    (libfx's opt-in), else whether `append` has a `marks` parameter (or ``**kwargs``)."""
    if persistence is None:
        return False
    declared = getattr(persistence, "marks", None)
    if isinstance(declared, bool):
        return declared
    append = persistence.append
    function = getattr(append, "__func__", append)
    try:
        return _takes_marks[function]
    except (KeyError, TypeError):  # not seen yet, or not weakly referable
        pass
    try:
        params = inspect.signature(append).parameters.values()
    except (TypeError, ValueError):
        return True
    takes = any(p.name == "marks" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    try:
        _takes_marks[function] = takes
    except TypeError:
        pass
    return takes


class Journal:
    """Appends engine events to a `Persistence`, or keeps nothing when there is none.

    Idempotency keys are ``<writer uuid>:<first seq of the record>``, one writer uuid per
    engine, so a store that sees a retried append stores it once.
    """

    def __init__(
        self,
        persistence: Persistence | None,
        *,
        head: str | None,
        on_failure: Callable[[BaseException], None] | None = None,
        diag: Diagnostic | None = None,
    ) -> None:
        self.persistence = persistence
        self.head = head
        self.writer_id = uuid.uuid4().hex
        self.failure: BaseException | None = None
        self.detached = False
        self.on_failure = on_failure
        self._diag = diag or (lambda event: None)
        self._marks = wants_marks(persistence)
        # Told when a batch is on its way (optional): a store may hold what it would write
        # alone (UI lines) for that batch's call.
        self._coming: Callable[[], None] | None = getattr(persistence, "record_coming", None)
        self._seq = 1
        self._queue: list[_Queued] = []
        self._pump: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def __repr__(self) -> str:
        return (
            f"<Journal writer={self.writer_id[:8]} head={self.head} queued={len(self._queue)} "
            f"failed={self.failure is not None} detached={self.detached}>"
        )

    @property
    def queued(self) -> int:
        """Events committed and not yet taken into a record's call."""
        return len(self._queue)

    @property
    def enabled(self) -> bool:
        """True while appends are still made (a store is set, no failure, not detached)."""
        return self.persistence is not None and self.failure is None and not self.detached

    def add(self, kind: str, body: dict[str, object], *, marks: list[Mark] | None = None, barrier: bool = False,
            want_ack: bool = False) -> asyncio.Future[str | None] | None:
        """Queues one event; returns a future of its record's cursor when `barrier` or `want_ack`.

        The future resolves to None when the event will never be stored (no store,
        failure, detach); `wait()` turns that into the failure.
        """
        if not self.enabled:
            if barrier or want_ack:
                done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
                done.set_result(None)
                return done
            return None
        future = asyncio.get_running_loop().create_future() if (barrier or want_ack) else None
        self._queue.append(_Queued((kind, body), list(marks or ()), barrier, future))
        if self._pump is None or self._pump.done():
            self._idle.clear()
            self._pump = asyncio.get_running_loop().create_task(self._run(), name="fx-journal")
            if self._coming is not None:
                self._coming()
        return future

    async def wait(self, future: asyncio.Future[str | None] | None) -> None:
        """Waits for a queued event's record; raises `FxJournalAppendError` if it failed."""
        if future is not None and not future.done():
            await asyncio.shield(future)
        self.raise_failure()
        if self.detached:
            raise JournalStopped("the journal was detached")

    def raise_failure(self) -> None:
        if self.failure is not None:
            error = FxJournalAppendError(f"the journal append failed: {self.failure}")
            raise error from self.failure

    async def flush(self) -> None:
        """Waits until everything queued was appended (or the journal stopped)."""
        await self._idle.wait()

    def detach(self) -> None:
        """Writes nothing more; queued events are dropped (an append in flight may still land)."""
        self.detached = True
        self._drop_queue()

    def _drop_queue(self) -> None:
        for queued in self._queue:
            if queued.future is not None and not queued.future.done():
                queued.future.set_result(None)
        self._queue.clear()

    async def _run(self) -> None:
        try:
            # One turn of the loop first: what the other tasks commit in the same burst
            # (a turn's last response and its `turn_end`, written by the turn's finisher
            # task) goes in this batch instead of the next call.
            await asyncio.sleep(0)
            while self._queue and self.enabled:
                batch, self._queue = self._queue, []
                seq = self._seq
                self._seq += len(batch)
                marks = [mark for queued in batch for mark in queued.marks]
                barrier = any(queued.barrier for queued in batch)
                data = encode_batch([queued.event for queued in batch], seq=seq)
                assert self.persistence is not None
                started = time.monotonic()
                try:
                    # A store written to libfx's interface takes no `marks` (`wants_marks`).
                    extra: dict[str, list[Mark]] = {"marks": marks} if self._marks else {}
                    store: Any = self.persistence
                    cursor = await store.append(expected=self.head, idempotency_key=f"{self.writer_id}:{seq}",
                                                data=data, barrier=barrier, **extra)
                except Exception as exc:  # fenced or not, a failed append stops the turn (§9)
                    self.failure = exc
                    for queued in batch:
                        if queued.future is not None and not queued.future.done():
                            queued.future.set_result(None)
                    self._drop_queue()
                    self._diag({"type": "journal.error", "error": getattr(exc, "code", type(exc).__name__)})
                    if self.on_failure is not None:
                        self.on_failure(exc)
                    return
                self.head = cursor
                self._diag({"type": "journal.append", "events": len(batch), "bytes": len(data), "barrier": barrier,
                            "elapsedMs": round((time.monotonic() - started) * 1000, 3)})
                for queued in batch:
                    if queued.future is not None and not queued.future.done():
                        queued.future.set_result(cursor)
            self._drop_queue()
        finally:
            self._idle.set()
