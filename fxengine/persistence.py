"""The `Persistence` protocol (docs/design.md §9) and `MemoryPersistence`, its reference store.

The engine appends one journal record per step, one append in flight at a time, and
names the cursor it believes is last (`expected`). A store refuses any other `expected`
with `FxFencedError`, so two engines can never both extend one conversation. Records are
opaque bytes to the store; `marks` let a store track turns without decoding them (each
declared in `fxengine.lines`, `Mark`, `MARK_NAMES`):

    {"start": turn_id}      the turn started (consumes the input id)
    {"end": True}           the open turn ended
    {"yield": True}         the open turn yielded at a model boundary (`yield_at`)
    {"accepted": input_id}  the turn took a steer or follow-up
    {"step": name}          names the step the turn is at (cut-off counting)
    {"done": True}          the record finishes something: a model response or a tool
                            result (progress, for poison-turn counting)
    {"pause": "id\nid"}     the open turn parks until these calls are decided (`turn_pause`)
    {"decided": call_id}    the turn took that call's decision (with `accepted`: the input
                            that carried it)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from collections.abc import AsyncIterable, Iterable, Mapping
from typing import Protocol, runtime_checkable

from .errors import FxFencedError

# A mark as an engine hands it over: one of `fxengine.lines.Mark` (`{"done": True}`, ...).
# Typed as a mapping because marks built as plain dicts still reach `append`; a store
# checks each name against `MARK_NAMES` where it encodes them.
Mark = Mapping[str, object]


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One stored record: the store's cursor for it and the engine's opaque bytes."""

    cursor: str
    data: bytes


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint covering every record up to and including `through`."""

    data: bytes
    through: str


@dataclass(frozen=True, slots=True)
class Loaded:
    """What `Persistence.load()` returns: the newest checkpoint and the records after it.

    `head` is the cursor the next `append()` must name as `expected`; `None` means the
    last journal record's cursor (or the checkpoint's `through`, or a new session).
    `journal` may be any iterable, or an async iterable (records read as they come).
    """

    checkpoint: StoredCheckpoint | None = None
    journal: Iterable[JournalRecord] | AsyncIterable[JournalRecord] = field(default_factory=list)
    head: str | None = None


@runtime_checkable
class Persistence(Protocol):
    """Where an engine records its journal. `save_checkpoint` is optional, and so is
    `record_coming()`: called when a batch of records is on its way (before its `append`),
    so a store may hold what it would write alone for that call."""

    async def load(self) -> Loaded: ...

    async def append(
        self,
        *,
        expected: str | None,
        idempotency_key: str,
        data: bytes,
        barrier: bool,
        marks: list[Mark],
    ) -> str:
        """Stores one record after `expected` and returns its cursor.

        `marks` is passed when the store takes it: a `marks` parameter (or ``**kwargs``),
        unless the store sets ``marks = False``; a store whose `append` has no such
        parameter gets none (or sets ``marks = True`` to ask for them, as in libfx).

        Raises `FxFencedError` when `expected` is not the last stored cursor. A repeated
        `idempotency_key` returns the cursor stored the first time and stores nothing.
        With `barrier=True` it returns only once the record (and all before it) is durable.
        """
        ...


class MemoryPersistence:
    """The reference store: records and one checkpoint, in this process's memory."""

    def __init__(self) -> None:
        self.records: list[JournalRecord] = []
        self.marks: list[list[Mark]] = []
        self.checkpoint: StoredCheckpoint | None = None
        self._keys: dict[str, str] = {}
        self._next = 1
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        head = self.records[-1].cursor if self.records else None
        return f"<MemoryPersistence records={len(self.records)} head={head}>"

    @property
    def head(self) -> str | None:
        if self.records:
            return self.records[-1].cursor
        return self.checkpoint.through if self.checkpoint else None

    async def load(self) -> Loaded:
        return Loaded(checkpoint=self.checkpoint, journal=list(self.records), head=self.head)

    async def append(
        self,
        *,
        expected: str | None,
        idempotency_key: str,
        data: bytes,
        barrier: bool,
        marks: list[Mark],
    ) -> str:
        async with self._lock:
            if idempotency_key in self._keys:
                return self._keys[idempotency_key]
            if expected != self.head:
                raise FxFencedError(
                    f"another engine appended to this session: expected {expected}, head {self.head}"
                )
            cursor = str(self._next)
            self._next += 1
            self.records.append(JournalRecord(cursor, bytes(data)))
            self.marks.append(list(marks))
            self._keys[idempotency_key] = cursor
            return cursor

    async def save_checkpoint(self, *, through: str, data: bytes) -> None:
        async with self._lock:
            self.checkpoint = StoredCheckpoint(bytes(data), through)
            # Records the checkpoint covers are no longer needed to load.
            keep = [r for r in self.records if int(r.cursor) > int(through)]
            self.records = keep
