"""The `FX_AGENTS` module of both releases' processes in the typed-answer upgrade test
(tests/upgrade/test_typed_upgrade.py).

Agent `invoices` answers with an `Invoice` (output_type, the final-result tool); agent
`notes` answers in text. The test copies this file into the previous release's
materialised tree, whose `Agent` takes no `output_type`: there `invoices` is the same
agent, untyped, as the agents module a deploy replaces would define it. Both run on the
scripted model at `FX_TEST_MODEL_URL`, each request carrying the process's pid (header
`x-fx-pid`), so a test knows which release's worker made it.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from pydantic import BaseModel

from fxworker import Agent
from tests.durable.tooling import provider

PROVIDER = {**provider(), "headers": {"x-fx-pid": str(os.getpid())}}


class Invoice(BaseModel):
    number: str
    total: int


# Whether this release's `Agent` types answers. (Not `import fxworker.typed`: in the
# previous release's processes the venv's editable finder would load that module from
# this checkout.)
RELEASE_TYPED = "output_type" in inspect.signature(Agent.__init__).parameters
TYPED: dict[str, Any] = {"output_type": Invoice, "output_mode": "tool"} if RELEASE_TYPED else {}

invoices = Agent("invoices", model="scripted", instructions="You are invoices.", provider=PROVIDER,
                 api_key="test-key", **TYPED)
notes = Agent("notes", model="scripted", instructions="You are notes.", provider=PROVIDER, api_key="test-key")
