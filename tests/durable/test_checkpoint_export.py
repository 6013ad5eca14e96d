"""`session.checkpoint()` on the embedded and memory stores (in-process workers): export a
session with a tool call and a second turn, restore an engine from the bytes, and the next
model request carries the whole earlier conversation. Async and blocking, read-only.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from fxengine import create_engine
from fxengine.testing import ScriptedModel
from fxworker import Agent, FxUnknownSessionError, Settings, embedded
from fxworker.store import embedded_store, memory_store
from fxworker.embedded import InProcessWaker
from tests.durable.checkpoints import EXPECTED, next_request_after, responder
from tests.durable.tooling import provider, tools


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


@pytest.fixture(params=["embedded", "memory"])
def agent(request: pytest.FixtureRequest, model: ScriptedModel, redis_url: str) -> Iterator[Agent]:
    prefix = f"fxk{uuid.uuid4().hex[:8]}"
    store = embedded_store(prefix=prefix) if request.param == "embedded" else memory_store(prefix=prefix)
    a = Agent("default", model="scripted", provider=provider(model.base_url), tools=tools(), api_key="test-key",
              store=store, waker=InProcessWaker(), settings=Settings(redis_url=redis_url, prefix=prefix, lease_s=2.0,
                                                                     reserve_s=4.0, sweep_s=0.5))
    embedded.start_embedded_workers(1)
    try:
        yield a
    finally:
        embedded.stop_embedded_workers()
        a.close()


async def test_an_export_restores_the_conversation_in_a_new_engine(agent: Agent, model: ScriptedModel) -> None:
    session = agent.session()
    assert (await (await session.prompt("lookup:bob")).result()).stop_reason == "end_turn"
    assert (await (await session.prompt("hello")).result()).stop_reason == "end_turn"
    epoch = (await session.state())["epoch"]
    data = await session.checkpoint()
    assert isinstance(data, bytes) and 0 < len(data) < 4 * 1024 * 1024
    assert await next_request_after(data, model, "and now?") == EXPECTED + [("user", "and now?")]
    # Read-only: no lease was taken, nothing was written.
    state = await session.state()
    assert state["epoch"] == epoch and state["status"] == "idle" and state["turns"] == 2
    # Another Session object on the same id exports the same conversation.
    assert await agent.session(session.id).checkpoint() == data


def test_the_blocking_twin_exports_the_same_bytes(agent: Agent, model: ScriptedModel) -> None:
    session = agent.blocking_session()
    assert session.prompt("lookup:bob").result().stop_reason == "end_turn"
    assert session.prompt("hello").result().stop_reason == "end_turn"
    data = session.checkpoint()
    assert isinstance(data, bytes)
    assert data == agent.blocking_session(session.id).checkpoint()
    assert asyncio.run(agent.session(session.id).checkpoint()) == data  # and from another loop, async


async def test_an_export_of_a_running_turn_holds_it_open_and_does_not_stop_it(agent: Agent, model: ScriptedModel) -> None:
    session = agent.session()
    assert (await (await session.prompt("lookup:bob")).result()).stop_reason == "end_turn"
    assert (await (await session.prompt("hello")).result()).stop_reason == "end_turn"
    # A hold of its own: the module's model outlives each store's run, and a released hold
    # stays released.
    hold = f"export-open-{uuid.uuid4().hex[:8]}"
    turn = await session.prompt(f"hold:{hold}")
    try:
        model.wait_held(hold, timeout_s=10)
        await opened(agent, session.id, turn.message_id)
        running = await session.state()
        data = await session.checkpoint()  # the open turn's start record is in the log, past the checkpoint
        engine = await create_engine("scripted", provider=provider(model.base_url), tools=tools(),
                                     api_key="test-key", checkpoint=data)
        try:
            assert engine.open_turn is not None and engine.open_turn["turnId"] == turn.message_id
            assert [m["role"] for m in engine.messages][:6] == [r for r, _ in EXPECTED]
            assert (await session.state())["epoch"] == running["epoch"]  # the worker still holds it
            # The restored engine resumes the open turn on its own: it asks the model again.
            resumed = engine.resume()
            assert resumed is not None
            model.release(hold)
            result = await asyncio.wait_for(resumed.result(), 20)
            assert result.stop_reason == "end_turn", result
        finally:
            await engine.close()
    finally:
        model.release(hold)
    assert (await turn.result()).stop_reason == "end_turn"
    # Exported after the turn ended: it is closed, with its answer.
    data = await session.checkpoint()
    assert (await next_request_after(data, model, "last"))[-3:] == [
        ("user", f"hold:{hold}"), ("assistant", "partial rest"), ("user", "last")]


async def opened(agent: Agent, session_id: str, message_id: str | None, timeout_s: float = 10.0) -> None:
    """Waits (bounded) until the store shows the turn open: its start record is in the log."""
    async with asyncio.timeout(timeout_s):
        while (await agent.store.state(session_id)).open_turn != message_id:
            await asyncio.sleep(0.02)


async def test_an_unknown_session_has_no_checkpoint(agent: Agent) -> None:
    with pytest.raises(FxUnknownSessionError):
        await agent.session(agent.new_session_id()).checkpoint()
