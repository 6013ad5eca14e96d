"""What a worker adds to the protocol of `fxengine.lines` (where the lines, model events and
store marks are declared, at the bottom of the layers, so the engine and the store read
them too):

- How a delivery ended (`Outcome`), and what `Runner.run()` returns (`RunResult`).
- What a worker reads of the agent it runs a session as (`WorkerAgent`, which `Agent`
  satisfies): the runner sits below the agent module and names it only by this.

The control lines' constructors and types are re-exported here for the worker's modules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from fxengine import lines
from fxengine.lines import CONTROL_LINE_TYPES as CONTROL_LINE_TYPES
from fxengine.lines import TURN_ENDS as TURN_ENDS
from fxengine.lines import ControlLine as ControlLine
from fxengine.lines import DelegateEnd as DelegateEnd
from fxengine.lines import DelegateStart as DelegateStart
from fxengine.lines import EndBody as EndBody
from fxengine.lines import ErrorBody as ErrorBody
from fxengine.lines import SessionError as SessionError
from fxengine.lines import TurnEnd as TurnEnd
from fxengine.lines import TurnResume as TurnResume
from fxengine.lines import TurnStart as TurnStart
from fxengine.lines import TurnPause as TurnPause
from fxengine.lines import TurnYield as TurnYield
from fxengine.lines import delegate_end as delegate_end
from fxengine.lines import delegate_start as delegate_start
from fxengine.lines import end_body as end_body
from fxengine.lines import session_error as session_error
from fxengine.lines import turn_end as turn_end
from fxengine.lines import turn_resume as turn_resume
from fxengine.lines import turn_start as turn_start
from fxengine.lines import turn_pause as turn_pause
from fxengine.lines import turn_yield as turn_yield

if TYPE_CHECKING:
    from fxengine.output import Output
    from fxengine.providers import Provider
    from fxengine.tools.definition import Tool

    from .settings import Settings
    from .store import RedisStore
    from .store.types import Released, Unserved


drop = lines.drop


# -- deliveries --------------------------------------------------------------------------


class Outcome(StrEnum):
    """How a delivery (or one step of it) ended."""

    DONE = "done"  # the session ran until nothing was left
    ENDED = "ended"  # one turn (or input) ended; the runner looks for the next
    YIELDED = "yielded"  # the deadline (or a store outage) came first: a new wake goes out
    MISROUTED = "misrouted"  # the session is another agent's: the lease was let go at once
    NOOP = "noop"  # nothing to run, or a live lease elsewhere
    FENCED = "fenced"  # another epoch heads the session: this one stopped writing
    UNSETTLED = "unsettled"  # an end could not be stored: left to the lease's expiry
    PAUSED = "paused"  # the open turn parked: its calls wait for decisions, nothing is held


@dataclass(frozen=True, slots=True)
class RunResult:
    """What `Runner.run()` returns: its outcome, the agent it ran as, and what the store said.

    `owner` and `unserved` are set with `MISROUTED` (the owning agent, and the store's
    backoff when nothing was claimed); `released` is the store's answer to the release.
    """

    outcome: Outcome
    agent: WorkerAgent  # the agent it ran as: the owner's, when the wake named another of this process
    owner: str | None = None
    unserved: Unserved | None = None
    released: Released | None = None


class WorkerAgent(Protocol):
    """What a worker reads of the agent it runs a session as (`fxworker.Agent` is one)."""

    name: str
    instructions: str | Sequence[str] | None
    tools: list[Tool]
    api_key: str | None
    max_model_turns: int
    decision_timeout_s: float | None
    max_delegation_depth: int
    max_children: int

    @property
    def output(self) -> Output[Any] | None: ...

    @property
    def model(self) -> str | Mapping[str, object]: ...

    @property
    def provider(self) -> Provider | Mapping[str, object] | None: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def store(self) -> RedisStore: ...

    @property
    def lease_s(self) -> float: ...

    @property
    def reserve_s(self) -> float: ...

    def emit(self, event: Mapping[str, object]) -> None: ...

    def wake(self, session_id: str, *, agent: str | None = None, reason: str) -> None: ...
