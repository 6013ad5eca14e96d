"""After a normal turn end no lease stays held: 300+ sessions over two real workers (§5, §7).

A runner whose inbox watcher or lease keeper did not stop kept renewing the session's
lease and polling its inbox for ever after the turn ended: the next prompt on that
session waited behind a live lease, each such session held a Celery thread, and SIGTERM
could not end the worker (fxworker/background.py says why).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from typing import Any

import pytest
import redis

from fxworker.keys import queue_name
from tests.support.redis_server import external_redis_url
from tests.support.workers import wait_until
from tests.durable.test_celery_concurrency import run_on_client_loop

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow]

SESSIONS = 320
LEASE_S = 3.0  # FX_LEASE_S of the test workers (tests/support/workers.py)
RESERVE_S = 4.0
IDLE_WINDOW_S = 2.0
# Two idle workers poll their queues (kombu: a BRPOP a second) and try the sweeper's
# guard once a second: under 10 commands a second. A runner left renewing and polling per
# stuck session took an idle server to ~840 a second, and a sweeper retrying the guard
# without waiting to ~200.
IDLE_OPS_PER_S = 50


async def _prompt_all(agent: Any, sessions: list[Any], text: str) -> list[Any]:
    turns = await asyncio.gather(*[s.prompt(text) for s in sessions])
    # Followed one after the other: a follower per session at once would need that many
    # Redis connections in this process.
    return [await t.result() for t in turns]


async def _held_without_a_turn(sessions: list[Any]) -> list[str]:
    states = await asyncio.gather(*[s.store.state(s.id) for s in sessions])
    return [st.session_id for st in states if st.lease_holder and not st.open_turn and not st.pending]


def _commands_processed(r: redis.Redis) -> int:
    return int(r.info("stats")["total_commands_processed"])


def test_no_lease_outlives_its_turn_and_every_follow_up_runs(workers: Any, client: Any, redis_url: str,
                                                            prefix: str) -> None:
    pool = [workers.start(concurrency=100), workers.start(concurrency=100)]
    agent = client.agents["default"]
    sessions = [agent.session() for _ in range(SESSIONS)]

    results = run_on_client_loop(_prompt_all(agent, sessions, "slow:100"))
    ended_at = time.monotonic()
    assert [r.stop_reason for r in results] == ["end_turn"] * SESSIONS

    # Every runner releases its lease at the turn's end; one that did not would keep it
    # alive past any expiry by renewing it.
    held: list[str] = []
    while True:
        held = run_on_client_loop(_held_without_a_turn(sessions))
        if not held or time.monotonic() - ended_at > LEASE_S + 1:
            break
        time.sleep(0.2)
    assert held == [], f"{len(held)} of {SESSIONS} sessions keep a live lease with no turn open: {held[:5]}"

    # With every turn ended the workers go quiet: nothing renews or polls for a session.
    # (Only on the suite's own server: on a shared one, other clients' commands count too.)
    if external_redis_url() is None:
        r = redis.Redis.from_url(redis_url)
        try:
            # Sweeps during the burst woke sessions whose wake was still queued behind busy
            # workers (§7: a duplicate wake is harmless); the window starts once the
            # broker holds no message, queued or unacknowledged.
            queue, unacked = f"{prefix}:celery:{queue_name('default')}", f"{prefix}:celery:unacked"
            wait_until(lambda: r.llen(queue) == 0 and r.hlen(unacked) == 0, 20, interval_s=0.1,
                       what="the broker drained")
            before, started = _commands_processed(r), time.monotonic()
            time.sleep(IDLE_WINDOW_S)  # a rate over a window: no event marks "idle"
            rate = (_commands_processed(r) - before) / (time.monotonic() - started)
        finally:
            r.close()
        print(f"idle Redis: {rate:.0f} commands/s with two workers and {SESSIONS} sessions at rest")
        assert rate < IDLE_OPS_PER_S, f"{rate:.0f} commands/s reach Redis with every turn ended"

    follow_ups = run_on_client_loop(_prompt_all(agent, sessions, "again"))
    assert [r.stop_reason for r in follow_ups] == ["end_turn"] * SESSIONS

    for worker in pool:
        worker.signal(signal.SIGTERM)
    for worker in pool:
        assert worker.proc is not None
        try:
            worker.proc.wait(RESERVE_S + 5)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{worker!r} did not exit within {RESERVE_S + 5} s of SIGTERM: {worker.log_tail()}")
