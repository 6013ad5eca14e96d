"""A web process announces the stored layout level it reads (its live mark, with no agent),
so a writer of a new layout can wait for every live reader (docs/operations.md,
"Upgrading"); the mark goes when the app stops."""

from __future__ import annotations

import asyncio
import uuid

from fxworker.liveness import layout_all_read
from fxworker.settings import Settings
from fxworker.store import redis_store
from fxworker.store.types import LAYOUT_LEVEL
from fxworker.web import create_app


async def test_a_web_app_writes_a_live_mark_with_its_layout_level_and_deletes_it(redis_url: str) -> None:
    prefix = f"fxl{uuid.uuid4().hex[:8]}"
    store = redis_store(redis_url, prefix=prefix)
    app = create_app(agents={}, settings=Settings(redis_url=redis_url, prefix=prefix))
    try:
        async with app.router.lifespan_context(app):
            async def marked() -> list[object]:
                while not (marks := await store.live_workers()):
                    await asyncio.sleep(0.02)
                return marks
            marks = await asyncio.wait_for(marked(), 5.0)
            assert [(m.agents, m.reads) for m in marks] == [((), LAYOUT_LEVEL)]  # type: ignore[attr-defined]
            assert layout_all_read(marks) == LAYOUT_LEVEL  # type: ignore[arg-type]
        assert await store.live_workers() == []
    finally:
        await store.aclose()
