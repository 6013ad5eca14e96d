"""Redis at its memory limit mid-load (§7, §11.1): no worker exits, and every acknowledged
prompt ends once memory is back.

This module runs on a Redis of its own (`noeviction`, the default), whose `maxmemory` the
test sets just above what it holds while clients keep prompting and two workers run turns.
Prompts the store refuses meanwhile (`FX_STORE_FULL`) were never acknowledged; every one it
took must reach its `turn_end` after `maxmemory` is lifted, on the same worker processes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from fxworker.errors import FxStoreUnavailableError
from tests.chaos.faults import Pool, fault_env, lines_of
from tests.support.redis_server import RedisServer, module_redis_server, module_redis_url  # noqa: F401
from tests.support.workers import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow]

SESSIONS = 12
HEADROOM_BYTES = 16 * 1024  # full within about a second of load
SQUEEZE_S = 4.0


# The suite's Redis is replaced, for this module, by one of its own: the one whose memory this module squeezes.
PRIVATE_REDIS: dict[str, Any] = {}


def _ended(agent: Any, session_id: str) -> set[str]:
    """The message ids of the session's `turn_end` lines."""
    try:
        return {ln["messageId"] for ln in lines_of(agent, session_id) if ln["type"] == "turn_end"}
    except FxStoreUnavailableError:
        return set()


def test_a_memory_squeeze_mid_load_stops_no_worker_and_loses_no_prompt(
    workers: Any, client: Any, model: Any, redis_server: RedisServer
) -> None:
    pool = Pool(workers, fault_env(model), size=2)
    started = pool.fill()
    agent = client.agents["default"]
    admin = redis.Redis.from_url(redis_server.url)
    sessions = [agent.blocking_session() for _ in range(SESSIONS)]
    acked: dict[str, list[str]] = {}  # session id -> message ids of the prompts the store took
    refused: list[str] = []
    stop = threading.Event()

    def prompter(session: Any) -> None:
        n = 0
        while not stop.is_set():
            try:
                turn = session.prompt(f"slow:{50 + 10 * (n % 5)}")
            except FxStoreUnavailableError as exc:  # FxStoreFullError is one
                refused.append(exc.code)
            else:
                acked.setdefault(session.id, []).append(turn.message_id)
            n += 1
            stop.wait(0.15)

    threads = [threading.Thread(target=prompter, args=(s,), daemon=True) for s in sessions]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: sum(map(len, acked.values())) >= SESSIONS, 20, what="load under way")
        used = int(admin.info("memory")["used_memory"])
        oom_before = _oom_replies(admin)
        admin.config_set("maxmemory", used + HEADROOM_BYTES)
        try:
            wait_until(lambda: _oom_replies(admin) > oom_before, 20, what="the store full")
            time.sleep(SQUEEZE_S)  # the fault itself: a full store for a while, under load
        finally:
            admin.config_set("maxmemory", 0)
        stop.set()
        for t in threads:
            t.join(10)

        assert refused and set(refused) <= {"FX_STORE_FULL", "FX_STORE_UNAVAILABLE"}, refused
        assert "FX_STORE_FULL" in refused
        deadline = time.monotonic() + 90
        for session in sessions:
            want = set(acked.get(session.id, ()))
            while (missing := want - _ended(agent, session.id)) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not missing, (session.id, session.state(), sorted(missing), started[0].log_tail(5000))
        for worker in started:
            log = worker.log_tail(2_000_000)
            assert worker.proc is not None and worker.proc.poll() is None, log[-3000:]
            assert "Unrecoverable error" not in log
            assert "has no attribute" not in log, log[-5000:]
            # The sweeper says a failure once per kind and outage: a sweep that works between
            # two refused writes (reads pass at maxmemory) starts a new outage, so the count is
            # bounded by its ticks (one a second, FX_SWEEP_S 1) over the squeeze, never by attempts.
            assert log.count("sweeps fail (") <= 2 * (SQUEEZE_S + 4), log[-3000:]
    finally:
        stop.set()
        admin.config_set("maxmemory", 0)
        admin.close()


def _oom_replies(admin: redis.Redis) -> int:
    stats = admin.info("errorstats")
    return int(stats.get("errorstat_OOM", {}).get("count", 0))
