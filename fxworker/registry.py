"""The per-process agent registry: agents by name (§2, §7).

Agents register themselves when they are created. A worker routes each wake to this
process's agent of the session's name; two agents with one name in one process are an
error, agents of one name in different processes are copies of each other.

The registry sits below `fxworker.agent` (which registers into it), so it holds its
agents as what a worker reads of them (`protocol.WorkerAgent`): each is an `fxworker.Agent`.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING

from .errors import FxAgentExistsError, FxConfigError

if TYPE_CHECKING:
    from .protocol import WorkerAgent

DEFAULT_AGENT_NAME = "default"

_lock = threading.Lock()
_agents: dict[str, WorkerAgent] = {}
_imported: set[str] = set()


def register(agent: WorkerAgent) -> None:
    """Adds `agent` under its name; raises `FxAgentExistsError` when the name is taken."""
    with _lock:
        if agent.name in _agents:
            raise FxAgentExistsError(
                f"an agent named {agent.name!r} already exists in this process; "
                "agents of one name must be created once per process"
            )
        _agents[agent.name] = agent


def unregister(name: str) -> WorkerAgent | None:
    """Removes and returns the agent of `name` (tests and `Agent.close()`)."""
    with _lock:
        return _agents.pop(name, None)


def get_agent(name: str) -> WorkerAgent | None:
    """This process's agent named `name`, or None."""
    with _lock:
        return _agents.get(name)


def agents() -> dict[str, WorkerAgent]:
    """A copy of the registry: name → agent."""
    with _lock:
        return dict(_agents)


def import_agents_module(module: str | None) -> list[str]:
    """Imports the `FX_AGENTS` module once (it creates the agents); returns the names now registered."""
    if module and module not in _imported:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise FxConfigError(f"FX_AGENTS={module!r} cannot be imported: {exc} (run fx from the directory that "
                                "holds it, or add that directory to PYTHONPATH)") from exc
        except Exception as exc:  # noqa: BLE001 - the module itself failed: say where, in one line
            raise FxConfigError(f"FX_AGENTS={module!r} failed while importing: {type(exc).__name__}: {exc}") from exc
        _imported.add(module)
    return sorted(agents())
