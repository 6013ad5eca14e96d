"""The `FX_AGENTS` module of the durable tests' worker processes.

Creates agents `default`, `a` and `b` (or the subset named by `FX_TEST_AGENTS`), all on
the scripted model at `FX_TEST_MODEL_URL`, with the tools of `tests.durable.tooling`.
"""

from __future__ import annotations

import os

from fxworker import Agent
from tests.durable.tooling import provider, tools

NAMES = [n for n in os.environ.get("FX_TEST_AGENTS", "default,a,b").split(",") if n]

AGENTS = {name: Agent(name, model="scripted", provider=provider(), tools=tools(), api_key="test-key") for name in NAMES}
