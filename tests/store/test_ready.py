"""The ready set (the sweeper's list), retention and the session index."""

from __future__ import annotations

from fxworker.ids import new_session_id
from fxworker.store import RedisStore
from tests.store.conftest import FakeClock


async def test_accepted_work_is_ready_until_a_live_lease_holds_it(store: RedisStore, clock: FakeClock) -> None:
    a, b = new_session_id(), new_session_id()
    await store.accept(a, agent="support", message_id="m1", input="x")
    await store.accept(b, agent="sales", message_id="m1", input="y")
    ready = {r.session_id: r for r in await store.ready_sessions()}
    assert set(ready) == {a, b} and ready[a].agent == "support" and ready[a].reason == "pending"
    claim = await store.claim(a, holder="w1", lease_ms=1000)
    assert claim is not None
    assert [r.session_id for r in await store.ready_sessions()] == [b]
    await store.append(a, claim.epoch, records=[("k", b"r", [{"start": "m1"}])])
    clock.advance(1000)  # the holder died with the turn open
    ready = {r.session_id: r for r in await store.ready_sessions()}
    assert ready[a].reason == "open_turn"


async def test_a_fresh_mark_outlives_a_clear_and_an_old_idle_one_goes(store: RedisStore, clock: FakeClock) -> None:
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="x")
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    assert not await store.clear_ready(sid, grace_ms=0)  # work pending: kept
    await store.append(sid, claim.epoch, marks=[{"drop": "m1"}])
    await store.release(sid, claim.epoch)
    # A sender may have marked the session a moment ago and still be storing its input.
    await store.mark_ready(sid)
    assert not await store.clear_ready(sid, grace_ms=5000)
    clock.advance(5000)
    assert await store.clear_ready(sid, grace_ms=5000)
    await store.mark_ready(sid)
    clock.advance(5000)
    assert await store.ready_sessions(grace_ms=5000) == []
    assert not await store.clear_ready(sid, grace_ms=0)  # ready_sessions pruned it already


async def test_finished_sessions_expire_when_a_ttl_is_set(store: RedisStore) -> None:
    from fxworker.store import embedded_store, memory_store, redis_store

    if store.kind == "memory":
        ttl_store = memory_store(session_ttl_s=60, clock=store.core.clock)
    elif store.kind == "embedded":
        ttl_store = embedded_store(prefix=store.prefix + "t", session_ttl_s=60, clock=store.core.clock)
    else:
        ttl_store = redis_store(
            client=store.client, sync_client=store.sync.client, prefix=store.prefix, cluster=store.kind == "cluster",
            session_ttl_s=60, clock=store.core.clock,
        )
    sid = new_session_id()
    await ttl_store.accept(sid, agent="default", message_id="m1", input="x")
    claim = await ttl_store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    keys = ttl_store.core.keys(sid)
    client = ttl_store.client
    await ttl_store.append(sid, claim.epoch, records=[("k1", b"r", [{"start": "m1"}])], lines=[{"type": "turn_start"}])
    assert await client.pttl(keys.log) == -1
    await ttl_store.append(sid, claim.epoch, records=[("k2", b"r", [{"end": True}])], lines=[{"type": "turn_end"}])
    for key in (keys.meta, keys.log, keys.ui, keys.inbox, keys.msgs):
        assert 0 < await client.pttl(key) <= 60_000, key
    await ttl_store.accept(sid, agent="default", message_id="m2", input="again")
    assert await client.pttl(keys.meta) == -1
    await ttl_store.aclose()


async def test_list_sessions_newest_first(store: RedisStore, clock: FakeClock) -> None:
    ids = []
    for _ in range(3):
        ids.append(new_session_id())
        await store.accept(ids[-1], agent="default", message_id="m1", input="x")
        clock.advance(1)
    listed = await store.list_sessions(limit=10)
    assert [s for s in listed if s in ids] == list(reversed(ids))


async def test_a_release_with_nothing_left_takes_the_session_out_of_the_ready_set(store: RedisStore) -> None:
    """So a sweep does not read the state of every session finished in the last seconds."""
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="x")
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    await store.accept(sid, agent="default", message_id="m2", input="y")  # lands while the lease is held
    await store.append(sid, claim.epoch, marks=[{"drop": "m1"}])
    assert (await store.release(sid, claim.epoch)).pending == 1
    assert [r.session_id for r in await store.ready_sessions(grace_ms=10**9)] == [sid]  # m2 still waits
    claim = await store.claim(sid, holder="w2", lease_ms=60_000)
    assert claim is not None
    await store.append(sid, claim.epoch, marks=[{"drop": "m2"}])
    await store.release(sid, claim.epoch)
    if store.kind != "cluster":  # on a cluster the ready set is in another slot: the sweeper prunes it
        assert await store.client.zscore(store.core.index.ready, sid) is None
