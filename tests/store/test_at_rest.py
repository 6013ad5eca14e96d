"""A session at rest gives back what its streams hold for appends to come (release.lua,
_rest.lua): the consumed inbox and the idempotency keys go (every retry they answer is fenced
now), the log becomes one value, `rest`, and the lines are rewritten to their size; nothing
a reader, the next claim or the next accept needs goes, and the next claim puts the log
back."""

from __future__ import annotations

import asyncio

import pytest
import redis

from fxworker.ids import new_session_id
from fxworker.errors import FxLeaseLostError, FxSessionIncompleteError
from fxworker.keys import SESSION_KEY_NAMES, session_keys
from fxworker.store import RedisStore, memory_store, redis_store
from fxworker.store._replies import parse_rest
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
    assert [r.data for r in (await store.load(sid)).journal] == [b"start", b"end"]
    first = await store.read_lines(sid, 0)
    assert [line["type"] for line in first] == ["turn_start", *["text_delta"] * 6, "turn_end"]
    assert [line["cursor"] for line in first] == list(range(1, 9))
    assert [line["cursor"] for line in await store.read_lines(sid, 3, count=2)] == [4, 5]
    assert await store.read_lines(sid, 8) == []
    assert (await store.state(sid)).status == "idle"
    # The next turn: its input is accepted into a new inbox, the claim loads the log.
    await store.accept(sid, agent="default", message_id="m2", input="again")
    claim = await store.claim(sid, holder="w", lease_ms=10_000)
    assert claim is not None
    assert [i.message_id for i in claim.pending] == ["m2"]
    assert [r.data for r in claim.records] == [b"start", b"end"]
    await store.append(sid, claim.epoch, lines=[{"type": "turn_start", "messageId": "m2"}])
    lines = await store.read_lines(sid, 0)
    assert [line["cursor"] for line in lines] == list(range(1, 10))
    assert lines[:8] == first
    # A repeated prompt is still answered from the message index.
    repeated = await store.accept(sid, agent="default", message_id="m1", input="hello 1")
    assert repeated.repeated and repeated.status == "done"


async def test_turns_after_rest_keep_the_whole_journal_and_every_line(store: RedisStore, sid: str) -> None:
    for n in range(1, 4):
        await _one_turn(store, sid, n)
        loaded = await store.load(sid)
        assert [r.data for r in loaded.journal] == [b"start", b"end"] * n and loaded.head == str(2 * n)
    lines = await store.read_lines(sid, 0)
    assert [line["cursor"] for line in lines] == list(range(1, 25))
    assert [line["messageId"] for line in lines if line["type"] == "turn_end"] == ["m1", "m2", "m3"]
    # A checkpoint through a record: the records it covers stay covered at rest and after.
    await store.accept(sid, agent="default", message_id="m4", input="four")
    claim = await store.claim(sid, holder="w", lease_ms=10_000)
    assert claim is not None
    await store.save_checkpoint(sid, claim.epoch, through="4", data=b"ckpt")
    await store.append(sid, claim.epoch, records=[StoreRecord("r4", b"done", [{"drop": "m4"}])], lines=[])
    released = await store.release(sid, claim.epoch)
    assert released.released and released.pending == 0
    loaded = await store.load(sid)
    assert loaded.checkpoint is not None and loaded.checkpoint.data == b"ckpt"
    assert [(r.cursor, r.data) for r in loaded.journal] == [("5", b"start"), ("6", b"end"), ("7", b"done")]
    claim = await store.claim(sid, holder="w", lease_ms=10_000)
    assert claim is not None and [r.data for r in claim.records] == [b"start", b"end", b"done"]


@pytest.mark.redis
async def test_at_rest_the_log_is_one_value_and_the_lines_hold_their_size(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix)
    admin = redis.Redis.from_url(redis_url)
    sid = new_session_id()
    try:
        await _one_turn(store, sid, 1)
        keys = session_keys(key_prefix, sid)
        assert not admin.exists(keys.inbox, keys.log, keys.keys)
        # Redis allocates a stream's node at 4 KiB; at rest the lines are rewritten to their size.
        ui = admin.memory_usage(keys.ui)
        assert admin.xlen(keys.ui) == 8 and ui is not None and ui < 2048, ui
        records = parse_rest(admin.get(keys.rest))
        assert [(n, f[b"d"], f[b"e"]) for n, f in records] == [(1, b"start", b"1"), (2, b"end", b"1")]
        meta = admin.hgetall(keys.meta)
        assert meta[b"rest"] == b"1" and b"line_key" not in meta
        assert not {b"turn", b"turn_seq", b"turn_cursor", b"yielded", b"cutoffs", b"deaths"} & set(meta)
        # The next claim puts the log back, with its ids, and deletes the value.
        await store.accept(sid, agent="default", message_id="m2", input="again")
        claim = await store.claim(sid, holder="w", lease_ms=10_000)
        assert claim is not None
        assert not admin.exists(keys.rest) and not admin.hexists(keys.meta, "rest")
        assert [(e[0], e[1][b"d"]) for e in admin.xrange(keys.log)] == [(b"1-0", b"start"), (b"2-0", b"end")]
    finally:
        admin.close()
        await store.aclose()


