"""Store fixtures: one contract suite, parametrised over every way to build a store."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from fxworker.ids import new_session_id
from fxworker.store import RedisStore, embedded_store, memory_store, redis_store
from tests.store.cluster import RedisClusterProcesses

START_MS = 1_800_000_000_000


class FakeClock:
    """Milliseconds that move only when a test says so; every lease decision reads it."""

    def __init__(self, start_ms: int = START_MS) -> None:
        self.ms = start_ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> int:
        self.ms += ms
        return self.ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcesses]:
    cluster = RedisClusterProcesses()
    try:
        yield cluster
    finally:
        cluster.close()


STORE_KINDS = [
    pytest.param("redis", marks=pytest.mark.redis),
    "embedded",
    "memory",
    pytest.param("cluster", marks=[pytest.mark.cluster, pytest.mark.redis]),
]


def build_store(kind: str, request: pytest.FixtureRequest, clock: FakeClock) -> RedisStore:
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        return redis_store(url, prefix=request.getfixturevalue("key_prefix"), clock=clock)
    if kind == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        return redis_store(cluster.url, prefix=f"fxt{uuid.uuid4().hex[:10]}", clock=clock, cluster=True)
    if kind == "embedded":
        return embedded_store(prefix=f"fxt{uuid.uuid4().hex[:10]}", clock=clock)
    return memory_store(clock=clock)


@pytest.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[RedisStore]:
    """The same store contract on real Redis, Redis Cluster, fakeredis (embedded) and memory."""
    built = build_store(request.param, request, clock)
    try:
        yield built
    finally:
        await built.aclose()


@pytest.fixture
def sid() -> str:
    return new_session_id()
