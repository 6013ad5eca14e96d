from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fxengine import FxFencedError, MemoryPersistence
from fxengine.persistence import Loaded
from fxengine.testing import Reply, ScriptedModel, text

from .conftest import Diagnostics, run, text_of


async def test_memory_persistence_fences_a_stale_expected() -> None:
    store = MemoryPersistence()
    first = await store.append(expected=None, idempotency_key="w:1", data=b"a", barrier=True, marks=[])
    await store.append(expected=first, idempotency_key="w:2", data=b"b", barrier=False, marks=[])
    with pytest.raises(FxFencedError):
        await store.append(expected=first, idempotency_key="x:2", data=b"c", barrier=False, marks=[])
    assert [r.data for r in (await store.load()).journal] == [b"a", b"b"]


async def test_memory_persistence_repeated_key_returns_the_stored_cursor() -> None:
    store = MemoryPersistence()
    first = await store.append(expected=None, idempotency_key="w:1", data=b"a", barrier=True, marks=[])
    again = await store.append(expected=None, idempotency_key="w:1", data=b"a", barrier=True, marks=[])
    assert again == first
    assert len((await store.load()).journal) == 1


class LibfxStyleStore:
    """A store written to libfx's interface: `append` without `marks` (unless it opts in
    with `marks = True`) and a `load()` whose journal is an async iterable."""

    def __init__(self, *, opt_in: bool = False) -> None:
        self.inner = MemoryPersistence()
        self.marks_seen: list[list[dict]] = []
        if opt_in:
            self.marks = True

    async def load(self) -> Loaded:
        loaded = await self.inner.load()
        records = list(loaded.journal)

        async def journal():  # type: ignore[no-untyped-def]
            for record in records:
                await asyncio.sleep(0)
                yield record

        return Loaded(loaded.checkpoint, journal(), loaded.head)

    async def append(self, *, expected: str | None, idempotency_key: str, data: bytes, barrier: bool,
                     **rest: Any) -> str:
        if getattr(self, "marks", False):
            self.marks_seen.append(rest["marks"])
        else:
            assert rest == {}, rest
        return await self.inner.append(expected=expected, idempotency_key=idempotency_key, data=data, barrier=barrier,
                                       marks=[])


@pytest.mark.parametrize("opt_in", [False, True])
async def test_a_libfx_style_store_records_and_resumes(model: ScriptedModel, make_engine: Any, opt_in: bool,
                                                       diagnostics: Diagnostics) -> None:
    store = LibfxStyleStore(opt_in=opt_in)
    store_append = store.append
    if not opt_in:
        async def append(*, expected: str | None, idempotency_key: str, data: bytes, barrier: bool) -> str:
            return await store_append(expected=expected, idempotency_key=idempotency_key, data=data, barrier=barrier)
        store.append = append  # type: ignore[method-assign]
    model.script(Reply(text("one")), Reply(text("two")))
    first = await make_engine(persistence=store, on_event=diagnostics)
    _, result = await run(first.prompt("a"))
    appended = diagnostics.of("journal.append")
    assert appended and all(d["bytes"] > 0 and d["events"] >= 1 for d in appended)
    assert result.stop_reason == "end_turn" and result.message_id
    second = await make_engine(persistence=store)  # loads the async-iterable journal
    events, _ = await run(second.prompt("b"))
    assert text_of(events) == "two"
    assert [m["role"] for m in model.requests[1].body["messages"]] == ["user", "assistant", "user"]
    if opt_in:
        assert {"start": result.message_id} in [m for marks in store.marks_seen for m in marks]
