"""The `FX_AGENTS` module of tests/durable/test_delegation_celery.py's worker processes.

Three agents on the scripted model at `FX_TEST_MODEL_URL`, each model request carrying the
process's pid (header `x-fx-pid`) and each agent's instructions naming it (the test's
responder tells them apart by their system message):

- `billing`, with `charge` (not idempotent; each real run recorded in Redis,
  `tests.durable.delegation_tooling`);
- `triage`, whose one tool is `billing.as_tool()`: each call prompts a turn of `billing`;
- `looper`, whose tool delegates to `looper` itself, with `max_delegation_depth=2`.

Every process knows all three, whichever queues it consumes (`-Q fx.triage`, `fx.billing`).

`FX_TEST_AT_CHILDREN`: a fault at the instant a parking turn prompts its children
(`fxworker.delegation.start_children`), the first time only: `die-before` / `die-after`,
the process kills itself (SIGKILL) just before / just after they are prompted;
`stall-after`, its event loop stalls just after, for `FX_TEST_STALL_S` seconds (a
process starved of CPU, or paused by a long collection: nothing it holds moves on).
"""

from __future__ import annotations

import os
import signal
import time
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


def _fault_at_children(fault: str) -> None:
    start_children = delegation.start_children
    faulted = False

    async def with_fault(*args: Any, **kwargs: Any) -> int:
        nonlocal faulted
        first, faulted = not faulted, True
        if first and fault == "die-before":
            os.kill(os.getpid(), signal.SIGKILL)
        started = await start_children(*args, **kwargs)
        if first and fault == "die-after":
            os.kill(os.getpid(), signal.SIGKILL)
        if first and fault == "stall-after":
            time.sleep(float(os.environ.get("FX_TEST_STALL_S", "3")))  # blocks the loop, as a stall does
        return started

    delegation.start_children = with_fault  # type: ignore[assignment]


if os.environ.get("FX_TEST_AT_CHILDREN"):
    _fault_at_children(os.environ["FX_TEST_AT_CHILDREN"])

AGENTS = _agents()
