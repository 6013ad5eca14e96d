"""The store on a Redis Cluster with replicas and on a Sentinel-managed primary (§5, §11):
named by URL alone, `FX_ACK=replica` waits on the node that took the write, and an
acknowledged input outlives a kill -9 of that node's primary."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fxworker.errors import FxStoreUnavailableError
from fxworker.ids import new_session_id
from fxworker.store import redis_store
from tests.support.acks import reads_wait_for_the_replica, session_with_a_line
from tests.support.redis_topology import RedisClusterProcesses, SentinelGroup

pytestmark = [pytest.mark.cluster, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def cluster() -> Iterator[RedisClusterProcesses]:
    c = RedisClusterProcesses(primaries=3, replicas=1)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def sentinels() -> Iterator[SentinelGroup]:
    g = SentinelGroup()
    try:
        yield g
    finally:
        g.close()


async def _until(call: Any, timeout_s: float) -> Any:
    """`call()` again while the store is unavailable (a failover under way), up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except FxStoreUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_a_plain_url_of_a_cluster_node_is_a_cluster_store(cluster: RedisClusterProcesses) -> None:
    store = redis_store(cluster.url, prefix="fxtopo")
    try:
        assert store.kind == "cluster"
        sid = new_session_id()
        await store.accept(sid, agent="default", message_id="m1", input="x")
        assert (await store.state(sid)).pending == 1
    finally:
        await store.aclose()


async def test_replica_acks_on_a_cluster_survive_a_primary_kill(cluster: RedisClusterProcesses) -> None:
    store = redis_store(cluster.seed_url, prefix="fxtopo", ack="replica")
    try:
        sessions = [new_session_id() for _ in range(30)]
        for sid in sessions:
            await store.accept(sid, agent="default", message_id=f"m-{sid[-6:]}", input=f"for {sid}")
        victim = cluster.primary_of(f"fxtopo:{{{sessions[0]}}}:meta")
        on_victim = [s for s in sessions if cluster.primary_of(f"fxtopo:{{{s}}}:meta") is victim]
        failover_s = cluster.kill(victim)
        assert on_victim
        for sid in on_victim:
            state = await _until(lambda s=sid: store.state(s), 20)
            assert state is not None and state.pending == 1, (sid, state)
        # The promoted replica has no replica of its own: a write there is refused, not
        # acknowledged; the other primaries' sessions take input as before.
        with pytest.raises(FxStoreUnavailableError):
            await store.accept(on_victim[0], agent="default", message_id="m-after", input="after")
        others = [s for s in sessions if s not in on_victim]
        await store.accept(others[0], agent="default", message_id="m-after", input="after")
        print(f"failover {failover_s:.1f} s; {len(on_victim)} sessions on the killed primary")
    finally:
        await store.aclose()


async def test_a_cluster_reader_is_never_sent_a_line_no_replica_holds(cluster: RedisClusterProcesses) -> None:
    """The read, its `ack_read` write and the WAIT go to the session's node on one
    connection: with that node's replica stopped, a line only the primary holds is refused
    to a reader, and read once the replica has it."""
    store = redis_store(cluster.seed_url, prefix="fxtopo", ack="replica")
    try:
        store.core.ack_timeout_ms = 5000
        sid, epoch = await session_with_a_line(store)
        replica = cluster.replica_of(cluster.primary_of(f"fxtopo:{{{sid}}}:meta"))
        assert replica.proc is not None
        await reads_wait_for_the_replica(store, sid, epoch, replica.proc)
    finally:
        await store.aclose()


async def test_a_sentinel_store_follows_a_failover(sentinels: SentinelGroup) -> None:
    store = redis_store(sentinels.url, prefix="fxtopo", ack="replica")
    try:
        assert store.kind == "redis"
        sid = new_session_id()
        await store.accept(sid, agent="default", message_id="m1", input="before")
        old = sentinels.primary()
        old.stop(kill=True)
        sentinels.wait_new_primary(old.port)
        # The promoted replica has no replica of its own: FX_ACK=replica now refuses, and the
        # acknowledged input is there.
        state = await _until(lambda: store.state(sid), 20)
        assert state is not None and state.pending == 1
        with pytest.raises(FxStoreUnavailableError):
            await store.accept(sid, agent="default", message_id="m2", input="after")
    finally:
        await store.aclose()
