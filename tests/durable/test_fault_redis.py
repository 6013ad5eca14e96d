"""A Redis restart in the middle of a turn (§11.1): the acknowledged prompt still ends.

This module runs on a Redis of its own (AOF, `appendfsync always`, so a restart keeps
every acknowledged write), which the test stops while a worker streams a turn: the
worker's store calls fail with `FX_STORE_UNAVAILABLE` (its lines, its record, its
renewals), then Redis comes back on the same port and the turn reaches `turn_end`,
on that worker or, if its lease died meanwhile, on the takeover the sweeper sends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fxworker.errors import FxStoreUnavailableError
from tests.chaos.faults import Pool, assert_no_stale_line, fault_env, lines_of, pid_of, requests_for, responder, wait_line
from tests.support.redis_server import RedisServer
from tests.support.workers import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(appendonly=True, args=("--appendfsync", "always"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def redis_url(redis_server: RedisServer) -> str:
    """Overrides the suite's Redis for this module: the one this module may restart."""
    return redis_server.url


@pytest.fixture(scope="module")
def pool(workers: Any, model: Any) -> Pool:
    model.responder = responder
    p = Pool(workers, fault_env(model), size=1)
    p.fill()
    return p


def _store_failed(log: str) -> bool:
    return "FX_STORE_UNAVAILABLE" in log or "Connection refused" in log or "Error 111" in log


@pytest.mark.xfail(
    strict=True,
    reason="fxworker/runner.py ends the turn with error FX_JOURNAL_APPEND_FAILED when a fenced "
    "append meets FX_STORE_UNAVAILABLE, or lets the error escape Runner.run unreleased",
)
def test_a_redis_restart_mid_turn_still_ends_the_acknowledged_prompt(
    pool: Pool, client: Any, model: Any, redis_server: RedisServer
) -> None:
    agent = client.agents["default"]
    session = agent.blocking_session()
    turn = session.prompt("hold:redis1")  # acknowledged: stored before prompt() returned
    model.wait_held("redis1", timeout_s=15)
    wait_line(agent, session.id, lambda ln: ln["type"] == "text_delta", 5, what="partial text stored")
    worker = pool.by_pid(pid_of(requests_for(model, "hold:redis1")[-1]))
    log_before = len(worker.log_tail(10_000_000))
    redis_server.stop()
    try:
        model.release("redis1")  # the worker now has a response to record, and no Redis
        wait_until(lambda: _store_failed(worker.log_tail(10_000_000)[log_before:]), 15,
                   what="the worker's store calls failing")
    finally:
        redis_server.start()
    def ends(n: int) -> list[dict[str, Any]] | None:
        try:
            found = [ln for ln in lines_of(agent, session.id) if ln["type"] == "turn_end"]
        except FxStoreUnavailableError:
            return None  # this process's pooled connection died with the restart; the next call reconnects
        return found if len(found) >= n else None

    first = wait_until(lambda: ends(1), 20, interval_s=0.1, what="turn_end after the restart")
    assert first[0]["stopReason"] == "end_turn", first[0]  # type: ignore[index]
    assert turn.result().stop_reason == "end_turn"
    # The worker survived the outage and takes new work.
    assert worker.proc is not None and worker.proc.poll() is None
    after = session.prompt("after the restart")
    wait_until(lambda: ends(2), 15, interval_s=0.1, what="the next prompt's turn_end")
    assert after.result().stop_reason == "end_turn"
    lines = lines_of(agent, session.id)
    assert_no_stale_line(lines)
    assert [ln["type"] for ln in lines].count("turn_end") == 2
