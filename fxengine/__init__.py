"""fxengine: one agent conversation in one process, with no store (docs/design.md §9)."""

from __future__ import annotations

from .approvals import Decision, approve, deny, submit_result
from .engine import Engine, create_engine
from .errors import (
    FxError,
    FxFencedError,
    FxInputError,
    FxJournalAppendError,
    FxJournalError,
    FxJournalVersionError,
    FxLimitError,
    FxModelUnsupportedError,
    FxProviderError,
    FxSteerDeferredError,
    FxToolDefinitionError,
)
from .limits import check_prompt_input
from .lines import PendingCall
from .models.sse import BUILD
from .persistence import JournalRecord, Loaded, MemoryPersistence, Persistence, StoredCheckpoint
from .providers import list_models
from .tools import Signal, Tool, ToolContext, provider_tool, tool
from .turn import Turn, TurnResult

__version__ = "0.1.0"

__all__ = [
    # which build of the hot path loaded: "compiled" or "pure"
    "BUILD",
    # the engine
    "Engine",
    "Turn",
    "TurnResult",
    "create_engine",
    # models
    "list_models",
    # tools
    "Signal",
    "Tool",
    "ToolContext",
    "provider_tool",
    "tool",
    # paused turns: the calls they wait on and the decisions that resume them
    "Decision",
    "PendingCall",
    "approve",
    "deny",
    "submit_result",
    # input checks
    "check_prompt_input",
    # errors
    "FxError",
    "FxFencedError",
    "FxInputError",
    "FxJournalAppendError",
    "FxJournalError",
    "FxJournalVersionError",
    "FxLimitError",
    "FxModelUnsupportedError",
    "FxProviderError",
    "FxSteerDeferredError",
    "FxToolDefinitionError",
    # persistence
    "JournalRecord",
    "Loaded",
    "MemoryPersistence",
    "Persistence",
    "StoredCheckpoint",
]
