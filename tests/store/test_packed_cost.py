"""Packing a claim's lines costs what the claim wrote, whatever the session's length
(design §5 "Packed at rest"): the chunks replace the claim's entries at the stream's tail,
and the entries before them that shared the first one's node move with them, so no deleted
entry stays stored. bench/history_cost.py measures it at 10,001 turns."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from fxworker.ids import new_session_id
from fxworker.keys import session_keys
from fxworker.store import RedisStore, redis_store
from fxworker.store.types import StoreRecord
from tests.store.test_packed import _delta, _read_all, _turn
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

# A stream's last node is allocated at stream-node-max-bytes (4 KiB) and kept while it is
# the last one; a longer stream is not rewritten at rest (_at_rest.lua).
NODE_BYTES = 4096


async def _aof_bytes_per_turn(store: RedisStore, admin: redis.Redis, sid: str, first: int, turns: int) -> float:
    before = int(admin.info("persistence")["aof_current_size"])
    for n in range(first, first + turns):
        appended, _ = await _turn(store, sid, n, 6, checkpoint=b"FXJ\x01" + b"conversation " * 40)
        assert appended.packed == 8
    return (int(admin.info("persistence")["aof_current_size"]) - before) / turns


async def test_a_turn_writes_as_much_to_the_aof_after_300_turns_as_after_20() -> None:
    # A node's worth of turns at each length (the entries that move depend on how full the
    # node of the claim's first line is).
    server = RedisServer(appendonly=True, args=("--appendfsync", "no", "--auto-aof-rewrite-percentage", "0"))
    store = redis_store(server.url, prefix="fxtcost")
    admin = redis.Redis.from_url(server.url)
    sid = new_session_id()
    try:
        await _aof_bytes_per_turn(store, admin, sid, 1, 20)
        early = await _aof_bytes_per_turn(store, admin, sid, 21, 16)
        await _aof_bytes_per_turn(store, admin, sid, 37, 264)
        late = await _aof_bytes_per_turn(store, admin, sid, 301, 16)
        # Rebuilding the stream at every release wrote ~10x more at 300 turns than at 20.
        assert late <= 2 * early, (early, late)
        stored = await _read_all(store, sid, 0, 1000)
        assert [line["cursor"] for line in stored] == list(range(1, 316 * 8 + 1))
        # What the AOF holds (XDEL, XSETID below the last id, XADD) loads back the same stream.
        entries = admin.xrange(session_keys("fxtcost", sid).ui)
        await store.aclose()
        server.restart()
        store = redis_store(server.url, prefix="fxtcost")
        assert admin.xrange(session_keys("fxtcost", sid).ui) == entries
        assert await _read_all(store, sid, 0, 1000) == stored
    finally:
        admin.close()
        await store.aclose()
        server.close()


async def test_a_long_packed_session_keeps_no_deleted_entry(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix)
    admin = redis.Redis.from_url(redis_url)
    sid = new_session_id()
    written: list[dict[str, Any]] = []
    try:
        for n in range(1, 61):
            _, lines = await _turn(store, sid, n, n % 9)
            written += lines
        ui = session_keys(key_prefix, sid).ui
        assert admin.xlen(ui) == 60
        # The same entries added afresh to a new stream: as many nodes and the same bytes
        # but for the last node's allocation (Redis keeps a deleted entry in its node).
        scratch = f"{key_prefix}:scratch"
        for entry_id, fields in admin.xrange(ui):
            admin.xadd(scratch, fields, id=entry_id)
        stored, fresh = admin.memory_usage(ui, samples=0), admin.memory_usage(scratch, samples=0)
        assert stored is not None and fresh is not None
        assert stored <= fresh + NODE_BYTES, (stored, fresh)
        assert admin.xinfo_stream(ui)["radix-tree-keys"] == admin.xinfo_stream(scratch)["radix-tree-keys"]
        stored_lines = await _read_all(store, sid, 0, 1000)
        assert [line["cursor"] for line in stored_lines] == list(range(1, len(written) + 1))
        assert [{k: v for k, v in line.items() if k not in ("cursor", "epoch")} for line in stored_lines] == written
    finally:
        admin.close()
        await store.aclose()


async def test_a_follower_blocked_at_the_end_waits_across_a_packing_that_moves_chunks(
    redis_url: str, key_prefix: str
) -> None:
    store = redis_store(redis_url, prefix=key_prefix)
    admin = redis.Redis.from_url(redis_url)
    sid = new_session_id()
    try:
        for n in range(1, 4):  # three chunks, all in the node the next claim's lines join
            await _turn(store, sid, n, 2)
        await store.accept(sid, agent="default", message_id="m4", input="four")
        claim = await store.claim(sid, holder="w", lease_ms=10_000)
        assert claim is not None and claim.ui_cursor == 12
        first = await store.append(sid, claim.epoch, records=[StoreRecord("a", b"start", [{"start": "m4"}])],
                                   lines=[_delta(4, 0), _delta(4, 1)])
        follower = asyncio.ensure_future(store.read_lines(sid, 15, block_ms=5_000))
        calls = int(admin.info("commandstats").get("cmdstat_xadd", {}).get("calls", 0))
        packed = await store.append(sid, claim.epoch, records=[StoreRecord("b", b"end", [{"end": True}])],
                                    lines=[_delta(4, 2)], release=True, pack_after=(13, first.texts))
        assert packed.packed == 3
        # The chunks before the claim's moved with it (added again at their ids), and its own.
        moved = int(admin.info("commandstats")["cmdstat_xadd"]["calls"]) - calls - 3  # record, line, chunk
        assert moved == 3
        keys = session_keys(key_prefix, sid)
        assert [(e[0], e[1][b"f"]) for e in admin.xrange(keys.ui)] == [
            (b"4-0", b"1"), (b"8-0", b"5"), (b"12-0", b"9"), (b"15-0", b"13")]
        await asyncio.sleep(0.05)
        assert not follower.done()
        await store.accept(sid, agent="default", message_id="m5", input="five")
        claim = await store.claim(sid, holder="w", lease_ms=10_000)
        assert claim is not None
        await store.append(sid, claim.epoch, lines=[{"type": "turn_start", "messageId": "m5"}])
        got = await asyncio.wait_for(follower, 5)
        assert [(line["cursor"], line["type"]) for line in got] == [(16, "turn_start")]
        assert [line["cursor"] for line in await _read_all(store, sid, 0, 4)] == list(range(1, 17))
    finally:
        admin.close()
        await store.aclose()
