"""One worker process carries many turns at once (§7): measured, not assumed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.celery]


def run_on_client_loop(coro: Any) -> Any:
    """Runs `coro` on the loop the blocking sessions of this process use (one store client)."""
    from fxworker.agent import _loop

    return _loop().run(coro, timeout_s=60)


def test_one_hundred_sessions_on_one_worker_take_about_as_long_as_one(workers: Any, client: Any) -> None:
    workers.start(concurrency=100)
    agent = client.agents["default"]
    agent.blocking_session().prompt("slow:200").result()  # warm the worker up

    t0 = time.monotonic()
    assert agent.blocking_session().prompt("slow:200").result().stop_reason == "end_turn"
    one_s = time.monotonic() - t0

    async def all_at_once() -> list[Any]:
        turns = await asyncio.gather(*[agent.session().prompt("slow:200") for _ in range(100)])
        # Followed one after the other: 100 blocking followers at once would need 100
        # Redis connections in this process.
        return [await t.result() for t in turns]

    t0 = time.monotonic()
    results = run_on_client_loop(all_at_once())
    hundred_s = time.monotonic() - t0
    print(f"one session: {one_s * 1000:.0f} ms; 100 sessions at once on one worker: {hundred_s * 1000:.0f} ms "
          f"({hundred_s / one_s:.1f}x)")
    assert [r.stop_reason for r in results] == ["end_turn"] * 100, [r for r in results if r.stop_reason != "end_turn"][:3]
    # Run one after the other they would take 100x; on 2 shared cores the CPU cost of
    # 100 turns (Celery, Redis, the model server, this process) bounds the figure.
    assert hundred_s < 15 * one_s
