"""A broker connection lost while a turn runs on the threads pool: no traceback per running
task (Celery's cancel-on-connection-loss raises NotImplementedError on that pool, so it is
on only where the pool can cancel), and the turn runs on to its end.

Runs its own redis-server: killing every client connection is the fault.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from fxengine.testing import Reply, ScriptedModel, text, tool_call
from fxworker import Agent, Settings
from fxworker.celery_app import make_celery_app, pool_can_cancel
from fxworker.store import redis_store
from fxworker.wakers import CeleryWaker
from tests.support.redis_server import RedisServer
from tests.support.workers import Workers, wait_until
from tests.web.test_redis_drops import kill_clients

pytestmark = [pytest.mark.redis, pytest.mark.celery]

TOOL_S = 4.0


def slow_responder(request: Any) -> Reply:
    last = (request.body.get("messages") or [{}])[-1]
    if last.get("role") == "tool":
        return Reply(text("done"))
    return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "slow", {"seconds": TOOL_S}))


def test_cancel_on_connection_loss_is_on_only_for_pools_that_can_cancel() -> None:
    assert pool_can_cancel("prefork") is True
    assert pool_can_cancel("threads") is False and pool_can_cancel("solo") is False


def test_a_lost_broker_connection_leaves_no_traceback_and_the_turn_ends(own_redis: RedisServer) -> None:
    prefix = f"fxc{uuid.uuid4().hex[:8]}"
    with ScriptedModel() as model:
        model.responder = slow_responder
        pool = Workers(redis_url=own_redis.url, prefix=prefix, env={"FX_TEST_MODEL_URL": model.base_url})
        try:
            worker = pool.start(queues=("default",), concurrency=4)
            settings = Settings(redis_url=own_redis.url, prefix=prefix)
            store = redis_store(own_redis.url, prefix=prefix)
            agent = Agent("default", model="scripted", store=store,
                          waker=CeleryWaker(make_celery_app(settings)), settings=settings)
            try:
                session = agent.blocking_session()
                turn = session.prompt("slow please")
                session_id = turn.session_id

                def tool_started() -> bool:
                    return any(line["type"] == "tool_start" for line in store.sync.read_lines(session_id, 0))

                wait_until(tool_started, 30.0, interval_s=0.05, what="the slow tool started")
                connected = worker.log_tail(10**6).count("Connected to")
                kill_clients(own_redis.url)
                wait_until(lambda: worker.log_tail(10**6).count("Connected to") > connected, 30.0, interval_s=0.1,
                           what="the worker reconnected to the broker")
                deadline = time.monotonic() + 30.0
                lines: list[dict[str, Any]] = []
                while time.monotonic() < deadline and not any(line["type"] == "turn_end" for line in lines):
                    lines = store.sync.read_lines(session_id, 0, count=1000)
                    time.sleep(0.1)
                log = worker.log_tail(10**6)
                assert "Connection to broker lost" in log, log[-3000:]
                assert "NotImplementedError" not in log and "Failed to cancel" not in log, log[-3000:]
                ends = [line for line in lines if line["type"] == "turn_end"]
                assert ends and ends[0]["stopReason"] == "end_turn", lines
            finally:
                agent.close()
        finally:
            pool.close()
