"""Orders of calls no fault is needed for (§6, §11): what callers send before any worker
runs, on the embedded store (the same Lua) with in-process workers started afterwards.

Each case ends every input once and leaves the session idle at epoch 1: a loop that
claims and writes again without progress is a bug even when nothing is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from fxengine.testing import ScriptedModel
from fxworker import Agent, embedded
from tests.durable.conftest import embedded_agent, stored_lines, wait_idle

IDLE_TIMEOUT_S = 10.0


@pytest.fixture
def agent(model: ScriptedModel) -> Iterator[Agent]:
    """An agent whose wakes wait until the test starts a worker (none runs at first)."""
    with embedded_agent(model, start_workers=False) as a:
        yield a


async def test_a_cancel_before_any_worker_ends_the_prompt_once(agent: Agent, model: ScriptedModel) -> None:
    session = agent.session()
    turn = await session.prompt("never run")
    await session.cancel()
    requests = len(model.requests)
    embedded.start_embedded_workers(1)
    result = await asyncio.wait_for(turn.result(), IDLE_TIMEOUT_S)
    assert result.stop_reason == "cancelled"
    state = await wait_idle(agent, session.id, timeout_s=IDLE_TIMEOUT_S, drained=False)
    lines = await stored_lines(agent, session.id)
    assert [line["type"] for line in lines] == ["turn_start", "turn_end"], lines
    assert lines[-1]["stopReason"] == "cancelled" and lines[-1]["messageId"] == turn.message_id
    assert state.epoch == 1 and state.pending == 0, state
    assert len(model.requests) == requests  # the model was never asked
    # The session goes on: the next prompt runs.
    after = await (await session.prompt("then this")).result()
    assert after.stop_reason == "end_turn"


async def test_a_steer_then_a_cancel_before_any_worker_end_once_each(agent: Agent) -> None:
    """The cancel names the prompt (the first waiting input); the steer waiting behind it
    runs as the next turn, once."""
    session = agent.session()
    turn = await session.prompt("first")
    await session.steer("and then")
    await session.cancel()
    embedded.start_embedded_workers(1)
    assert (await asyncio.wait_for(turn.result(), IDLE_TIMEOUT_S)).stop_reason == "cancelled"
    state = await wait_idle(agent, session.id, timeout_s=IDLE_TIMEOUT_S, drained=False)
    lines = await stored_lines(agent, session.id)
    ends = [line for line in lines if line["type"] == "turn_end"]
    assert len(ends) == 2 and ends[0]["stopReason"] == "cancelled" and ends[1]["stopReason"] == "end_turn", lines
    assert len(lines) <= 12 and state.epoch <= 2 and state.pending == 0, (state, lines)


async def test_a_cancel_of_a_steer_alone_before_any_worker_ends_it_once(agent: Agent) -> None:
    session = agent.session()
    await session.steer("a steer with no turn to join")
    await session.cancel()
    embedded.start_embedded_workers(1)
    state = await wait_idle(agent, session.id, timeout_s=IDLE_TIMEOUT_S, drained=False)
    lines = await stored_lines(agent, session.id)
    ends = [line for line in lines if line["type"] == "turn_end"]
    assert [e["stopReason"] for e in ends] == ["cancelled"], lines
    assert len(lines) <= 4 and state.epoch == 1 and state.pending == 0, (state, lines)


async def test_a_session_claimed_again_and_again_without_progress_ends_its_head(agent: Agent) -> None:
    """The backstop for any loop of claims that moves nothing on (§6): a prompt claimed
    more than MAX_FUTILE_CLAIMS times with no input or step moving on ends FX_NO_PROGRESS,
    and the prompt behind it runs."""
    from fxworker.runner import MAX_FUTILE_CLAIMS

    session = agent.session()
    stuck = await session.prompt("claimed and let go, again and again")
    behind = await session.prompt("then this")
    for i in range(MAX_FUTILE_CLAIMS):  # deliveries that took the lease and moved nothing on
        claim = await agent.store.claim(session.id, holder=f"h{i}", lease_ms=5000)
        assert claim is not None and claim.futile == i + 1
        await agent.store.release(session.id, claim.epoch, cutoff=False)
    embedded.start_embedded_workers(1)
    result = await asyncio.wait_for(stuck.result(), IDLE_TIMEOUT_S)
    assert result.stop_reason == "error" and result.error["code"] == "FX_NO_PROGRESS", result
    assert (await asyncio.wait_for(behind.result(), IDLE_TIMEOUT_S)).stop_reason == "end_turn"
    # The count restarted with that progress: the next claims start from one again.
    state = await wait_idle(agent, session.id, timeout_s=IDLE_TIMEOUT_S, drained=False)
    claim = await agent.store.claim(session.id, holder="after", lease_ms=5000)
    assert claim is not None and claim.futile == 1, (state, claim)
