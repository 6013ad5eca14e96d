"""The `FX_AGENTS` module of tests/durable/test_delegation_celery.py's worker processes.

Three agents on the scripted model at `FX_TEST_MODEL_URL`, each model request carrying the
process's pid (header `x-fx-pid`) and each agent's instructions naming it (the test's
responder tells them apart by their system message):

- `billing`, with `charge` (not idempotent; each real run recorded in Redis,
  `tests.durable.delegation_tooling`);
- `triage`, whose one tool is `billing.as_tool()`: each call prompts a turn of `billing`;
- `looper`, whose tool delegates to `looper` itself, with `max_delegation_depth=2`.

Every process knows all three, whichever queues it consumes (`-Q fx.triage`, `fx.billing`).

`FX_TEST_DIE_AFTER_CHILDREN=1`: the process kills itself (SIGKILL) the first time a
parking turn has prompted its children (`fxworker.delegation.start_children` returned),
before the record that parks the turn is stored: a kill -9 at that instant exactly.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from fxworker import Agent, delegate_tool, delegation
from tests.durable.approval_tooling import provider
from tests.durable.delegation_tooling import LOOPER_MAX_DEPTH, charge


def _agents() -> dict[str, Agent]:
    common: dict[str, Any] = dict(model="scripted", provider=provider(), api_key="test-key")
    billing = Agent("billing", instructions="You are billing.", tools=[charge()], **common)
    triage = Agent("triage", instructions="You are triage.", tools=[billing.as_tool()], **common)
    looper = Agent("looper", instructions="You are looper.", max_delegation_depth=LOOPER_MAX_DEPTH,
                   tools=[delegate_tool("looper", name="looper", description="Asks looper.")], **common)
    return {a.name: a for a in (triage, billing, looper)}


def _die_after_children() -> None:
    start_children = delegation.start_children

    async def start_then_die(*args: Any, **kwargs: Any) -> int:
        started = await start_children(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
        return started

    delegation.start_children = start_then_die  # type: ignore[assignment]


if os.environ.get("FX_TEST_DIE_AFTER_CHILDREN") == "1":
    _die_after_children()

AGENTS = _agents()
