"""The `FX_AGENTS` module of tests/durable/test_delegation_celery.py's worker processes.

Three agents on the scripted model at `FX_TEST_MODEL_URL`, each model request carrying the
process's pid (header `x-fx-pid`) and each agent's instructions naming it (the test's
responder tells them apart by their system message):

- `billing`, with `charge` (not idempotent; each real run recorded in Redis,
  `tests.durable.delegation_tooling`);
- `triage`, whose one tool is `billing.as_tool()`: each call prompts a turn of `billing`;
- `looper`, whose tool delegates to `looper` itself, with `max_delegation_depth=2`.

Every process knows all three, whichever queues it consumes (`-Q fx.triage`, `fx.billing`).
"""

from __future__ import annotations

from typing import Any

from fxworker import Agent, delegate_tool
from tests.durable.approval_tooling import provider
from tests.durable.delegation_tooling import LOOPER_MAX_DEPTH, charge


def _agents() -> dict[str, Agent]:
    common: dict[str, Any] = dict(model="scripted", provider=provider(), api_key="test-key")
    billing = Agent("billing", instructions="You are billing.", tools=[charge()], **common)
    triage = Agent("triage", instructions="You are triage.", tools=[billing.as_tool()], **common)
    looper = Agent("looper", instructions="You are looper.", max_delegation_depth=LOOPER_MAX_DEPTH,
                   tools=[delegate_tool("looper", name="looper", description="Asks looper.")], **common)
    return {a.name: a for a in (triage, billing, looper)}


AGENTS = _agents()
