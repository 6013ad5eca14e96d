"""`StorePersistence`: the engine's `Persistence` (DESIGN.md §9) over one claimed session.

`load()` answers from the claim (no round trip). `append()` is the store's fenced append:
a record whose epoch lost the lease raises `FxLeaseLostError` (an `FxFencedError`), one
whose `expected` is not the log head raises `FxFencedError`; either way nothing is
stored. UI lines queued with `queue_lines()` ride along in the next append, so a step's
record and its lines cost one round trip; `flush_lines()` sends what is left.
`save_checkpoint()` compacts the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fxengine.persistence import Loaded, Mark

from .types import Appended, Claim, StoreRecord

if TYPE_CHECKING:
    from .redis import RedisStore


class StorePersistence:
    """One engine's journal in one session, written under one lease epoch."""

    def __init__(self, store: RedisStore, session_id: str, epoch: int, claim: Claim) -> None:
        self.store = store
        self.session_id = session_id
        self.epoch = epoch
        self.claim = claim
        self.head = claim.head
        self._lines: list[Mapping[str, Any]] = []
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<StorePersistence session={self.session_id} epoch={self.epoch} head={self.head} queued={len(self._lines)}>"

    def queue_lines(self, lines: Iterable[Mapping[str, Any]]) -> None:
        """UI lines to store with the next record (or with `flush_lines()`)."""
        self._lines.extend(lines)

    async def flush_lines(self) -> list[int]:
        """Stores the queued UI lines now (fenced); returns their cursors."""
        async with self._lock:
            if not self._lines:
                return []
            lines, self._lines = self._lines, []
            try:
                appended = await self.store.append(self.session_id, self.epoch, lines=lines)
            except BaseException:
                self._lines[:0] = lines
                raise
            return appended.lines

    async def load(self) -> Loaded:
        return self.claim.loaded()

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
            lines, self._lines = self._lines, []
            try:
                appended: Appended = await self.store.append(
                    self.session_id,
                    self.epoch,
                    records=[StoreRecord(idempotency_key, bytes(data), list(marks))],
                    lines=lines,
                    expected=expected,
                    durable=barrier,
                )
            except BaseException:
                self._lines[:0] = lines
                raise
            self.head = appended.records[0]
            return appended.records[0]

    async def save_checkpoint(self, *, through: str, data: bytes) -> None:
        async with self._lock:
            await self.store.save_checkpoint(self.session_id, self.epoch, through=through, data=data)
