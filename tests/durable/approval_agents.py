"""The `FX_AGENTS` module of tests/durable/test_approvals_celery.py's worker and web processes.

One agent, `default`, on the scripted model at `FX_TEST_MODEL_URL`, with the tools of
`tests.durable.approval_tooling` (a `refund` that can be held mid-run); each model request
carries the process's pid (header `x-fx-pid`).
"""

from __future__ import annotations

from fxworker import Agent
from tests.durable.approval_tooling import provider, tools

AGENTS = {"default": Agent("default", model="scripted", provider=provider(), tools=tools(), api_key="test-key")}
