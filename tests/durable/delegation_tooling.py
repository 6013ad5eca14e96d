"""Tools of tests/durable/test_delegation_celery.py's worker processes (`delegation_agents`),
and what the test reads of them (importing this creates no agent).

`charge` (not idempotent) records each real run in the Redis list `charges_key()` as
`<execution_id>|<epoch>|<amount>|<pid>` and answers `charged <amount>`.
"""

from __future__ import annotations

import os
from typing import Any

from fxengine.tools import Tool
from tests.durable import tooling
from tests.durable.tooling import PREFIX

LOOPER_MAX_DEPTH = 2  # `looper`'s max_delegation_depth


def charges_key(prefix: str = PREFIX) -> str:
    return f"{prefix}:test:charges"


def _charge(input: dict[str, Any], ctx: Any) -> str:
    amount = int(input.get("amount", 0))
    tooling._redis().rpush(charges_key(), f"{ctx.execution_id}|{ctx.epoch}|{amount}|{os.getpid()}")
    return f"charged {amount}"


def charge() -> Tool:
    return Tool("charge", "Charges the customer (an effect).",
                {"type": "object", "properties": {"amount": {"type": "integer"}}}, idempotent=False, execute=_charge)
