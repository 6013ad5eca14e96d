"""A session whose agent no live worker runs (§7): it is never woken through the broker
(at 75c4587 each sweep queued one more wake, without bound), its state says which agent it
waits for, and past the give-up its inputs end FX_NO_AGENT."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from tests.support.workers import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery]

GIVE_UP_S = 8.0
SWEEP_S = 1.0


def test_a_session_nobody_runs_is_not_woken_again_and_its_inputs_end(
    workers: Any, client: Any, redis_url: str, prefix: str
) -> None:
    only_a = workers.start(
        queues=["a"], agents=["a"], concurrency=4,
        env={"FX_NO_AGENT_GIVE_UP_S": str(GIVE_UP_S), "FX_NO_AGENT_RETRY_S": "1", "FX_SWEEP_S": str(SWEEP_S)},
    )
    session = client.agents["b"].blocking_session()
    started = time.monotonic()
    first = session.prompt("for b, first")
    state = wait_until(lambda: (s := session.state()).get("noWorker") and s, 10, interval_s=0.05,
                       what="the state to say the session waits for a worker of b")
    assert state["status"] == "waiting" and state["epoch"] == 0
    assert state["noWorker"]["agent"] == "b" and state["noWorker"]["nextWakeMs"] >= state["noWorker"]["sinceMs"]

    # While it waits, the broker holds the sender's one wake and no other: no sweep adds one.
    queue = f"{prefix}:celery:fx.b"
    broker = redis.Redis.from_url(redis_url)
    try:
        most = 0
        while time.monotonic() - started < GIVE_UP_S - 2:
            most = max(most, int(broker.llen(queue)))
            time.sleep(0.2)
        assert most <= 1, most
        result = first.result()
        waited_s = time.monotonic() - started
        assert result.stop_reason == "error" and result.error["code"] == "FX_NO_AGENT", result
        assert "'b'" in result.error["message"]
        assert GIVE_UP_S - 1 <= waited_s < GIVE_UP_S + 5, waited_s
        assert int(broker.llen(queue)) <= 1
    finally:
        broker.close()
    # Its stream said why, once: one `session_waiting` line before the turn's end.
    lines = list(session.stream(0, follow=False))
    assert [line["type"] for line in lines] == ["session_waiting", "session_error", "turn_end"], lines
    assert lines[0]["noWorker"]["agent"] == "b" and lines[0]["messageId"] == first.message_id
    # One claim, the one that ended the input: the sweeps before it took nothing.
    after = session.state()
    assert after["epoch"] == 1 and after["status"] == "idle" and "noWorker" not in after
    # The worker without b took no wake of it.
    assert "no agent named 'b'" not in only_a.log_tail(200_000)
