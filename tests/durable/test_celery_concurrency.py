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


MODEL_LATENCY_MS = 200  # "slow:200": the scripted model answers each request after this


def most_in_flight(arrivals_ms: list[float], held_ms: float) -> int:
    """The most requests the model held at one instant, each held `held_ms` from its arrival."""
    arrivals = sorted(arrivals_ms)
    most, first = 0, 0
    for last, at in enumerate(arrivals):
        while arrivals[first] <= at - held_ms:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_one_hundred_sessions_on_one_worker_run_at_once(workers: Any, client: Any, model: Any) -> None:
    workers.start(concurrency=100)
    agent = client.agents["default"]
    agent.blocking_session().prompt("slow:200").result()  # warm the worker up

    t0 = time.monotonic()
    one = agent.blocking_session().prompt("slow:200").result()
    assert one.stop_reason == "end_turn", one
    one_s = time.monotonic() - t0

    async def all_at_once() -> list[Any]:
        turns = await asyncio.gather(*[agent.session().prompt("slow:200") for _ in range(100)])
        # Followed one after the other: 100 blocking followers at once would need 100
        # Redis connections in this process.
        return [await t.result() for t in turns]

    started_ms = time.time() * 1000
    t0 = time.monotonic()
    results = run_on_client_loop(all_at_once())
    hundred_s = time.monotonic() - t0
    assert [r.stop_reason for r in results] == ["end_turn"] * 100, [r for r in results if r.stop_reason != "end_turn"][:3]
    arrivals = [r.at_ms for r in model.requests if r.at_ms >= started_ms]
    assert len(arrivals) == 100
    in_flight = most_in_flight(arrivals, MODEL_LATENCY_MS)
    # The figure, not a timed assertion (bench/e2e.py measures it): a shared 2-core
    # machine's load decides it.
    print(f"one session: {one_s * 1000:.0f} ms; 100 sessions at once on one worker: {hundred_s * 1000:.0f} ms "
          f"({hundred_s / one_s:.1f}x); at most {in_flight} model requests held at once")
    # One turn after the other, the model would never hold two requests at once.
    assert in_flight >= 8
