"""A Redis restart in the middle of a turn (§11.1): the acknowledged prompt still ends.

This module runs on a Redis of its own (AOF, `appendfsync always`, so a restart keeps
every acknowledged write), which the test stops while a worker streams a turn: the
worker's store calls fail with `FX_STORE_UNAVAILABLE` (its lines, its record, its
renewals), then Redis comes back on the same port and the turn reaches `turn_end`,
on that worker or, if its lease died meanwhile, on the takeover the sweeper sends.
"""

from __future__ import annotations

from typing import Any

import pytest

from fxworker.errors import FxStoreUnavailableError
from tests.chaos.faults import Pool, assert_no_stale_line, fault_env, lines_of, pid_of, requests_for, responder, wait_line
from tests.support.redis_server import RedisServer, module_redis_server, module_redis_url  # noqa: F401
from tests.support.workers import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow]


# The suite's Redis is replaced, for this module, by one of its own: the one this module may restart.
PRIVATE_REDIS: dict[str, Any] = {"appendonly": True, "args": ("--appendfsync", "always")}


@pytest.fixture(scope="module")
def pool(workers: Any, model: Any) -> Pool:
    model.responder = responder
    p = Pool(workers, fault_env(model), size=1)
    p.fill()
    return p


def _store_failed(log: str) -> bool:
    return "FX_STORE_UNAVAILABLE" in log or "Connection refused" in log or "Error 111" in log


def _ends(agent: Any, session_id: str, n: int) -> list[dict[str, Any]] | None:
    """The session's `turn_end` lines once there are `n`; None before (or while Redis is away)."""
    try:
        found = [ln for ln in lines_of(agent, session_id) if ln["type"] == "turn_end"]
    except FxStoreUnavailableError:
        return None  # this process's pooled connection died with the restart; the next call reconnects
    return found if len(found) >= n else None


def _wait_end(agent: Any, session_id: str, n: int, timeout_s: float, worker: Any, what: str) -> list[dict[str, Any]]:
    try:
        return wait_until(lambda: _ends(agent, session_id, n), timeout_s, interval_s=0.1, what=what)  # type: ignore[return-value]
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; the worker's log:\n{worker.log_tail(30_000)}") from None


def _outage_mid_turn(pool: Pool, client: Any, model: Any, redis_server: RedisServer, name: str,
                     back_when: Any) -> tuple[Any, Any, Any]:
    """Starts `hold:<name>`, stops Redis once text is stored, releases the model, and starts
    Redis again when `back_when(new worker log)` holds. Returns (session, turn, worker)."""
    agent = client.agents["default"]
    session = agent.blocking_session()
    turn = session.prompt(f"hold:{name}")  # acknowledged: stored before prompt() returned
    model.wait_held(name, timeout_s=15)
    wait_line(agent, session.id, lambda ln: ln["type"] == "text_delta", 5, what="partial text stored")
    worker = pool.by_pid(pid_of(requests_for(model, f"hold:{name}")[-1]))
    log_before = len(worker.log_tail(10_000_000))
    redis_server.stop()
    try:
        model.release(name)  # the worker now has a response to record, and no Redis
        wait_until(lambda: back_when(worker.log_tail(10_000_000)[log_before:]), 15,
                   what="the worker's store calls failing")
    finally:
        redis_server.start()
    return session, turn, worker


def _then_the_session_goes_on(client: Any, session: Any, turn: Any, worker: Any) -> list[dict[str, Any]]:
    agent = client.agents["default"]
    first = _wait_end(agent, session.id, 1, 20, worker, "turn_end after the restart")
    assert first[0]["stopReason"] == "end_turn", first[0]
    assert turn.result().stop_reason == "end_turn"
    # The worker survived the outage and takes new work (its broker consumer reconnected).
    assert worker.proc is not None and worker.proc.poll() is None, worker.log_tail()
    after = session.prompt("after the restart")
    _wait_end(agent, session.id, 2, 15, worker, "the next prompt's turn_end")
    assert after.result().stop_reason == "end_turn"
    lines = lines_of(agent, session.id)
    assert_no_stale_line(lines)
    assert [ln["type"] for ln in lines].count("turn_end") == 2
    assert not [ln for ln in lines if ln.get("error") or ln["type"] == "session_error"], lines
    return lines


def test_a_redis_restart_mid_turn_still_ends_the_acknowledged_prompt(
    pool: Pool, client: Any, model: Any, redis_server: RedisServer
) -> None:
    """A short outage: the worker's fenced append is retried with its idempotency key."""
    session, turn, worker = _outage_mid_turn(pool, client, model, redis_server, "redis1", _store_failed)
    _then_the_session_goes_on(client, session, turn, worker)


def test_an_outage_past_the_lease_leaves_the_turn_open_and_a_later_delivery_ends_it(
    pool: Pool, client: Any, model: Any, redis_server: RedisServer
) -> None:
    """Redis stays away until the worker gives its writes up (the lease is due): the turn is
    left open, with no error line, and after the restart the sweeper's delivery resumes it."""
    session, turn, worker = _outage_mid_turn(
        pool, client, model, redis_server, "redis2", lambda log: "giving up" in log
    )
    lines = _then_the_session_goes_on(client, session, turn, worker)
    resumes = [ln for ln in lines if ln["type"] == "turn_resume"]
    assert resumes and resumes[0]["interrupted"] is True, lines
    assert resumes[0]["epoch"] > lines[0]["epoch"]
