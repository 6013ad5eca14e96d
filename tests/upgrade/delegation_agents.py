"""The `FX_AGENTS` module of this release's processes in the delegation upgrade test.

Agent `triage` delegates to agent `billing` (`billing.as_tool()`); both run on the scripted
model at `FX_TEST_MODEL_URL`, and each model request carries the process's pid (header
`x-fx-pid`), so a test knows which release's worker made it.
"""

from __future__ import annotations

import os

from fxworker import Agent
from tests.durable.tooling import provider

PROVIDER = {**provider(), "headers": {"x-fx-pid": str(os.getpid())}}

billing = Agent("billing", model="scripted", instructions="You are billing.", provider=PROVIDER, api_key="test-key")
triage = Agent("triage", model="scripted", instructions="You are triage.", provider=PROVIDER, api_key="test-key",
               tools=[billing.as_tool()])
