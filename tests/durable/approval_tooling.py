"""Tools of tests/durable/test_approvals_celery.py's worker and web processes (`approval_agents`).

The tools of `tests.durable.tooling`, except that `refund` can be held mid-run: each real
run is recorded in `refunds_key()` as tooling's does (`<execution_id>|<epoch>|<amount>`),
and a run of an amount of `HELD_FROM` or more then records `<execution_id>|<pid>` in
`held_key(amount)` and waits until `release_key(amount)` is set (bounded) before it
records itself in `done_key(amount)` and answers. A test can so kill -9 the worker while
an approved refund runs, and tell a run that finished from one cut. Model requests carry
the worker's pid (header `x-fx-pid`).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from fxengine.tools import Tool
from tests.durable import tooling
from tests.durable.tooling import PREFIX, refunds_key

HELD_FROM = 900  # refunds of this amount or more wait for their release key
HOLD_BOUND_S = 60.0


def held_key(amount: int, prefix: str = PREFIX) -> str:
    return f"{prefix}:test:refund-held:{amount}"


def release_key(amount: int, prefix: str = PREFIX) -> str:
    return f"{prefix}:test:refund-release:{amount}"


def done_key(amount: int, prefix: str = PREFIX) -> str:
    return f"{prefix}:test:refund-done:{amount}"


async def held_until_released(r: Any, *, release: str, done: str, execution_id: str, what: str) -> None:
    """Waits (bounded, `HOLD_BOUND_S`) until the key `release` is set, then records
    `execution_id` in the list `done`: a run a test can cut mid-way and tell from one
    that finished."""
    deadline = time.monotonic() + HOLD_BOUND_S
    while not r.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} was never released")
        await asyncio.sleep(0.02)
    r.rpush(done, execution_id)


async def _refund(input: dict[str, Any], ctx: Any) -> str:
    amount = int(input.get("amount", 0))
    r = tooling._redis()
    r.rpush(refunds_key(), f"{ctx.execution_id}|{ctx.epoch}|{amount}")
    if amount >= HELD_FROM:
        r.rpush(held_key(amount), f"{ctx.execution_id}|{os.getpid()}")
        await held_until_released(r, release=release_key(amount), done=done_key(amount),
                                  execution_id=ctx.execution_id, what=f"refund {amount}")
    return f"refunded {amount}"


def tools() -> list[Tool]:
    refund = Tool("refund", "Refunds an order (a person approves it first).",
                  {"type": "object", "properties": {"amount": {"type": "integer"}}},
                  idempotent=False, execute=_refund, approval=True)
    return [refund if t.name == "refund" else t for t in tooling.tools()]


def provider() -> dict[str, Any]:
    return {**tooling.provider(), "headers": {"x-fx-pid": str(os.getpid())}}

