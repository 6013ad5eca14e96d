"""Suite-wide fixtures: one throwaway Redis for the run, a key prefix per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.support.redis_server import RedisServer, external_redis_url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of the suite's Redis: a `redis-server` this run started, or FX_TEST_REDIS_URL."""
    url = external_redis_url()
    if url:
        yield url
        return
    server = RedisServer()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A prefix no other test uses; every key under it is deleted afterwards."""
    prefix = f"fxt{uuid.uuid4().hex[:10]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter(match=f"*{prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()
