"""Settings the Redis cannot honour stop `fx web`, `fx worker` and a Celery worker at start,
exit 2, with a message that says what to change (store/preflight.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.ports import default_port_busy  # noqa: F401 - a fixture, used by pytestmark
from tests.support.redis_server import RedisServer, free_port, redis_server_binary

# Port 8000 (fx web's default) is busy throughout: fx web checks its port before the store,
# so each run gets a free one (`{port}`) and these tests pass whatever else runs here.
pytestmark = [pytest.mark.redis, pytest.mark.skipif(redis_server_binary() is None, reason="needs redis-server"),
              pytest.mark.usefixtures("default_port_busy")]

WEB = ["-m", "fxworker", "web", "--port", "{port}"]


def _run(args: list[str], redis_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FX_")}
    environ.update(REDIS_URL=redis_url, FX_AGENTS="tests.durable.agents", FX_PREFIX="fxstart", **env)
    argv = [a.format(port=free_port()) for a in args]
    return subprocess.run([sys.executable, *argv], env=environ, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def evicting() -> Iterator[RedisServer]:
    server = RedisServer(args=("--maxmemory-policy", "allkeys-lru"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def plain() -> Iterator[RedisServer]:
    server = RedisServer(args=("--maxmemory-policy", "noeviction"))
    yield server
    server.stop()


@pytest.mark.parametrize("command", [WEB, ["-m", "fxworker", "worker", "--print-command"]])
def test_an_evicting_redis_stops_fx_web_and_fx_worker(evicting: RedisServer, command: list[str]) -> None:
    done = _run(command, evicting.url)
    assert done.returncode == 2, done.stderr
    assert "allkeys-lru" in done.stderr and "noeviction" in done.stderr and "FX_ALLOW_EVICTION=1" in done.stderr


def test_fx_allow_eviction_starts_with_a_warning(evicting: RedisServer) -> None:
    done = _run(["-m", "fxworker", "worker", "--print-command"], evicting.url, FX_ALLOW_EVICTION="1")
    assert done.returncode == 0, done.stderr
    assert "celery" in done.stdout


def test_an_evicting_redis_stops_a_celery_worker_started_directly(evicting: RedisServer) -> None:
    done = _run(["-m", "celery", "-A", "fxworker.celery_app", "worker", "-P", "threads", "-c", "1",
                 "--without-gossip", "--without-mingle"], evicting.url)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "allkeys-lru" in done.stdout + done.stderr


def test_fx_ack_aof_needs_a_redis_with_waitaof(plain: RedisServer) -> None:
    done = _run(["-m", "fxworker", "worker", "--print-command"], plain.url, FX_ACK="aof")
    version = subprocess.run([redis_server_binary() or "redis-server", "--version"], capture_output=True, text=True).stdout
    if "v=7.0" in version or "v=7.1" in version or "v=6" in version:
        assert done.returncode == 2 and "WAITAOF" in done.stderr, done.stderr
    else:
        assert done.returncode == 2 and "appendonly" in done.stderr, done.stderr


def test_fx_ack_replica_needs_a_connected_replica(plain: RedisServer) -> None:
    done = _run(["-m", "fxworker", "worker", "--print-command"], plain.url, FX_ACK="replica")
    assert done.returncode == 2 and "replica" in done.stderr, done.stderr
    replica = RedisServer(args=("--replicaof", "127.0.0.1", str(plain.port)))
    try:
        import redis
        from tests.support.workers import wait_until

        primary = redis.Redis.from_url(plain.url)
        wait_until(lambda: primary.info("replication").get("connected_slaves", 0) >= 1, 15, what="a connected replica")
        primary.close()
        done = _run(["-m", "fxworker", "worker", "--print-command"], plain.url, FX_ACK="replica")
        assert done.returncode == 0, done.stderr
    finally:
        replica.stop()


WORKER = ["-m", "fxworker", "worker", "--print-command"]


@pytest.mark.parametrize(("env", "said"), [
    ({"FX_STORE_URL": "redis+cluster://127.0.0.1:{port}/0"}, "not in cluster mode"),
    ({"FX_STORE_URL": "redis+sentinel://127.0.0.1:{port}"}, "names no master"),
    ({"FX_STORE_URL": "http://127.0.0.1:{port}"}, "not one the store takes"),
    ({"FX_BROKER_URL": "kafka://127.0.0.1:9092"}, "not one fxworker runs on"),
    ({"FX_BROKER_URL": "redis://127.0.0.1:9/0"}, "did not answer"),
    ({"FX_BROKER_URL": "amqp://guest:guest@127.0.0.1:9//"}, "did not answer"),
])
@pytest.mark.parametrize("command", [WEB, WORKER])
def test_a_store_or_broker_url_that_cannot_serve_stops_the_processes(plain: RedisServer, env: dict[str, str],
                                                                       said: str, command: list[str]) -> None:
    done = _run(command, plain.url, **{k: v.format(port=plain.port) for k, v in env.items()})
    assert done.returncode == 2, done.stderr
    assert said in done.stderr, done.stderr


@pytest.mark.cluster
def test_a_redis_cluster_is_no_broker_but_a_store() -> None:
    from tests.support.redis_topology import RedisClusterProcesses

    cluster = RedisClusterProcesses(primaries=3)
    try:
        done = _run(WORKER, cluster.url)
        assert done.returncode == 2 and "Redis Cluster, which Celery cannot use" in done.stderr, done.stderr
        broker = RedisServer()
        try:
            done = _run(WORKER, broker.url, FX_STORE_URL=cluster.url)
            assert done.returncode == 0, done.stderr
        finally:
            broker.close()
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def replica(plain: RedisServer) -> Iterator[RedisServer]:
    """A read-only replica of `plain`, made one with `REPLICAOF`."""
    import redis

    server = RedisServer()
    client = redis.Redis(port=server.port)
    client.replicaof("127.0.0.1", str(plain.port))
    client.close()
    yield server
    server.close()


CELERY = ["-m", "celery", "-A", "fxworker.celery_app", "worker", "-P", "threads", "-c", "1",
          "--without-gossip", "--without-mingle"]


@pytest.mark.parametrize("command", [WEB, WORKER, CELERY], ids=["fx-web", "fx-worker", "celery"])
def test_a_replica_as_the_store_stops_the_processes(replica: RedisServer, plain: RedisServer,
                                                    command: list[str]) -> None:
    done = _run(command, replica.url)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said[-3000:]
    assert f"127.0.0.1:{replica.port}" in said and "read-only replica" in said, said[-3000:]
    assert f"127.0.0.1:{plain.port}" in said and "at the primary" in said and "Sentinel" in said, said[-3000:]


def test_a_replica_as_the_broker_stops_the_worker(replica: RedisServer, plain: RedisServer) -> None:
    done = _run(WORKER, plain.url, FX_BROKER_URL=replica.url)
    assert done.returncode == 2, done.stderr
    assert f"the broker at redis://127.0.0.1:{replica.port}/0 is a read-only replica" in done.stderr, done.stderr
    assert "FX_BROKER_URL" in done.stderr


@pytest.mark.cluster
def test_a_cluster_that_is_down_stops_the_processes() -> None:
    """A primary killed (no replica to take over): its slots have no node, the others say
    `cluster_state:fail`, and every write to those slots would be CLUSTERDOWN."""
    from tests.support.redis_topology import RedisClusterProcesses
    from tests.support.workers import wait_until

    cluster = RedisClusterProcesses(primaries=3, node_timeout_ms=500)
    broker = RedisServer()
    try:
        cluster.nodes[1].stop(kill=True)

        def says_fail() -> bool:
            import redis

            client = redis.Redis(port=cluster.nodes[0].port)
            try:
                return bool(client.cluster("info")["cluster_state"] == "fail")
            finally:
                client.close()

        wait_until(says_fail, 20, what="cluster_state:fail")
        for command in (WEB, WORKER):
            done = _run(command, broker.url, FX_STORE_URL=cluster.url)
            assert done.returncode == 2, done.stderr
            assert "cluster_state:fail" in done.stderr and "bring back or replace" in done.stderr, done.stderr
        cluster.nodes[1].start()
        cluster.wait_ok(30)
        done = _run(WORKER, broker.url, FX_STORE_URL=cluster.url)
        assert done.returncode == 0, done.stderr
    finally:
        broker.close()
        cluster.close()
