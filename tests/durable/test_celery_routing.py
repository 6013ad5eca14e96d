"""Routing by agent name (§7): a worker leaves the queue of an agent it does not run, so a
session of that agent waits (`noWorker`) until a worker that runs it starts, then runs at once."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.workers import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery]


def test_a_session_of_b_waits_until_a_worker_with_b_starts_then_runs_at_once(workers: Any, client: Any) -> None:
    """A worker told to consume `fx.b` without agent `b` (a stale deploy, a `--queues`
    mistake) says so and leaves that queue: the wake waits there for a worker that runs
    `b`, and is never refused over and over by the one that does not (at 75c4587 the
    refused retries kept landing on it: 11 refusals, the turn ran after 146 s)."""
    only_a = workers.start(queues=["b"], agents=["a"], concurrency=4)
    assert "does not consume its queue fx.b" in only_a.log_tail(20000)
    session = client.agents["b"].blocking_session()
    turn = session.prompt("for b")
    state = wait_until(lambda: (s := session.state()).get("noWorker") and s, 10, interval_s=0.05,
                       what="the state to say the session waits for a worker of b")
    assert state["status"] == "waiting" and state["epoch"] == 0
    workers.start(queues=["b"], agents=["b"], concurrency=4)  # returns once it is ready
    t0 = time.monotonic()
    result = turn.result()
    took_s = time.monotonic() - t0
    print(f"with a worker for b: ended {took_s:.2f} s after it was ready")
    assert result.stop_reason == "end_turn"
    assert took_s < 2.0, took_s
    after = session.state()
    assert after["agent"] == "b" and after["epoch"] == 1 and "noWorker" not in after
    # The worker without b took no wake of it, so it refused none.
    assert "no agent named 'b'" not in only_a.log_tail(200_000)


def test_a_prompt_sent_through_another_agent_runs_on_the_owner(workers: Any, client: Any) -> None:
    owner = client.agents["b"].blocking_session()
    owner.prompt("owned by b").result()
    client.events.clear()
    other = client.agents["a"].blocking_session(owner.id)
    result = other.prompt("sent through a").result()
    assert result.stop_reason == "end_turn"
    forwarded = [e for e in client.events if e["type"] == "session.forwarded"]
    assert forwarded and forwarded[0]["sessionId"] == owner.id and forwarded[0]["to"] == "b"
