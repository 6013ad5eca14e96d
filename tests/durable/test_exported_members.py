"""Pins fxworker's public API: a change to it is a deliberate edit here."""

from __future__ import annotations

import fxworker


def test_fxworker_exports() -> None:
    assert fxworker.__all__ == [
        "Agent",
        "BlockingSession",
        "BlockingTurn",
        "Session",
        "Turn",
        "TurnResult",
        "agents",
        "get_agent",
        "DelegateTool",
        "delegate_tool",
        "new_session_id",
        "redis_refresh_lock",
        "Settings",
        "backend_info",
        "FxAckUnsupportedError",
        "FxAgentExistsError",
        "FxConfigError",
        "FxInvalidCursorError",
        "FxInvalidMessageIdError",
        "FxInvalidSessionIdError",
        "FxLeaseLostError",
        "FxMessageIdInUseError",
        "FxNoAgentError",
        "FxQueueFullError",
        "FxStoreUnavailableError",
        "FxUnknownSessionError",
        "FxWorkerError",
    ]
    for name in fxworker.__all__:
        member = getattr(fxworker, name)
        assert member.__doc__, f"{name} has no docstring"


def test_every_error_carries_an_fx_code() -> None:
    for name in fxworker.__all__:
        member = getattr(fxworker, name)
        if isinstance(member, type) and issubclass(member, Exception):
            assert member.code.startswith("FX_"), name
