"""`/healthz` answers 503 `FX_STORE_UNAVAILABLE` while the store answers but refuses writes
(a read-only replica, a primary short of its `min-replicas-to-write`, a Redis Cluster that
is down) and 200 again once it takes them; it reads that at most once a second
(web/health.py). Each test runs its own redis-servers, since it turns them into replicas."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import redis

from fxworker.agent import Agent
from fxworker.settings import Settings
from fxworker.store import redis_store
from fxworker.web import create_app
from tests.support.redis_server import RedisServer, redis_server_binary
from tests.support.workers import wait_until
from tests.web._inprocess import ThreadServer
from tests.web.test_refusals import PROVIDER, NoWake

pytestmark = [pytest.mark.redis, pytest.mark.skipif(redis_server_binary() is None, reason="needs redis-server")]


@pytest.fixture
def servers() -> Iterator[tuple[RedisServer, RedisServer]]:
    """(the store, another primary it can be made a replica of)."""
    store, other = RedisServer(), RedisServer()
    try:
        yield store, other
    finally:
        store.close()
        other.close()


def _status(client: httpx.Client, said: str) -> Any:
    """A predicate for `wait_until`: /healthz answers `said` ("ok" or a 503 message's part)."""
    def check() -> bool:
        response = client.get("/healthz")
        if said == "ok":
            return response.status_code == 200
        body = response.json()
        return response.status_code == 503 and body["error"]["code"] == "FX_STORE_UNAVAILABLE" \
            and said in body["error"]["message"]
    return check


def _serve(url: str, **settings: Any) -> tuple[Agent, Any]:
    agent = Agent(f"health-{uuid.uuid4().hex[:6]}", model="scripted", provider=PROVIDER,
                  store=redis_store(url, prefix="fxhealth"), waker=NoWake())
    return agent, create_app(agents={"default": agent}, settings=Settings(prefix="fxhealth", **settings))


@contextmanager
def _served(store: RedisServer) -> Iterator[tuple[httpx.Client, redis.Redis]]:
    """An HTTP client of the app on `store`, and an admin connection to that server."""
    agent, app = _serve(store.url, redis_url=store.url)
    admin = redis.Redis(port=store.port)
    try:
        with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=10.0) as client:
            yield client, admin
    finally:
        admin.close()
        agent.close()


def test_a_store_turned_replica_is_unhealthy_until_it_is_a_primary_again(
        servers: tuple[RedisServer, RedisServer]) -> None:
    store, other = servers
    with _served(store) as (client, admin):
        assert client.get("/healthz").status_code == 200
        admin.replicaof("127.0.0.1", str(other.port))  # a failover without Sentinel, seen from here
        wait_until(_status(client, "read-only replica"), 5, what="/healthz 503 on a replica")
        unhealthy = client.get("/healthz")
        assert unhealthy.headers["Retry-After"] == "1"
        assert f"{other.port}" not in unhealthy.text and f"{store.port}" not in unhealthy.text
        created = client.post("/v1/sessions", json={"input": "hi"})
        assert created.status_code == 503 and created.json()["error"]["code"] == "FX_STORE_UNAVAILABLE"
        admin.replicaof("NO", "ONE")
        wait_until(_status(client, "ok"), 5, what="/healthz 200 on a primary again")
        assert client.post("/v1/sessions", json={"input": "hi"}).status_code == 202


def test_a_primary_short_of_its_min_replicas_is_unhealthy(servers: tuple[RedisServer, RedisServer]) -> None:
    store, _ = servers
    with _served(store) as (client, admin):
        assert client.get("/healthz").status_code == 200
        admin.config_set("min-replicas-max-lag", 10)
        admin.config_set("min-replicas-to-write", 1)  # and no replica: NOREPLICAS to every write
        wait_until(_status(client, "NOREPLICAS"), 5, what="/healthz 503 under min-replicas-to-write")
        admin.config_set("min-replicas-to-write", 0)
        wait_until(_status(client, "ok"), 5, what="/healthz 200 again")


def test_healthz_reads_the_role_at_most_once_a_second(servers: tuple[RedisServer, RedisServer]) -> None:
    store, _ = servers
    with _served(store) as (client, admin):
        admin.config_resetstat()
        started_s = time.monotonic()
        answers = [client.get("/healthz").status_code for _ in range(50)]
        elapsed_s = time.monotonic() - started_s
        stats = admin.info("commandstats")
        infos = stats.get("cmdstat_info", {}).get("calls", 0)
        assert answers == [200] * 50
        assert 1 <= infos <= int(elapsed_s) + 2, (infos, elapsed_s)
        assert stats["cmdstat_ping"]["calls"] >= 50
        writes = sum(v["calls"] for k, v in stats.items() if k.split("|")[0] in (
            "cmdstat_set", "cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall", "cmdstat_hset", "cmdstat_xadd"))
        assert writes == 0, stats


@pytest.mark.cluster
@pytest.mark.slow
def test_a_cluster_that_is_down_is_unhealthy_until_it_recovers() -> None:
    from tests.support.redis_topology import RedisClusterProcesses

    cluster = RedisClusterProcesses(primaries=3, node_timeout_ms=500)
    try:
        agent, app = _serve(cluster.url, store_url=cluster.url)
        try:
            with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=10.0) as client:
                assert client.get("/healthz").json()["store"] == "cluster"
                cluster.nodes[2].stop(kill=True)  # no replica to take over its slots
                wait_until(_status(client, "cluster_state:fail"), 20, what="/healthz 503 while the cluster is down")
                cluster.nodes[2].start()
                wait_until(_status(client, "ok"), 30, what="/healthz 200 once the cluster is ok")
        finally:
            agent.close()
    finally:
        cluster.close()
