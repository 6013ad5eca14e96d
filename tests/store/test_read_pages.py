"""Stream reads are bounded: a read without a count returns at most `READ_PAGE_LINES`
lines, so a reader of a long session pages through it instead of loading it whole; a
worker's look at its inboxes returns at most `INBOX_PAGE_ENTRIES` entries per session, and
its next look goes on after the last; a cursor past the stream id space is refused before
Redis sees it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fxworker.errors import FxInvalidCursorError
from fxworker.ids import new_session_id
from fxworker.store import RedisStore
from fxworker.store._readers import MAX_CURSOR, READ_PAGE_LINES
from fxworker.store._workers import INBOX_PAGE_ENTRIES
from fxworker.store.types import Input
from fxworker.watch import InboxWatcher


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


class InboxPages:
    """The store, with the number of entries each `watch_inboxes` call found per session."""

    def __init__(self, store: RedisStore) -> None:
        self.wrapped = store  # the hub of a loop is keyed by the store underneath
        self.pages: list[dict[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    async def watch_inboxes(self, after: dict[str, int]) -> dict[str, list[Input]]:
        found = await self.wrapped.watch_inboxes(after)
        self.pages.append({sid: len(entries) for sid, entries in found.items()})
        return found


async def test_inboxes_are_read_a_page_a_look_and_every_entry_arrives_once_in_order(
    store: RedisStore, sid: str
) -> None:
    total = INBOX_PAGE_ENTRIES * 2 + 5
    for i in range(total):
        await store.accept(sid, agent="default", message_id=f"m{i}", input=f"p{i}")
    short = new_session_id()
    await store.accept(short, agent="default", message_id="s0", input="x")

    # One look: a page of the long inbox, the whole short one.
    found = await store.watch_inboxes({sid: 0, short: 0})
    assert [e.seq for e in found[sid]] == list(range(1, INBOX_PAGE_ENTRIES + 1))
    assert [e.message_id for e in found[short]] == ["s0"]
    # Looking again after the last entry of each page reads the rest, once.
    seen, after = [], 0
    while page := (await store.watch_inboxes({sid: after})).get(sid, []):
        assert len(page) <= INBOX_PAGE_ENTRIES
        seen += [e.message_id for e in page]
        after = page[-1].seq
    assert seen == [f"m{i}" for i in range(total)]

    # The process's inbox hub follows the same cursor: each of its looks takes a page,
    # and the watcher is handed every entry once, in acceptance order.
    counting = InboxPages(store)
    handed: list[str] = []
    arrived = asyncio.Event()
    wanted = total

    def on_input(entry: Input) -> None:
        handed.append(entry.message_id)
        if len(handed) >= wanted:
            arrived.set()

    watcher = InboxWatcher(counting, sid, after_seq=0, on_input=on_input).start()
    try:
        await asyncio.wait_for(arrived.wait(), 10)
        assert handed == [f"m{i}" for i in range(total)]
        assert [p[sid] for p in counting.pages if sid in p] == [INBOX_PAGE_ENTRIES, INBOX_PAGE_ENTRIES, 5]
        # A later entry is the only one the next looks hand on: nothing is read twice.
        arrived.clear()
        wanted = total + 1
        await store.accept(sid, agent="default", message_id="late", input="p")
        await asyncio.wait_for(arrived.wait(), 10)
        assert handed == [f"m{i}" for i in range(total)] + ["late"]
        assert watcher.after_seq == total + 1
    finally:
        await watcher.stop()
