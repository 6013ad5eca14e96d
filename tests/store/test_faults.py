"""Redis down, killed or stalled mid-call: a clear FX_STORE_UNAVAILABLE, no partial write, reconnect."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest
import redis

from fxworker.errors import FxAckUnsupportedError, FxStoreFullError, FxStoreUnavailableError, FxUnknownSessionError
from fxworker.ids import new_session_id
from fxworker.store import RedisStore, redis_store
from tests.support.acks import reads_wait_for_the_replica, session_with_a_line
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
def server() -> Iterator[RedisServer]:
    own = RedisServer(appendonly=True)
    try:
        yield own
    finally:
        own.close()


def wait_until(cond, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(0.02)


async def wait_until_async(cond, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.02)


async def test_redis_down_then_back(server: RedisServer) -> None:
    store = redis_store(server.url, prefix="fx", socket_timeout_s=1.0)
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="before")
    server.stop()
    with pytest.raises(FxStoreUnavailableError) as caught:
        await store.accept(sid, agent="default", message_id="m2", input="while down")
    assert caught.value.code == "FX_STORE_UNAVAILABLE"
    with pytest.raises(FxStoreUnavailableError):
        store.sync.state(sid)
    server.start()  # same port, data kept (AOF), scripts forgotten
    await store.accept(sid, agent="default", message_id="m3", input="after")
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    assert [i.message_id for i in claim.pending] == ["m1", "m3"]
    assert store.sync.state(sid).pending == 2
    await store.aclose()


async def test_a_server_killed_under_a_blocking_read(server: RedisServer) -> None:
    store = redis_store(server.url, prefix="fx", socket_timeout_s=3.0)
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="x")
    reader = asyncio.create_task(store.read_lines(sid, 0, block_ms=2000))
    client = redis.Redis.from_url(server.url)
    try:
        # Kill only once the read is parked in XREAD BLOCK on the server.
        await wait_until_async(lambda: int(client.info("clients")["blocked_clients"]) == 1, 5)
    finally:
        client.close()
    await asyncio.get_running_loop().run_in_executor(None, lambda: server.stop(kill=True))
    with pytest.raises(FxStoreUnavailableError):
        await asyncio.wait_for(reader, 5)
    server.start()
    assert await store.read_lines(sid, 0) == []  # the AOF kept the session; the read reconnects
    assert (await store.state(sid)).pending == 1
    await store.aclose()


async def test_a_stalled_call_either_ran_or_did_not(server: RedisServer) -> None:
    store = redis_store(server.url, prefix="fx", socket_timeout_s=0.3)
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="x")
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    admin = redis.Redis.from_url(server.url)
    try:
        admin.execute_command("CLIENT", "PAUSE", 800, "WRITE")
        with pytest.raises(FxStoreUnavailableError):
            await store.accept(sid, agent="default", message_id="m2", input="y")
        with pytest.raises(FxStoreUnavailableError):
            await store.append(sid, claim.epoch, records=[("k1", b"r", [])], lines=[{"type": "text_delta"}])
        admin.execute_command("CLIENT", "UNPAUSE")
    finally:
        admin.close()
    # Repeating the same ids is safe whichever way the stalled calls went.
    await store.accept(sid, agent="default", message_id="m2", input="y")
    appended = await store.append(sid, claim.epoch, records=[("k1", b"r", [])], lines=[{"type": "text_delta"}])
    assert appended.records == ["1"] and appended.lines == [1]
    await store.release(sid, claim.epoch)
    again = await store.claim(sid, holder="w2", lease_ms=1000)
    assert again is not None
    assert [r.data for r in again.records] == [b"r"]
    assert [i.message_id for i in again.pending] == ["m1", "m2"]
    assert len(await store.read_lines(sid, 0)) == 1
    await store.aclose()


async def test_ack_aof_is_refused_before_redis_7_2(redis_url: str, key_prefix: str) -> None:
    version = redis.Redis.from_url(redis_url).info("server")["redis_version"]
    store = redis_store(redis_url, prefix=key_prefix, ack="aof")
    sid = new_session_id()
    if tuple(int(p) for p in version.split(".")[:2]) >= (7, 2):
        pytest.skip(f"this Redis ({version}) has WAITAOF")
    with pytest.raises(FxAckUnsupportedError) as caught:
        await store.accept(sid, agent="default", message_id="m1", input="x")
    assert caught.value.code == "FX_ACK_UNSUPPORTED"
    with pytest.raises(FxUnknownSessionError):
        await redis_store(redis_url, prefix=key_prefix).state(sid)
    await store.aclose()


class Replicated:
    """A primary (full syncs at once) and, once `attach()`ed, its replica."""

    def __init__(self) -> None:
        self.primary = RedisServer(args=("--repl-diskless-sync-delay", "0"))
        self.replica: RedisServer | None = None

    async def attach(self) -> RedisServer:
        """Starts the replica and waits until its link to the primary is up."""
        self.replica = RedisServer(args=("--replicaof", "127.0.0.1", str(self.primary.port)))
        probe = redis.Redis(host="127.0.0.1", port=self.replica.port)
        try:
            await wait_until_async(lambda: probe.info("replication").get("master_link_status") == "up", 10)
        finally:
            probe.close()
        return self.replica

    def close(self) -> None:
        if self.replica is not None:
            self.replica.close()
        self.primary.close()


@pytest.fixture
def replicated() -> Iterator[Replicated]:
    servers = Replicated()
    try:
        yield servers
    finally:
        servers.close()


async def test_ack_replica_waits_for_a_replica(replicated: Replicated) -> None:
    lonely = redis_store(replicated.primary.url, prefix="fx", ack="replica")
    lonely.core.ack_timeout_ms = 100
    with pytest.raises(FxStoreUnavailableError):
        await lonely.accept(new_session_id(), agent="default", message_id="m1", input="x")
    await lonely.aclose()
    replica = await replicated.attach()
    store = redis_store(replicated.primary.url, prefix="fx", ack="replica")
    sid = new_session_id()
    accepted = await store.accept(sid, agent="default", message_id="m1", input="x")
    assert accepted.created
    copy = redis_store(replica.url, prefix="fx")
    assert (await copy.state(sid)).pending == 1  # already on the replica when accept returned
    await store.aclose()
    await copy.aclose()


async def test_a_claim_no_replica_acknowledged_is_not_acted_on(replicated: Replicated) -> None:
    """Under `ack="replica"` a claim only the primary holds could be lost in a failover, and
    the promoted node would give the same epoch to the next claimer: two holders of one
    epoch. It raises instead, and the same holder's retry, once a replica is back, answers
    the same epoch (nothing counted twice)."""
    sid = new_session_id()
    await _accepted(redis_store(replicated.primary.url, prefix="fx"), sid)
    store = redis_store(replicated.primary.url, prefix="fx", ack="replica")
    store.core.ack_timeout_ms = 100
    with pytest.raises(FxStoreUnavailableError, match="claim"):
        await store.claim(sid, holder="w1", lease_ms=60_000)
    replica = await replicated.attach()
    store.core.ack_timeout_ms = 5000  # a replica now answers: no need to refuse fast (a loaded machine)
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None and claim.epoch == 1
    copy = redis_store(replica.url, prefix="fx")
    state = await copy.state(sid)
    assert (state.lease_holder, state.epoch) == ("w1", 1)  # on the replica when the claim returned
    await store.aclose()
    await copy.aclose()


async def test_a_reader_is_never_sent_a_line_no_replica_holds(replicated: Replicated) -> None:
    """Under `ack="replica"` a line only the primary holds is lost if the primary dies: a
    reader that had been sent it would then hold a line the promoted store does not (the
    next writer stores another at its cursor). A read waits for a replica to hold what it
    returns, and raises FX_STORE_UNAVAILABLE rather than hand out lines it cannot vouch for."""
    replica = await replicated.attach()
    assert replica.proc is not None
    store = redis_store(replicated.primary.url, prefix="fx", ack="replica")
    store.core.ack_timeout_ms = 5000
    sid, epoch = await session_with_a_line(store)
    assert [line["delta"] for line in await store.read_lines(sid, 0)] == ["kept"]
    await reads_wait_for_the_replica(store, sid, epoch, replica.proc)
    # Redis at its memory limit refuses writes, not reads: the read's write grows nothing.
    admin = redis.Redis.from_url(replicated.primary.url)
    try:
        admin.config_set("maxmemory", 1)
        with pytest.raises(FxStoreFullError):
            await store.accept(sid, agent="default", message_id="m2", input="y")
        assert [line["delta"] for line in await store.read_lines(sid, 0)] == ["kept", "primary only"]
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
    await store.aclose()


async def _accepted(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="x")
    await store.aclose()


async def test_a_warning_when_redis_may_evict(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    admin = redis.Redis.from_url(server.url)
    admin.config_set("maxmemory-policy", "allkeys-lru")
    admin.close()
    store: RedisStore = redis_store(server.url, prefix="fx")
    with caplog.at_level(logging.WARNING, logger="fxworker.store"):
        await store.accept(new_session_id(), agent="default", message_id="m1", input="x")
    assert any("noeviction" in r.getMessage() for r in caplog.records)
    await store.aclose()


async def test_redis_at_its_memory_limit_is_store_full_and_keeps_what_it_has(server: RedisServer) -> None:
    store: RedisStore = redis_store(server.url, prefix="fx")
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="stored before")
    admin = redis.Redis.from_url(server.url)
    admin.config_set("maxmemory", 1)  # noeviction (the default): every write is refused
    try:
        with pytest.raises(FxStoreFullError) as full:
            await store.accept(sid, agent="default", message_id="m2", input="refused")
        assert full.value.code == "FX_STORE_FULL" and isinstance(full.value, FxStoreUnavailableError)
        # A worker's claim is refused the same way, taking nothing.
        with pytest.raises(FxStoreFullError):
            await store.claim(sid, holder="w1", lease_ms=1000)
        state = await store.state(sid)
        assert state.pending == 1 and state.epoch == 0
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
    accepted = await store.accept(sid, agent="default", message_id="m2", input="stored after")
    assert not accepted.repeated
    await store.aclose()
