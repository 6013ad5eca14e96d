"""fxworker: durable agent sessions on Redis streams and Celery worker pools."""

from __future__ import annotations

from .agent import Agent, BlockingSession, BlockingTurn, Session, Turn
from .delegation import DelegateTool, delegate_tool
from .errors import (
    FxAckUnsupportedError,
    FxAgentExistsError,
    FxConfigError,
    FxInvalidCursorError,
    FxInvalidMessageIdError,
    FxInvalidSessionIdError,
    FxLeaseLostError,
    FxMessageIdInUseError,
    FxNoAgentError,
    FxQueueFullError,
    FxStoreUnavailableError,
    FxUnknownSessionError,
    FxWorkerError,
)
from .ids import new_session_id
from .info import backend_info
from .refresh_lock import redis_refresh_lock
from .registry import agents, get_agent
from fxengine.turn import TurnResult
from .settings import Settings

__all__ = [
    # agents, sessions, turns
    "Agent",
    "BlockingSession",
    "BlockingTurn",
    "Session",
    "Turn",
    "TurnResult",
    "agents",
    "get_agent",
    # agents that call agents
    "DelegateTool",
    "delegate_tool",
    "new_session_id",
    # credentials
    "redis_refresh_lock",
    # configuration
    "Settings",
    "backend_info",
    # errors
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
