"""Typed turns in the store: how an input names the type its answer must validate as
(docs/design.md §6 "Typed answers").

A prompt of an agent with an `output_type`, or one given its own, is stored with
``settings["output"] = {"v": 1, "type", "mode", "retries"}``: `type` is ``"@agent"`` (the
answer type of the agent the worker runs) or ``"module:Name"``, imported on the worker
from that name (a type is never pickled into the store). The input needs layout level
`TYPED_LEVEL`, so a process of an older release, which would end the turn with untyped
text, never claims it. `output_of` is the worker's reader: it checks the version and
rebuilds the `fxengine.output.Output`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from fxengine.codes import Code
from fxengine.errors import FxInputError, FxJournalVersionError
from fxengine.output import MODES, Output

if TYPE_CHECKING:
    from .protocol import WorkerAgent

__all__ = ["AGENT_TYPE", "OUTPUT_KEY", "OUTPUT_VERSION", "StoredOutput", "check_version", "output_of", "stored"]

OUTPUT_KEY = "output"
OUTPUT_VERSION = 1
AGENT_TYPE = "@agent"


class StoredOutput(TypedDict):
    """`settings["output"]`: the answer type of a typed input, by name."""

    v: int
    type: str
    mode: str
    retries: int


def stored(output: Output[Any], agent_output: Output[Any] | None) -> StoredOutput:
    """How `output` is stored with an input: by the agent's own type, or by import path.

    Raises `FX_OUTPUT_TYPE_INVALID` for a type a worker could not import by name (a
    union, a class defined in a function or in `__main__`): give it to the `Agent`, or
    name a module-level class."""
    if agent_output is not None and output.type is agent_output.type:
        name = AGENT_TYPE
    elif output.name is not None:
        name = output.name
    else:
        raise FxInputError(
            f"output_type {output.type!r} cannot be named for a worker to import: a prompt's own output_type must be "
            "a class defined at module level (not in __main__ or a function), or set it on the Agent",
            code=Code.OUTPUT_TYPE_INVALID)
    return {"v": OUTPUT_VERSION, "type": name, "mode": output.mode, "retries": output.retries}


def check_version(settings: object) -> None:
    """`FxJournalVersionError` for an `output` a newer release wrote: the input is left to a
    process that reads it (`Work._let_go_for_newer`), nothing ended."""
    raw = settings.get(OUTPUT_KEY) if isinstance(settings, Mapping) else None
    version = raw.get("v") if isinstance(raw, Mapping) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > OUTPUT_VERSION:
        raise FxJournalVersionError(f"a typed answer of version {version} (this release reads {OUTPUT_VERSION})")


def output_of(settings: object, agent: WorkerAgent) -> Output[Any] | None:
    """The typing of an input's turn: its stored `output`, else its agent's (None: untyped).

    Raises `FX_OUTPUT_TYPE_INVALID` when the stored one cannot be used here: its type does
    not import on this worker, or it names the agent's type and this agent has none."""
    raw = settings.get(OUTPUT_KEY) if isinstance(settings, Mapping) else None
    if raw is None:
        return agent.output
    if (not isinstance(raw, Mapping) or not isinstance(raw.get("type"), str) or raw.get("mode") not in MODES
            or isinstance(raw.get("retries"), bool) or not isinstance(raw.get("retries"), int)):
        raise FxInputError(f"the stored output of this input is not of the form {{v, type, mode, retries}}: {raw!r}",
                           code=Code.OUTPUT_TYPE_INVALID)
    if raw["type"] == AGENT_TYPE:
        if agent.output is None:
            raise FxInputError(f"the input's answer type is agent {agent.name!r}'s, and that agent has no output_type "
                               "on this worker (deploy the same agents module to web and workers)",
                               code=Code.OUTPUT_TYPE_INVALID)
        return Output(agent.output.type, mode=str(raw["mode"]), retries=int(raw["retries"]))
    return Output(raw["type"], mode=str(raw["mode"]), retries=int(raw["retries"]))
