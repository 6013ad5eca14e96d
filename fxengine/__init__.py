"""fxengine: one agent conversation in one process, with no store (DESIGN.md §9)."""

from __future__ import annotations

from .errors import (
    FxError,
    FxFencedError,
    FxInputError,
    FxJournalAppendError,
    FxJournalError,
    FxJournalVersionError,
    FxLimitError,
    FxProviderError,
    FxToolDefinitionError,
)
from .models.sse import BUILD
from .persistence import JournalRecord, Loaded, MemoryPersistence, Persistence, StoredCheckpoint

__all__ = [
    # which build of the hot path loaded: "compiled" or "pure"
    "BUILD",
    # errors
    "FxError",
    "FxFencedError",
    "FxInputError",
    "FxJournalAppendError",
    "FxJournalError",
    "FxJournalVersionError",
    "FxLimitError",
    "FxProviderError",
    "FxToolDefinitionError",
    # persistence
    "JournalRecord",
    "Loaded",
    "MemoryPersistence",
    "Persistence",
    "StoredCheckpoint",
]
