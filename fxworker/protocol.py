"""The protocol between the engine, the runner, the store and the UI, declared once.

- The control lines a worker writes to a session's UI stream around the engine's own
  model-facing events (docs/design.md §4): `turn_start`, `turn_resume`, `turn_yield`,
  `turn_end`, `session_error`. Each is a `TypedDict` with a `Literal` type and is built by
  its function here; the turn-end body `{stopReason, usage, error?}` is built once
  (`end_body`), for the line and for the engine's own record.
- `drop`, the store mark that consumes an input no turn takes (the engine's own marks are
  `fxengine.persistence`'s).
- How a delivery ended (`Outcome`), and what `Runner.run()` returns (`RunResult`).
- What a worker reads of the agent it runs a session as (`WorkerAgent`, which `Agent`
  satisfies): the runner sits below the agent module and names it only by this.

Every line also carries `messageId` (the turn's id), and the store adds `cursor` and
`epoch` as it writes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, NotRequired, Protocol, TypedDict

from fxengine.events import EndBody as EndBody
from fxengine.events import end_body as end_body
from fxengine.persistence import Mark

if TYPE_CHECKING:
    from fxengine.providers import Provider
    from fxengine.tools.definition import Tool

    from .settings import Settings
    from .store import RedisStore
    from .store.types import Released, Unserved


class ErrorBody(TypedDict):
    """An error as lines and results carry it."""

    code: str
    message: str
    cause: NotRequired[dict[str, Any]]


class TurnStart(TypedDict):
    type: Literal["turn_start"]
    messageId: str | None
    sessionId: str
    input: str | None


class TurnResume(TypedDict):
    type: Literal["turn_resume"]
    messageId: str | None
    sessionId: str
    interrupted: bool
    retract: NotRequired[list[int]]


class TurnYield(TypedDict):
    type: Literal["turn_yield"]
    messageId: str | None


class TurnEnd(EndBody):
    type: Literal["turn_end"]
    messageId: str | None


class SessionError(TypedDict):
    type: Literal["session_error"]
    messageId: str | None
    code: str
    message: str
    id: str | None


ControlLine = TurnStart | TurnResume | TurnYield | TurnEnd | SessionError
CONTROL_LINE_TYPES = ("turn_start", "turn_resume", "turn_yield", "turn_end", "session_error")
# The lines that end a turn's following: it ended, or it stays open for the next delivery.
TURN_ENDS = ("turn_end",)


def turn_start(message_id: str | None, session_id: str, text: str | None) -> TurnStart:
    return {"type": "turn_start", "messageId": message_id, "sessionId": session_id, "input": text}


def turn_resume(message_id: str | None, session_id: str, *, interrupted: bool, retract: Sequence[int] = ()) -> TurnResume:
    line: TurnResume = {"type": "turn_resume", "messageId": message_id, "sessionId": session_id,
                        "interrupted": interrupted}
    if retract:
        line["retract"] = list(retract)
    return line


def turn_yield(message_id: str | None) -> TurnYield:
    return {"type": "turn_yield", "messageId": message_id}


def turn_end(message_id: str | None, body: EndBody) -> TurnEnd:
    line: TurnEnd = {"type": "turn_end", "messageId": message_id, "stopReason": body["stopReason"],
                     "usage": body["usage"]}
    if "error" in body:
        line["error"] = body["error"]
    return line


def session_error(message_id: str | None, error: Mapping[str, Any], input_id: str | None) -> SessionError:
    return {"type": "session_error", "messageId": message_id, "code": str(error.get("code")),
            "message": str(error.get("message")), "id": input_id}


# -- store marks -----------------------------------------------------------------------


def drop(input_id: str) -> Mark:
    """The store mark that consumes an input no turn takes (cancelled, or refused before it
    started); the store refuses a mark name it does not know (`store/_replies.encode_marks`)."""
    return {"drop": input_id}


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
    model: str | dict[str, Any]
    instructions: str | Sequence[str] | None
    tools: list[Tool]
    provider: Provider | dict[str, Any] | None
    api_key: str | None
    max_model_turns: int

    @property
    def settings(self) -> Settings: ...

    @property
    def store(self) -> RedisStore: ...

    @property
    def lease_s(self) -> float: ...

    @property
    def reserve_s(self) -> float: ...

    def emit(self, event: dict[str, Any]) -> None: ...

    def wake(self, session_id: str, *, agent: str | None = None, reason: str) -> None: ...
