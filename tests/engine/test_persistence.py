from __future__ import annotations

import pytest

from fxengine import FxFencedError, MemoryPersistence


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
