"""RabbitMQ as the broker (`FX_BROKER_URL=amqp://…`), the store on Redis (§7).

Each test module gets a throwaway vhost on the machine's RabbitMQ (127.0.0.1:5672,
guest/guest; `rabbitmqctl` makes and removes it). Checked on real Celery workers: the
agent's queue is a durable quorum queue, turns with a non-idempotent tool run once each,
and a worker killed -9 mid-turn hands its wake back (unacknowledged, redelivered by
RabbitMQ) so a second worker finishes the turn.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fxworker import Agent, Settings
from fxworker.celery_app import make_celery_app
from fxworker.store import redis_store
from fxworker.wakers import CeleryWaker
from tests.durable.tooling import provider, sent_key, tools
from tests.support.workers import Workers

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.rabbitmq]

AMQP_HOST = "127.0.0.1:5672"


def _rabbitmqctl(*args: str) -> str:
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        pytest.skip("rabbitmqctl not found: these tests need RabbitMQ on 127.0.0.1:5672 (apt-get install rabbitmq-server)")
    done = subprocess.run([ctl, *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"RabbitMQ did not answer rabbitmqctl {args[0]}: {done.stderr.strip()[:200]}")
    return done.stdout


@pytest.fixture(scope="module")
def vhost() -> Iterator[str]:
    name = f"fxtest-{uuid.uuid4().hex[:8]}"
    _rabbitmqctl("add_vhost", name)
    try:
        _rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield name
    finally:
        _rabbitmqctl("delete_vhost", name)


@pytest.fixture(scope="module")
def amqp_url(vhost: str) -> str:
    return f"amqp://guest:guest@{AMQP_HOST}/{vhost}"


@pytest.fixture(scope="module")
def amqp_workers(redis_url: str, prefix: str, model: Any, amqp_url: str) -> Iterator[Workers]:
    pool = Workers(redis_url=redis_url, prefix=prefix,
                   env={"FX_TEST_MODEL_URL": model.base_url, "FX_BROKER_URL": amqp_url})
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def agent(redis_url: str, prefix: str, model: Any, amqp_url: str) -> Iterator[Agent]:
    settings = Settings(redis_url=redis_url, broker_url=amqp_url, prefix=prefix, lease_s=3.0, reserve_s=4.0)
    a = Agent("default", model="scripted", provider=provider(model.base_url), tools=tools(), api_key="test-key",
              store=redis_store(redis_url, prefix=prefix), waker=CeleryWaker(make_celery_app(settings)),
              settings=settings)
    try:
        yield a
    finally:
        a.close()


def test_turns_run_once_over_a_quorum_queue(amqp_workers: Workers, agent: Agent, redis_url: str, prefix: str,
                                           vhost: str) -> None:
    amqp_workers.start(queues=["default"], agents=["default"], concurrency=8)
    sessions = [agent.blocking_session() for _ in range(20)]
    turns = [s.prompt(f"send:q{i}") for i, s in enumerate(sessions)]
    assert [t.result().stop_reason for t in turns] == ["end_turn"] * 20
    queues = dict(line.split("\t")[:2] for line in _rabbitmqctl(
        "list_queues", "-p", vhost, "name", "type", "--no-table-headers", "-q").splitlines() if "\t" in line)
    assert queues.get("fx.default") == "quorum", queues
    r = redis.Redis.from_url(redis_url)
    try:
        sent = Counter(e.decode().split("|")[2] for e in r.lrange(sent_key(prefix), 0, -1))
    finally:
        r.close()
    assert {f"q{i}" for i in range(20)} <= set(sent) and max(sent.values()) == 1


def test_a_worker_killed_mid_turn_is_replaced_through_rabbitmq(amqp_workers: Workers, agent: Agent,
                                                              model: Any) -> None:
    for earlier in amqp_workers.started:
        earlier.stop()
    first = amqp_workers.start(queues=["default"], agents=["default"], concurrency=4)
    session = agent.blocking_session()
    turn = session.prompt("hold:amqp-kill")
    model.wait_held("amqp-kill", timeout_s=15)
    first.kill()
    amqp_workers.start(queues=["default"], agents=["default"], concurrency=4)
    model.release("amqp-kill")
    result = turn.result()
    assert result.stop_reason == "end_turn"
    end = [ln for ln in session.stream(0, follow=False) if ln["type"] == "turn_end"]
    assert len(end) == 1 and end[0]["epoch"] >= 2  # the second worker took the lease over
