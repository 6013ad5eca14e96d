"""`SessionStore`: the session store as the code above it uses it, declared once.

The layers above the store (a claim's `LineWriter`, `LineFlusher` and `StorePersistence`,
the `LeaseKeeper`, the `InboxHub`, the web app's session list) hold a store of this type,
not `RedisStore` itself: a test's wrapper around a store, or another implementation, is
one as long as it answers these calls. `RedisStore` is one (for all three of
`redis_store()`, `embedded_store()` and `memory_store()`); the methods are its own, with
their documentation there (`_workers`, `_readers`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Protocol, TypeVar

from ._core import UNCHECKED, Op, RecordLike, StoreCore, Unchecked
from .types import Appended, Input, Mark

T = TypeVar("T")


class SessionStore(Protocol):
    """The operations of the session store that its consumers call, each awaitable."""

    @property
    def core(self) -> StoreCore:
        """Keys, validation and the clock: what a caller needs to plan an operation itself."""
        ...

    def append(
        self, session_id: str, epoch: int, *, records: Sequence[RecordLike] = (),
        lines: Sequence[Mapping[str, object]] = (), marks: Sequence[Mark] = (),
        expected: str | None | Unchecked = UNCHECKED, durable: bool = False, now_ms: int | None = None,
        idempotency_key: str | None = None, release: bool = False, checkpoint: bytes | None = None,
        pack_after: tuple[int, Sequence[str]] | None = None,
    ) -> Awaitable[Appended]:
        """The fenced write of a claim: records, marks and UI lines in one call."""
        ...

    def save_checkpoint(
        self, session_id: str, epoch: int, *, through: str | None, data: bytes, now_ms: int | None = None
    ) -> Awaitable[int]:
        """Stores a checkpoint through `through` and trims the log it covers (fenced)."""
        ...

    def renew(self, session_id: str, epoch: int, *, lease_ms: int, now_ms: int | None = None) -> Awaitable[int]:
        """Extends the claim's lease; `FxLeaseLostError` once it is gone."""
        ...

    def watch_inboxes(self, after: Mapping[str, int]) -> Awaitable[dict[str, list[Input]]]:
        """The inbox entries after `after[sid]` of each session, in one round trip."""
        ...

    def list_sessions(self, limit: int = 100) -> Awaitable[list[str]]:
        """Ids of the newest sessions the store holds, newest first."""
        ...

    def run_each(self, ops: Sequence[Op[T]], name: str) -> Awaitable[list[T | Exception]]:
        """Several one-call operations in one round trip, each answered on its own."""
        ...
