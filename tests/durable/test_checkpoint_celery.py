"""`session.checkpoint()` on Redis with real Celery workers: turns run in a worker process,
this process exports them (async and blocking) and a new engine continues the
conversation; an export taken while a worker holds a turn leaves the turn running."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from fxengine import create_engine
from fxengine.testing import ScriptedModel
from tests.durable.checkpoints import EXPECTED, next_request_after, responder
from tests.durable.tooling import provider, tools

pytestmark = [pytest.mark.redis, pytest.mark.celery]


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


@pytest.fixture(scope="module")
def pool(workers: Any) -> Any:
    workers.start(concurrency=8)
    return workers


async def test_turns_run_on_a_worker_export_and_continue_in_a_new_engine(pool: Any, client: Any, model: ScriptedModel) -> None:
    session = client.agents["default"].session()
    assert (await (await session.prompt("lookup:bob")).result()).stop_reason == "end_turn"
    assert (await (await session.prompt("hello")).result()).stop_reason == "end_turn"
    state = await session.state()
    data = await session.checkpoint()
    assert await next_request_after(data, model, "what did you find?") == EXPECTED + [("user", "what did you find?")]
    assert await session.state() == state  # read-only: same epoch, cursor, status
    blocking = client.agents["default"].blocking_session(session.id)
    assert await asyncio.to_thread(blocking.checkpoint) == data


async def test_an_export_while_a_worker_runs_the_turn_does_not_disturb_it(pool: Any, client: Any, model: ScriptedModel) -> None:
    session = client.agents["default"].session()
    assert (await (await session.prompt("lookup:bob")).result()).stop_reason == "end_turn"
    assert (await (await session.prompt("hello")).result()).stop_reason == "end_turn"
    turn = await session.prompt("hold:celery-export")
    try:
        await asyncio.to_thread(model.wait_held, "celery-export", timeout_s=15)
        async with asyncio.timeout(10):
            while (await client.store.state(session.id)).open_turn != turn.message_id:
                await asyncio.sleep(0.02)
        held = await session.state()
        data = await session.checkpoint()
        engine = await create_engine("scripted", provider=provider(model.base_url), tools=tools(),
                                     api_key="test-key", checkpoint=data)
        try:
            assert engine.open_turn is not None and engine.open_turn["turnId"] == turn.message_id
        finally:
            await engine.close()
        assert (await session.state())["epoch"] == held["epoch"]
    finally:
        model.release("celery-export")
    result = await turn.result()
    assert result.stop_reason == "end_turn"
    lines = [line async for line in session.stream(0, follow=False)]
    assert not [line for line in lines if line["type"] in ("turn_resume", "session_error")]
    after = await next_request_after(await session.checkpoint(), model, "again")
    assert after[-3:] == [("user", "hold:celery-export"), ("assistant", "partial rest"), ("user", "again")]
