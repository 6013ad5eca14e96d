"""The `FX_AGENTS` module of the previous release's billing worker in the delegation
upgrade test (tests/upgrade/test_delegation_upgrade.py).

The test copies this file into the previous release's materialised tree, so it imports
only what that release has (no delegation): agent `billing`, named and configured as
tests/upgrade/delegation_agents.py configures it, on the scripted model at
`FX_TEST_MODEL_URL`, each request carrying the process's pid (header `x-fx-pid`).
"""

from __future__ import annotations

import os

from fxworker import Agent
from tests.durable.tooling import provider

PROVIDER = {**provider(), "headers": {"x-fx-pid": str(os.getpid())}}

billing = Agent("billing", model="scripted", instructions="You are billing.", provider=PROVIDER, api_key="test-key")
