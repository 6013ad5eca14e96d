"""A worker whose Redis becomes a replica after it started (a failover without Sentinel)
does not spin: a replica answers PING, so each reconnect "succeeded" and the next write
failed again, a few hundred log lines a second. The broker opens a channel only on a
primary (fxworker/broker.py): the worker says so once, retries with Celery's growing
interval, and consumes again once the server is a primary."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.support.redis_server import RedisServer, redis_server_binary
from tests.support.workers import CeleryWorker, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow,
              pytest.mark.skipif(redis_server_binary() is None, reason="needs redis-server")]

WATCH_S = 6.0


@pytest.fixture
def worker_on_a_primary() -> Iterator[tuple[CeleryWorker, RedisServer, RedisServer]]:
    store, other = RedisServer(), RedisServer()
    worker = CeleryWorker(redis_url=store.url, prefix=f"fxro{uuid.uuid4().hex[:8]}", concurrency=2)
    try:
        worker.start()
        yield worker, store, other
    finally:
        worker.close()
        store.close()
        other.close()


def _log_lines(worker: CeleryWorker) -> list[str]:
    return worker.log_path.read_text(errors="replace").splitlines()


def test_a_worker_whose_redis_becomes_a_replica_backs_off_and_comes_back(
        worker_on_a_primary: tuple[CeleryWorker, RedisServer, RedisServer]) -> None:
    worker, store, other = worker_on_a_primary
    admin = redis.Redis(port=store.port)
    try:
        before = len(_log_lines(worker))
        admin.replicaof("127.0.0.1", str(other.port))
        time.sleep(WATCH_S)
        during = _log_lines(worker)[before:]
        assert worker.proc is not None and worker.proc.poll() is None, worker.log_tail()
        text = "\n".join(during)
        # Before: ~550 lines and ~7 tracebacks (RestartFreqExceeded) in 6 s.
        assert len(during) < 100, text[-4000:]
        assert text.count("the broker is a read-only replica (of") == 1, text[-4000:]
        assert 1 <= text.count("Cannot connect to") <= 4, text[-4000:]
        assert "RestartFreqExceeded" not in text, text[-4000:]
        mark = len(_log_lines(worker))
        admin.replicaof("NO", "ONE")
        wait_until(lambda: any("the broker is a primary again" in line for line in _log_lines(worker)[mark:]), 40,
                   interval_s=0.2, what="the worker back on a primary")
        after = _log_lines(worker)[mark:]
        back = next(i for i, line in enumerate(after) if "the broker is a primary again" in line)
        assert any("Connected to" in line for line in after[back:]), "\n".join(after)[-4000:]
        assert worker.proc.poll() is None, worker.log_tail()
    finally:
        admin.close()
