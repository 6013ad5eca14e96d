"""UI lines: contiguous cursors, resumable from any point, blocking followers."""

from __future__ import annotations

import asyncio

import pytest

from fxworker.errors import FxInvalidCursorError
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
