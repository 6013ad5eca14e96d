"""Tools of tests/durable/test_delegation_celery.py's worker processes (`delegation_agents`),
and what the test reads of them (importing this creates no agent).

`charge` (not idempotent) records each real run in the Redis list `charges_key()` as
`<execution_id>|<epoch>|<amount>|<pid>` and answers `charged <amount>`. A charge of
`HELD_FROM` or more then waits (bounded) until `charge_release_key(amount)` is set and
records its execution id in `charge_done_key(amount)` before it answers, so a test can kill
-9 its worker mid-run and tell a run that finished from one that was cut.
"""

from __future__ import annotations

import os
from typing import Any

from fxengine.tools import Tool
from tests.durable import tooling
from tests.durable.approval_tooling import held_until_released
from tests.durable.tooling import PREFIX

LOOPER_MAX_DEPTH = 2  # `looper`'s max_delegation_depth
HELD_FROM = 900  # charges of this amount or more wait for their release key


def charges_key(prefix: str = PREFIX) -> str:
    return f"{prefix}:test:charges"


def charge_release_key(amount: int, prefix: str = PREFIX) -> str:
    return f"{prefix}:test:charge-release:{amount}"


def charge_done_key(amount: int, prefix: str = PREFIX) -> str:
    return f"{prefix}:test:charge-done:{amount}"


async def _charge(input: dict[str, Any], ctx: Any) -> str:
    amount = int(input.get("amount", 0))
    r = tooling._redis()
    r.rpush(charges_key(), f"{ctx.execution_id}|{ctx.epoch}|{amount}|{os.getpid()}")
    if amount >= HELD_FROM:
        await held_until_released(r, release=charge_release_key(amount), done=charge_done_key(amount),
                                  execution_id=ctx.execution_id, what=f"charge {amount}")
    return f"charged {amount}"


def charge() -> Tool:
    return Tool("charge", "Charges the customer (an effect).",
                {"type": "object", "properties": {"amount": {"type": "integer"}}}, idempotent=False, execute=_charge)
