from __future__ import annotations

import fxengine
import fxengine.tools


def test_fxengine_exports() -> None:
    assert fxengine.__all__ == [
        "BUILD",
        "Engine",
        "Turn",
        "TurnResult",
        "create_engine",
        "list_models",
        "Signal",
        "Tool",
        "ToolContext",
        "provider_tool",
        "tool",
        "Decision",
        "PendingCall",
        "approve",
        "deny",
        "submit_result",
        "check_prompt_input",
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
        "JournalRecord",
        "Loaded",
        "MemoryPersistence",
        "Persistence",
        "StoredCheckpoint",
    ]
    for name in fxengine.__all__:
        member = getattr(fxengine, name)
        if callable(member):
            assert member.__doc__, f"{name} has no docstring"


def test_fxengine_tools_exports() -> None:
    assert sorted(fxengine.tools.__all__) == fxengine.tools.__all__
    assert {"Tool", "ToolContext", "Signal", "tool", "run_calls"} <= set(fxengine.tools.__all__)
