"""The store's Redis clients: one per event loop, each on a bounded pool that waits (§5).

redis-py's default pool fails a call once it holds its maximum of connections; the
store's pools make the call wait for a free one, up to a bound, and only then answer
FX_STORE_UNAVAILABLE. Blocking reads hold a connection for their whole wait, which makes
a full pool easy to build.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from fxworker.errors import FxStoreUnavailableError
from fxworker.ids import new_session_id
from fxworker.runtime import LoopThread
from fxworker.settings import Settings
from fxworker.store import redis_store

pytestmark = pytest.mark.redis


def blocked_clients(url: str) -> int:
    admin = redis.Redis.from_url(url)
    try:
        return int(admin.info("clients")["blocked_clients"])
    finally:
        admin.close()


async def until_blocked(url: str, n: int, timeout_s: float = 5.0) -> None:
    """Waits until `n` more clients are parked in a blocking read on the server."""
    deadline = time.monotonic() + timeout_s
    while blocked_clients(url) < n:
        assert time.monotonic() < deadline, f"{n} blocked reads not seen within {timeout_s}s"
        await asyncio.sleep(0.01)


async def test_a_call_waits_for_a_free_connection(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix, max_connections=2, pool_timeout_s=4.0)
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="x")
    base = blocked_clients(redis_url)
    # Two reads hold both connections for 1 s; the third call waits for one of them.
    reads = [asyncio.create_task(store.read_lines(sid, 0, block_ms=1000)) for _ in range(2)]
    await until_blocked(redis_url, base + 2)
    state = await store.state(sid)
    assert state.pending == 1
    assert blocked_clients(redis_url) <= base + 1  # it ran only once a read had given its connection back
    assert await asyncio.gather(*reads) == [[], []]
    await store.aclose()


async def test_a_full_pool_past_its_wait_is_store_unavailable(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix, max_connections=1, pool_timeout_s=0.1)
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="x")
    base = blocked_clients(redis_url)
    read = asyncio.create_task(store.read_lines(sid, 0, block_ms=1500))
    await until_blocked(redis_url, base + 1)  # the read holds the one connection
    with pytest.raises(FxStoreUnavailableError) as caught:
        await store.state(sid)
    assert caught.value.code == "FX_STORE_UNAVAILABLE"
    assert await read == []
    assert (await store.state(sid)).pending == 1  # free again: the next call goes through
    await store.aclose()


def test_the_blocking_twin_waits_on_its_own_bounded_pool(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix, max_connections=1, pool_timeout_s=3.0)
    sid = new_session_id()
    store.sync.accept(sid, agent="default", message_id="m1", input="x")
    base = blocked_clients(redis_url)
    reader = threading.Thread(target=lambda: store.sync.read_lines(sid, 0, block_ms=600))
    reader.start()
    asyncio.run(until_blocked(redis_url, base + 1))  # the reader holds the one connection
    assert store.sync.state(sid).pending == 1  # waited for it instead of failing
    assert blocked_clients(redis_url) == base  # so the read was over
    reader.join(5)
    store.sync.close()


def test_one_client_per_loop_and_none_kept_for_a_finished_loop(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix)
    sid = new_session_id()
    store.sync.accept(sid, agent="default", message_id="m1", input="x")

    async def client_of_this_loop() -> object:
        await store.state(sid)
        return store.client

    loops = [LoopThread("fx-test-a"), LoopThread("fx-test-b")]
    try:
        a1, b1, a2, b2 = (loops[i].run(client_of_this_loop(), timeout_s=5) for i in (0, 1, 0, 1))
        assert a1 is a2 and b1 is b2 and a1 is not b1  # no rebuild when calls alternate
        asyncio.run(client_of_this_loop())  # a third loop, finished once it returns
        assert len(store._transports) == 3
        assert loops[0].run(client_of_this_loop(), timeout_s=5) is a1
        asyncio.run(client_of_this_loop())  # a new loop: the finished one's client is dropped
        assert len(store._transports) == 3  # a, b and the latest asyncio.run loop
    finally:
        for lp in loops:
            lp.run(store.aclose(), timeout_s=5)
            lp.close()


def test_the_pool_size_setting() -> None:
    assert Settings.from_env({}).redis_max_connections == 200
    assert Settings.from_env({"FX_REDIS_MAX_CONNECTIONS": "32"}).redis_max_connections == 32
    with pytest.raises(Exception) as caught:
        Settings.from_env({"FX_REDIS_MAX_CONNECTIONS": "0"})
    assert getattr(caught.value, "code", "") == "FX_CONFIG"
