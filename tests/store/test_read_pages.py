"""Stream reads are bounded: a read without a count returns at most `READ_PAGE_LINES`
lines, so a reader of a long session pages through it instead of loading it whole; a
cursor past the stream id space is refused before Redis sees it."""

from __future__ import annotations

import pytest

from fxworker.errors import FxInvalidCursorError
from fxworker.store import RedisStore
from fxworker.store._core import MAX_CURSOR, READ_PAGE_LINES


async def test_a_read_returns_one_page_and_paging_reads_every_line_once(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    total = READ_PAGE_LINES * 2 + 7
    for start in range(0, total, 100):
        lines = [{"type": "text_delta", "messageId": "m1", "delta": f"d{i}"} for i in range(start, min(start + 100, total))]
        await store.append(sid, claim.epoch, lines=lines)
    first = await store.read_lines(sid, 0)
    assert [line["cursor"] for line in first] == list(range(1, READ_PAGE_LINES + 1))
    assert len(store.sync.read_raw_lines(sid, 0)) == READ_PAGE_LINES
    seen, cursor = [], 0
    while page := await store.read_lines(sid, cursor, block_ms=None):
        seen += [line["delta"] for line in page]
        cursor = page[-1]["cursor"]
    assert seen == [f"d{i}" for i in range(total)]
    # An explicit count is the caller's page.
    assert len(await store.read_lines(sid, 0, count=READ_PAGE_LINES + 50)) == READ_PAGE_LINES + 50


async def test_a_cursor_past_the_stream_id_space_is_refused(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    assert await store.read_lines(sid, MAX_CURSOR) == []
    for cursor in (MAX_CURSOR + 1, 10**5000):
        with pytest.raises(FxInvalidCursorError):
            await store.read_lines(sid, cursor)
        with pytest.raises(FxInvalidCursorError):
            store.sync.read_lines(sid, cursor)
