"""A worker survives any bytes in its queue (§7): an undecodable message goes to the
dead-letter list, the worker stays up, and the next turn runs."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import redis

from fxworker.keys import DEAD_LETTER_LIST, queue_name
from tests.chaos import poison
from tests.support.workers import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", poison.KINDS)
def test_a_malformed_message_leaves_the_worker_serving(
    workers: Any, client: Any, redis_url: str, prefix: str, kind: str, seed: int
) -> None:
    worker = workers.start(queues=["default"], concurrency=4)
    mark = poison.marker(seed, poison.KINDS.index(kind))
    raw, variant = poison.message(kind, mark, random.Random(f"{kind}-{seed}"))
    r = redis.Redis.from_url(redis_url)
    try:
        r.lpush(f"{prefix}:celery:{queue_name('default')}", raw)
        wait_until(lambda: r.llen(f"{prefix}:celery:{queue_name('default')}") == 0, 10, what="the message taken")
        result = client.agents["default"].blocking_session().prompt(f"after {kind} {variant}").result()
        assert result.stop_reason == "end_turn"
        assert worker.proc is not None and worker.proc.poll() is None, worker.log_tail(3000)
        dead = [json.loads(entry) for entry in r.lrange(f"{prefix}:celery:{DEAD_LETTER_LIST}", 0, -1)]
        mine = [entry for entry in dead if mark in entry["raw"]]
        if kind == "wake":
            assert mine == []  # it decodes: the task refuses its arguments
        else:
            assert len(mine) == 1 and mine[0]["queue"] == queue_name("default") and mine[0]["reason"]
        assert "Unrecoverable error" not in worker.log_tail(20000)
    finally:
        r.close()
        worker.stop()
