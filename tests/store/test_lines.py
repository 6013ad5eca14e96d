"""UI lines: contiguous cursors, resumable from any point, blocking followers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fxworker.errors import FxInvalidCursorError, FxLeaseLostError
from fxworker.store import RedisStore


async def _writer(store: RedisStore, sid: str) -> int:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    return claim.epoch


async def test_cursors_are_contiguous_and_resumable_from_any_point(store: RedisStore, sid: str) -> None:
    epoch = await _writer(store, sid)
    sizes = [1, 3, 2, 5, 1]
    n = 0
    for size in sizes:
        lines = [{"type": "text_delta", "messageId": "m1", "delta": f"d{n + i}"} for i in range(size)]
        appended = await store.append(sid, epoch, lines=lines)
        assert appended.lines == list(range(n + 1, n + size + 1))
        n += size
    everything = await store.read_lines(sid, 0)
    assert [line["cursor"] for line in everything] == list(range(1, n + 1))
    assert [line["delta"] for line in everything] == [f"d{i}" for i in range(n)]
    assert all(line["epoch"] == epoch for line in everything)
    for cursor in range(n + 1):
        assert await store.read_lines(sid, cursor) == everything[cursor:]
    # Paging with a count and the last cursor read never skips or repeats.
    paged, cursor = [], 0
    while page := await store.read_lines(sid, cursor, count=3):
        paged += page
        cursor = page[-1]["cursor"]
    assert paged == everything


async def test_raw_lines_are_the_stored_json(store: RedisStore, sid: str) -> None:
    epoch = await _writer(store, sid)
    await store.append(sid, epoch, lines=[{"type": "tool_start", "id": "c1", "name": "t", "input": {"q": "é{}"}}])
    [(cursor, raw)] = await store.read_raw_lines(sid, 0)
    assert cursor == 1
    assert raw.decode().startswith('{"type":"tool_start"')
    assert (await store.read_lines(sid, 0))[0]["input"] == {"q": "é{}"}


async def test_a_follower_blocks_until_a_line_lands(store: RedisStore, sid: str) -> None:
    epoch = await _writer(store, sid)
    follower = asyncio.create_task(store.read_lines(sid, 0, block_ms=3000))
    await asyncio.sleep(0)  # let the read start (the result is checked, not timed)
    await store.append(sid, epoch, lines=[{"type": "text_delta", "delta": "hi"}])
    lines = await asyncio.wait_for(follower, 5)
    assert [line["delta"] for line in lines] == ["hi"]
    assert await store.read_lines(sid, 1, block_ms=50) == []


async def test_a_cursor_must_be_a_non_negative_integer(store: RedisStore, sid: str) -> None:
    with pytest.raises(FxInvalidCursorError):
        await store.read_lines(sid, -1)
    with pytest.raises(FxInvalidCursorError):
        await store.read_lines(sid, "3")  # type: ignore[arg-type]


async def test_a_line_needs_a_type(store: RedisStore, sid: str) -> None:
    epoch = await _writer(store, sid)
    with pytest.raises(ValueError):
        await store.append(sid, epoch, lines=[{"delta": "x"}])
    assert await store.read_lines(sid, 0) == []


async def test_a_repeated_line_only_call_key_stores_its_lines_once(store: RedisStore, sid: str) -> None:
    epoch = await _writer(store, sid)
    batch = [{"type": "text_delta", "messageId": "m1", "delta": "a"}, {"type": "text_delta", "messageId": "m1", "delta": "b"}]
    first = await store.append(sid, epoch, lines=batch, idempotency_key="lines:1")
    # A retry whose first try ran (its reply lost): the same cursors, nothing stored again.
    again = await store.append(sid, epoch, lines=batch, idempotency_key="lines:1")
    assert (first.lines, first.repeated) == ([1, 2], False)
    assert (again.lines, again.repeated) == ([1, 2], True)
    assert [line["delta"] for line in await store.read_lines(sid, 0)] == ["a", "b"]
    # A new key stores; the key before it is forgotten (only the newest is kept).
    third = await store.append(sid, epoch, lines=batch[:1], idempotency_key="lines:2")
    assert (third.lines, third.repeated) == ([3], False)
    assert (await store.append(sid, epoch, lines=batch[:1], idempotency_key="lines:2")).lines == [3]
    assert [line["cursor"] for line in await store.read_lines(sid, 0)] == [1, 2, 3]
    keys = store.core.keys(sid)
    assert await store.client.hexists(keys.keys, "lines:1") == 0
    assert await store.client.hexists(keys.keys, "lines:2") == 1


async def test_a_call_key_is_refused_on_a_call_with_records(store: RedisStore, sid: str) -> None:
    epoch = await _writer(store, sid)
    with pytest.raises(ValueError):
        await store.append(sid, epoch, records=[("k1", b"x", [])], idempotency_key="lines:1")
    with pytest.raises(ValueError):
        await store.append(sid, epoch, lines=[{"type": "idle"}], idempotency_key="")


async def test_a_fenced_line_only_call_is_refused_whatever_its_key(store: RedisStore, sid: str, clock: Any) -> None:
    epoch = await _writer(store, sid)
    await store.append(sid, epoch, lines=[{"type": "text_delta", "delta": "a"}], idempotency_key="lines:1")
    clock.advance(61_000)
    assert await store.claim(sid, holder="w2", lease_ms=60_000) is not None
    with pytest.raises(FxLeaseLostError):
        await store.append(sid, epoch, lines=[{"type": "text_delta", "delta": "a"}], idempotency_key="lines:1")