async def test_a_session_at_rest_with_its_log_lost_is_refused(store: RedisStore, sid: str) -> None:
    await _one_turn(store, sid, 1)
    store.sync.client.delete(store._core.keys(sid).rest)
    with pytest.raises(FxSessionIncompleteError, match="rest"):
        await store.state(sid)
    with pytest.raises(FxSessionIncompleteError, match="rest"):
        await store.claim(sid, holder="w", lease_ms=10_000)


async def test_a_session_set_to_expire_keeps_its_deadline_at_rest_and_back(sid: str) -> None:
    store = memory_store(session_ttl_s=60)
    try:
        await _one_turn(store, sid, 1)
        keys = store._core.keys(sid)
        client = store.sync.client
        assert all(0 < client.pttl(k) <= 60_000 for k in (keys.meta, keys.ui, keys.rest, keys.lease, keys.msgs))
        claim = await store.claim(sid, holder="w", lease_ms=10_000)  # no input: the log comes back all the same
        assert claim is not None and not client.exists(keys.rest)
        assert 0 < client.pttl(keys.log) <= 60_000
    finally:
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


def _layout(store: RedisStore, sid: str) -> dict[str, object]:
    """Each key of the session that exists: its type, and for the small ones their value."""
    client = store.sync.client
    keys = store._core.keys(sid)
    found: dict[str, object] = {}
    for name, key in zip(SESSION_KEY_NAMES, keys.names):
        kind = client.type(key)
        if kind in (b"none", "none"):
            continue
        if name in ("meta", "lease", "msgs"):
            found[name] = {k: v for k, v in client.hgetall(key).items() if k not in (b"created_ms", b"epoch")}
        elif name == "rest":
            found[name] = [(n, f[b"d"]) for n, f in parse_rest(client.get(key))]
        else:
            found[name] = kind
    return found


async def test_an_end_record_can_let_the_session_go_in_its_own_call(store: RedisStore, sid: str) -> None:
    """append(release=True) on a turn's end record stores it and leaves the session as a
    release() after it would: one call instead of two. Any later call of the epoch is
    fenced and stores nothing, a retry of that call (its reply lost) too: the keys that
    could answer it went at rest. The next claim counts on from it."""
    twin = new_session_id()
    await _one_turn(store, twin, 1)  # the same turn, released by release()
    await store.accept(sid, agent="default", message_id="m1", input="hello 1")
    claim = await store.claim(sid, holder="w", lease_ms=10_000)
    assert claim is not None
    lines = [{"type": "turn_start", "messageId": "m1"},
             *({"type": "text_delta", "delta": "x" * 40, "step": 1, "messageId": "m1"} for _ in range(6))]
    await store.append(sid, claim.epoch, records=[StoreRecord("r1a", b"start", [{"start": "m1"}])], lines=lines)
    end = {"records": [StoreRecord("r1b", b"end", [{"end": True}])],
           "lines": [{"type": "turn_end", "messageId": "m1", "stopReason": "end_turn"}]}
    appended = await store.append(sid, claim.epoch, **end, release=True)  # type: ignore[arg-type]
    assert appended.released and not appended.repeated and appended.lines == [8]
    assert _layout(store, sid) == _layout(store, twin)
    ready = store._core.index.ready
    assert store.sync.client.zscore(ready, sid) is None or store._core.cluster
    with pytest.raises(FxLeaseLostError):
        await store.append(sid, claim.epoch, **end, release=True)  # type: ignore[arg-type]
    with pytest.raises(FxLeaseLostError):
        await store.append(sid, claim.epoch, lines=[{"type": "text_delta", "delta": "late"}])
    assert _layout(store, sid) == _layout(store, twin)
    assert (await store.release(sid, claim.epoch)).released is False  # already let go
    assert len(await store.read_lines(sid, 0)) == 8
    await store.accept(sid, agent="default", message_id="m2", input="again")
    claim2 = await store.claim(sid, holder="w2", lease_ms=10_000)
    assert claim2 is not None and claim2.epoch == claim.epoch + 1
    assert [r.data for r in claim2.records] == [b"start", b"end"]
    assert [i.message_id for i in claim2.pending] == ["m2"]


async def test_an_end_record_keeps_the_session_while_work_waits_or_a_turn_is_open(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="one")
    claim = await store.claim(sid, holder="w", lease_ms=10_000)
    assert claim is not None
    # A record that does not end the turn leaves it open: nothing is let go.
    started = await store.append(sid, claim.epoch, records=[StoreRecord("r1a", b"start", [{"start": "m1"}])],
                                 lines=[{"type": "turn_start", "messageId": "m1"}], release=True)
    assert not started.released
    # An input accepted before the end record: the session stays held for it.
    await store.accept(sid, agent="default", message_id="m2", input="two")
    ended = await store.append(sid, claim.epoch, records=[StoreRecord("r1b", b"end", [{"end": True}])],
                               lines=[{"type": "turn_end", "messageId": "m1"}], release=True)
    assert not ended.released
    await store.append(sid, claim.epoch, lines=[{"type": "turn_start", "messageId": "m2"}])  # still this epoch's
    released = await store.release(sid, claim.epoch)
    assert released.released and released.pending == 1
