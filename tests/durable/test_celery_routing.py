"""Routing by agent name: FX_NO_AGENT redelivery until a worker with the agent starts (§7)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.workers import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery]


def test_a_session_of_b_is_redelivered_until_a_worker_with_b_starts(workers: Any, client: Any) -> None:
    only_a = workers.start(queues=["b"], agents=["a"], concurrency=4)
    session = client.agents["b"].blocking_session()
    turn = session.prompt("for b")
    # The worker with only `a` refuses it (FX_NO_AGENT) and Celery retries it.
    wait_until(lambda: only_a.log_tail(20000).count("FX_NO_AGENT") + only_a.log_tail(20000).count("no agent named") >= 2,
               15, interval_s=0.1, what="two FX_NO_AGENT refusals")
    assert session.state()["status"] == "waiting"
    t0 = time.monotonic()
    workers.start(queues=["b"], agents=["b"], concurrency=4)
    result = turn.result()
    print(f"with a worker for b: ended {time.monotonic() - t0:.2f} s after it started")
    assert result.stop_reason == "end_turn"
    assert session.state()["agent"] == "b"


def test_a_prompt_sent_through_another_agent_runs_on_the_owner(workers: Any, client: Any) -> None:
    owner = client.agents["b"].blocking_session()
    owner.prompt("owned by b").result()
    client.events.clear()
    other = client.agents["a"].blocking_session(owner.id)
    result = other.prompt("sent through a").result()
    assert result.stop_reason == "end_turn"
    forwarded = [e for e in client.events if e["type"] == "session.forwarded"]
    assert forwarded and forwarded[0]["sessionId"] == owner.id and forwarded[0]["to"] == "b"
