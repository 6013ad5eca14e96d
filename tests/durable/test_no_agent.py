"""A session whose agent no worker runs (§7): wakes back off to a bound without claiming,
the state says which agent it waits for, and past the give-up its inputs end FX_NO_AGENT."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.workers import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery]

RETRY_MAX_S = 1.0
GIVE_UP_S = 8.0


def test_a_session_nobody_runs_backs_off_without_claiming_then_its_inputs_end(workers: Any, client: Any) -> None:
    only_a = workers.start(
        queues=["b"], agents=["a"], concurrency=4,
        env={"FX_NO_AGENT_RETRY_S": str(RETRY_MAX_S), "FX_NO_AGENT_GIVE_UP_S": str(GIVE_UP_S)},
    )
    session = client.agents["b"].blocking_session()
    started = time.monotonic()
    first = session.prompt("for b, first")
    second = session.prompt("for b, second")
    state = wait_until(lambda: (s := session.state()).get("noWorker") and s, 10, interval_s=0.05,
                       what="the state to say the session waits for a worker of b")
    assert state["status"] == "waiting" and state["epoch"] == 0
    assert state["noWorker"]["agent"] == "b" and state["noWorker"]["nextWakeMs"] >= state["noWorker"]["sinceMs"]

    result = first.result()
    waited_s = time.monotonic() - started
    assert result.stop_reason == "error" and result.error["code"] == "FX_NO_AGENT", result
    assert "'b'" in result.error["message"]
    assert second.result().error["code"] == "FX_NO_AGENT"
    assert GIVE_UP_S - 1 <= waited_s < GIVE_UP_S + 3 * RETRY_MAX_S + 5, waited_s
    # One claim, the one that ended the inputs: the misses before it took nothing.
    after = session.state()
    assert after["epoch"] == 1 and after["status"] == "idle" and "noWorker" not in after
    # The wakes backed off: a quarter second doubling to the bound, not one per sweep or retry.
    log = only_a.log_tail(200_000)
    refusals = log.count("retrying in")
    most = 4 + GIVE_UP_S / RETRY_MAX_S + 2
    assert 3 <= refusals <= most, (refusals, log[-3000:])
