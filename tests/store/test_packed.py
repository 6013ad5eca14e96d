"""Packed at rest (§5): the call whose end record lets the session go also packs the lines
its writer stored into compressed chunks of the `ui` stream and replaces the log with the
checkpoint it carries. Readers and the next claim see exactly what they saw before; a
chunk that does not match the stored lines packs nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fxworker.ids import new_session_id
from fxworker.keys import session_keys
from fxworker.store import RedisStore, redis_store
from fxworker.store._packed import (
    CHECKPOINT_MAGIC,
    CHUNK_MAX_LINES,
    pack_checkpoint,
    unpack_checkpoint,
)
from fxworker.store.types import Appended, StoreRecord
from tests.support.stored import stored_lines


def _delta(n: int, i: int) -> dict[str, Any]:
    # Varied text (a quote, a newline, non-ASCII): what a chunk holds is the stored JSON.
    return {"type": "text_delta", "delta": f"t{n}.{i} \"é\"\n{'x' * (i % 7)}", "step": 1, "messageId": f"m{n}"}


async def _turn(store: RedisStore, sid: str, n: int, n_lines: int, *, checkpoint: bytes | None = None,
                spoil: bool = False) -> tuple[Appended, list[dict[str, Any]]]:
    """Prompt `m<n>` run by one claim: a start record with its lines, then the end record
    whose call lets the session go, packing what the writer stored (`spoil`: with one of
    those texts changed, as a writer that got them wrong would send them)."""
    await store.accept(sid, agent="default", message_id=f"m{n}", input=f"hello {n}")
    claim = await store.claim(sid, holder="w", lease_ms=10_000)
    assert claim is not None
    lines = [{"type": "turn_start", "messageId": f"m{n}"}, *(_delta(n, i) for i in range(n_lines))]
    first = await store.append(sid, claim.epoch, records=[StoreRecord(f"r{n}a", b"start", [{"start": f"m{n}"}])],
                                lines=lines)
    texts = list(first.texts)
    if spoil:
        texts[-1] = texts[-1].replace("t", "T", 1)
    end = {"type": "turn_end", "messageId": f"m{n}", "stopReason": "end_turn"}
    last = await store.append(sid, claim.epoch, records=[StoreRecord(f"r{n}b", b"end", [{"end": True}])],
                              lines=[end], release=True, checkpoint=checkpoint,
                              pack_after=(claim.ui_cursor + 1, texts))
    assert last.released
    return last, [*lines, end]


async def _read_all(store: RedisStore, sid: str, cursor: int, count: int) -> list[dict[str, Any]]:
    """Every line after `cursor`, read in pages of `count` as a follower does."""
    out: list[dict[str, Any]] = []
    while page := await store.read_lines(sid, cursor, count=count):
        assert len(page) <= count
        out += page
        cursor = page[-1]["cursor"]
    return out


async def test_packed_lines_read_back_the_same_from_every_cursor(store: RedisStore, sid: str) -> None:
    written: list[dict[str, Any]] = []
    for n, n_lines in enumerate((3, 0, CHUNK_MAX_LINES + 5), 1):
        appended, lines = await _turn(store, sid, n, n_lines)
        # The claim's lines, its end record's call's included, went into chunks.
        assert appended.packed == len(lines)
        written += lines
    stored = await _read_all(store, sid, 0, 1000)
    assert [line["cursor"] for line in stored] == list(range(1, len(written) + 1))
    assert [{k: v for k, v in line.items() if k not in ("cursor", "epoch")} for line in stored] == written
    assert [line["epoch"] for line in stored] == [1] * 5 + [2] * 2 + [3] * (CHUNK_MAX_LINES + 7)
    for cursor in range(len(stored) + 1):
        assert await _read_all(store, sid, cursor, 7) == stored[cursor:]
    assert await store.read_lines(sid, len(stored)) == []
    # The next turn appends after the chunks; its lines read on from the last cursor.
    await store.accept(sid, agent="default", message_id="m9", input="again")
    claim = await store.claim(sid, holder="w", lease_ms=10_000)
    assert claim is not None and claim.ui_cursor == len(stored)
    await store.append(sid, claim.epoch, lines=[{"type": "turn_start", "messageId": "m9"}])
    after = await store.read_lines(sid, len(stored) - 1)
    assert [(line["cursor"], line["type"]) for line in after] == [(len(stored), "turn_end"),
                                                                   (len(stored) + 1, "turn_start")]


async def test_a_chunk_that_does_not_match_the_stored_lines_packs_nothing(store: RedisStore, sid: str) -> None:
    _, lines = await _turn(store, sid, 1, 4)
    before = await store.read_lines(sid, 0)
    appended, _ = await _turn(store, sid, 2, 4, spoil=True)
    assert appended.packed == 0  # the session still went at rest, its lines one per entry
    stored = await store.read_lines(sid, 0)
    assert stored[:len(before)] == before
    assert [line["cursor"] for line in stored] == list(range(1, 2 * len(lines) + 1))
    assert stored[-2]["delta"].startswith("t2.3")  # as stored, not as the spoilt chunk had it
    assert (await store.state(sid)).status == "idle"


async def test_the_checkpoint_that_rides_with_the_release_replaces_the_log(store: RedisStore, sid: str) -> None:
    await _turn(store, sid, 1, 2)
    loaded = await store.load(sid)
    assert loaded.checkpoint is None and [r.data for r in loaded.journal] == [b"start", b"end"]
    data = b"FXJ\x01" + json.dumps({"messages": ["hello"] * 200}).encode()
    await _turn(store, sid, 2, 2, checkpoint=data)
    loaded = await store.load(sid)
    assert loaded.checkpoint is not None and loaded.checkpoint.data == data and loaded.checkpoint.through == "4"
    assert loaded.journal == [] and loaded.head == "4"
    await store.accept(sid, agent="default", message_id="m3", input="three")
    claim = await store.claim(sid, holder="w", lease_ms=10_000)
    assert claim is not None and claim.records == [] and claim.head == "4"
    assert claim.checkpoint is not None and claim.checkpoint.data == data
    # The next record follows the checkpoint's; a claim after it reads that one record.
    await store.append(sid, claim.epoch, records=[StoreRecord("r3", b"more", [{"drop": "m3"}])], expected="4")
    assert [(r.cursor, r.data) for r in (await store.load(sid)).journal] == [("5", b"more")]


async def test_an_input_waiting_keeps_the_lease_and_the_lines_and_log_as_they_are(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="one")
    claim = await store.claim(sid, holder="w", lease_ms=10_000)
    assert claim is not None
    first = await store.append(sid, claim.epoch, records=[StoreRecord("a", b"start", [{"start": "m1"}])],
                               lines=[_delta(1, 0)])
    await store.accept(sid, agent="default", message_id="m2", input="two")  # waits: the session stays held
    end = await store.append(sid, claim.epoch, records=[StoreRecord("b", b"end", [{"end": True}])],
                             lines=[_delta(1, 1)], release=True, checkpoint=b"FXJ\x01" + b"c" * 500,
                             pack_after=(1, first.texts))
    assert not end.released and end.packed == 0
    loaded = await store.load(sid)
    assert loaded.checkpoint is None and [r.data for r in loaded.journal] == [b"start", b"end"]
    assert [line["cursor"] for line in await store.read_lines(sid, 0)] == [1, 2]


def test_a_checkpoint_is_stored_compressed_and_any_value_reads_back() -> None:
    big = b"FXJ\x01" + b"the same words again " * 100
    packed = pack_checkpoint(big)
    assert packed.startswith(CHECKPOINT_MAGIC) and len(packed) < len(big) // 4
    assert unpack_checkpoint(packed) == big
    assert pack_checkpoint(b"small") == b"small" and unpack_checkpoint(b"small") == b"small"
    # Bytes that begin like a packed value are always wrapped, so they read back as given.
    odd = CHECKPOINT_MAGIC + b"not deflate"
    assert pack_checkpoint(odd) != odd and unpack_checkpoint(pack_checkpoint(odd)) == odd
    # A value stored before checkpoints were packed reads as it is.
    assert unpack_checkpoint(big) == big


@pytest.mark.redis
async def test_a_session_at_rest_keeps_its_lines_in_chunks_and_no_log(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix)
    admin = redis.Redis.from_url(redis_url)
    sid = new_session_id()
    try:
        for n in range(1, 4):
            await _turn(store, sid, n, 6, checkpoint=b"FXJ\x01" + b"conversation " * (20 * n))
        keys = session_keys(key_prefix, sid)
        entries = admin.xrange(keys.ui)
        # One entry per claim: `<last>-0` with its first cursor and the compressed lines.
        assert [(e[0], e[1][b"f"]) for e in entries] == [(b"8-0", b"1"), (b"16-0", b"9"), (b"24-0", b"17")]
        assert not admin.exists(keys.log, keys.rest, keys.inbox, keys.keys)
        assert admin.hget(keys.ckpt, "data").startswith(CHECKPOINT_MAGIC)
        lines = [json.loads(text) for text in stored_lines(admin, keys, sid)]
        assert [line["cursor"] for line in lines] == list(range(1, 25))
        packed_bytes = sum(int(admin.memory_usage(k, samples=0) or 0) for k in (keys.ui, keys.ckpt))
        assert packed_bytes < sum(len(json.dumps(line)) for line in lines)
    finally:
        admin.close()
        store.close()


@pytest.mark.redis
async def test_a_follower_blocked_at_the_end_waits_across_the_packing(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix)
    sid = new_session_id()
    try:
        await store.accept(sid, agent="default", message_id="m1", input="one")
        claim = await store.claim(sid, holder="w", lease_ms=10_000)
        assert claim is not None
        first = await store.append(sid, claim.epoch, records=[StoreRecord("a", b"start", [{"start": "m1"}])],
                                   lines=[_delta(1, 0), _delta(1, 1)])
        follower = asyncio.ensure_future(store.read_lines(sid, 3, block_ms=5_000))
        await store.append(sid, claim.epoch, records=[StoreRecord("b", b"end", [{"end": True}])],
                           lines=[_delta(1, 2)], release=True, pack_after=(1, first.texts))
        # The chunk `3-0` is no line after cursor 3: the follower waits on for the next one.
        await asyncio.sleep(0)
        assert not follower.done()
        await store.accept(sid, agent="default", message_id="m2", input="two")
        claim = await store.claim(sid, holder="w", lease_ms=10_000)
        assert claim is not None
        await store.append(sid, claim.epoch, lines=[{"type": "turn_start", "messageId": "m2"}])
        got = await asyncio.wait_for(follower, 5)
        assert [(line["cursor"], line["type"]) for line in got] == [(4, "turn_start")]
    finally:
        store.close()


@pytest.mark.redis
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(st.tuples(st.integers(0, 40), st.booleans()), min_size=1, max_size=5),
       count=st.integers(1, 50))
async def test_any_mix_of_packed_and_plain_turns_reads_back_from_any_cursor(
    redis_url: str, key_prefix: str, turns: list[tuple[int, bool]], count: int
) -> None:
    store = redis_store(redis_url, prefix=key_prefix)
    sid = new_session_id()
    try:
        written: list[dict[str, Any]] = []
        for n, (n_lines, spoil) in enumerate(turns, 1):
            appended, lines = await _turn(store, sid, n, n_lines, spoil=spoil)
            assert appended.packed == (0 if spoil else len(lines))
            written += lines
        stored = await _read_all(store, sid, 0, count)
        assert [{k: v for k, v in line.items() if k not in ("cursor", "epoch")} for line in stored] == written
        for cursor in range(0, len(stored) + 1, 5):
            assert await _read_all(store, sid, cursor, count) == stored[cursor:]
    finally:
        store.close()
