"""A session at rest gives back its streams' room for appends to come (release.lua): the
consumed inbox is trimmed, the idempotency keys (every retry they answer is fenced now)
are dropped, the lines and the log are rewritten to their size; nothing a reader, the next
claim or the next accept needs goes."""

from __future__ import annotations

import asyncio

import pytest
import redis

from fxworker.ids import new_session_id
from fxworker.keys import session_keys
from fxworker.store import RedisStore, redis_store
from fxworker.store.types import StoreRecord
from tests.support.redis_server import RedisServer


async def _one_turn(store: RedisStore, sid: str, n: int) -> None:
    """Prompt `m<n>` taken and ended by a worker, then released at rest."""
    await store.accept(sid, agent="default", message_id=f"m{n}", input=f"hello {n}")
    claim = await store.claim(sid, holder="w", lease_ms=10_000)
    assert claim is not None and [i.message_id for i in claim.pending] == [f"m{n}"]
    lines = [{"type": "turn_start", "messageId": f"m{n}"},
             *({"type": "text_delta", "delta": "x" * 40, "step": 1, "messageId": f"m{n}"} for _ in range(6))]
    await store.append(sid, claim.epoch, records=[StoreRecord(f"r{n}a", b"start", [{"start": f"m{n}"}])], lines=lines)
    await store.append(sid, claim.epoch, records=[StoreRecord(f"r{n}b", b"end", [{"end": True}])],
                       lines=[{"type": "turn_end", "messageId": f"m{n}", "stopReason": "end_turn"}])
    released = await store.release(sid, claim.epoch)
    assert released.released and released.pending == 0


async def test_a_session_at_rest_keeps_everything_a_reader_and_the_next_turn_need(store: RedisStore, sid: str) -> None:
    await _one_turn(store, sid, 1)
    first = await store.read_lines(sid, 0)
    assert [line["type"] for line in first] == ["turn_start", *["text_delta"] * 6, "turn_end"]
    assert (await store.state(sid)).status == "idle"
    # The next turn: its input is accepted after the trimmed inbox, the claim loads the log.
    await store.accept(sid, agent="default", message_id="m2", input="again")
    claim = await store.claim(sid, holder="w", lease_ms=10_000)
    assert claim is not None
    assert [i.message_id for i in claim.pending] == ["m2"]
    assert [r.data for r in claim.records] == [b"start", b"end"]
    await store.append(sid, claim.epoch, lines=[{"type": "turn_start", "messageId": "m2"}])
    lines = await store.read_lines(sid, 0)
    assert [line["cursor"] for line in lines] == list(range(1, 10))
    # A repeated prompt is still answered from the message index.
    repeated = await store.accept(sid, agent="default", message_id="m1", input="hello 1")
    assert repeated.repeated and repeated.status == "done"


@pytest.mark.redis
async def test_at_rest_the_streams_hold_their_entries_not_room_for_more(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix)
    admin = redis.Redis.from_url(redis_url)
    sid = new_session_id()
    try:
        await _one_turn(store, sid, 1)
        keys = session_keys(key_prefix, sid)
        sizes = {name: admin.memory_usage(getattr(keys, name)) for name in ("inbox", "log", "ui")}
        # Redis allocates a stream's node at 4 KiB; at rest each holds what it stores.
        assert all(size is not None and size < 2048 for size in sizes.values()), sizes
        assert admin.xlen(keys.inbox) == 0 and admin.exists(keys.inbox)
        assert admin.xlen(keys.log) == 2 and admin.xlen(keys.ui) == 8
        assert not admin.exists(keys.keys) and not admin.hexists(keys.meta, "line_key")  # idempotency keys gone
    finally:
        admin.close()
        await store.aclose()


@pytest.mark.redis
async def test_a_reader_blocked_on_the_lines_through_the_rewrite_gets_the_next_turn() -> None:
    server = RedisServer()  # its own: the only blocked client on it is this test's reader
    store = redis_store(server.url, prefix="fxr")
    admin = redis.Redis.from_url(server.url)
    sid = new_session_id()
    try:
        await store.accept(sid, agent="default", message_id="m0", input="first")
        claim = await store.claim(sid, holder="w", lease_ms=10_000)
        assert claim is not None
        await store.append(sid, claim.epoch, records=[StoreRecord("r0", b"x", [{"start": "m0"}])],
                           lines=[{"type": "turn_start", "messageId": "m0"}])
        reader = asyncio.ensure_future(store.read_lines(sid, 1, block_ms=3000))
        for _ in range(200):  # until the server holds it blocked after cursor 1
            if any("b" in c["flags"] for c in admin.client_list()):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the reader never blocked")
        await store.append(sid, claim.epoch, records=[StoreRecord("r1", b"y", [{"end": True}])], lines=[])
        await store.release(sid, claim.epoch)  # at rest: the lines are rewritten under the reader
        assert any("b" in c["flags"] for c in admin.client_list()), "the rewrite woke the reader"
        assert not reader.done()
        await _one_turn(store, sid, 1)
        got = await asyncio.wait_for(reader, 5)
        assert got and got[0]["cursor"] == 2 and got[0]["messageId"] == "m1"
    finally:
        admin.close()
        await store.aclose()
        server.close()
