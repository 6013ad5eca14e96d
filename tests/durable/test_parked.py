"""Turns that wait, parked with no worker held (docs/design.md §6 "Paused turns"), on the
embedded store (the production Lua on fakeredis) with an in-process worker.

A call of a tool that waits (`approval=`, `external=True`) parks its turn: the session's
state says `paused` with the calls it waits on, no lease is held, and nothing wakes it but
a decision or a cancel. The real-worker and fault tests are in tests/durable/test_approvals_celery.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from fxengine import Tool, ToolContext
from fxengine.errors import FxInputError
from fxengine.testing import ScriptedModel
from fxworker import Agent
from tests.durable.conftest import embedded_agent, stored_lines, wait_idle
from tests.durable.tooling import tools

pytestmark = pytest.mark.timeout(60)

TURN_S = 15.0


class Refunds:
    """The agent's tools with `refund` (waits for approval) counting its real runs here."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, str]] = []

        def execute(input: Any, ctx: ToolContext) -> str:
            self.runs.append((input["amount"], ctx.execution_id))
            return f"refunded {input['amount']}"

        others = [t for t in tools() if t.name != "refund"]
        self.tools = [*others, Tool("refund", "Refunds an order.", {"type": "object", "properties": {
            "amount": {"type": "integer"}}}, idempotent=False, execute=execute, approval=True)]


@pytest.fixture
def refunds() -> Refunds:
    return Refunds()


@pytest.fixture(params=["fakeredis", "redis"])
def agent(request: pytest.FixtureRequest, model: ScriptedModel, refunds: Refunds) -> Iterator[Agent]:
    """The agent on the embedded store, and on a real Redis (the same Lua on both)."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    with embedded_agent(model, agent_tools=refunds.tools, redis_url=url) as a:
        yield a


async def parked(agent: Agent, session_id: str, *, calls: int = 1) -> Any:
    """The session's state once its turn is parked with `calls` calls waiting."""
    async def look() -> Any:
        while True:
            state = await agent.store.state(session_id)
            if state is not None and state.status == "paused" and len(state.paused_calls) == calls:
                return state
            await asyncio.sleep(0.02)
    return await asyncio.wait_for(look(), TURN_S)


def tool_texts(model: ScriptedModel) -> list[str]:
    return [m["content"] for r in model.requests for m in r.body["messages"] if m["role"] == "tool"]


async def test_a_call_waiting_for_approval_parks_the_turn_and_an_approval_runs_it_once(
        agent: Agent, refunds: Refunds, model: ScriptedModel) -> None:
    session = agent.session()
    turn = await session.prompt("refund:40")
    result = await asyncio.wait_for(turn.result(), TURN_S)
    assert result.stop_reason == "paused"
    [call] = result.pending_calls
    assert call["name"] == "refund" and call["kind"] == "approval" and call["input"] == {"amount": 40}

    state = await parked(agent, session.id)
    assert state.paused_calls == (call["id"],) and state.lease_holder is None and not state.has_work
    info = await session.state()
    assert info["status"] == "paused" and info["pendingCalls"] == [call["id"]]
    assert refunds.runs == []
    lines = await stored_lines(agent, session.id)
    assert [line["type"] for line in lines if line["type"] in ("approval_request", "turn_pause")] == [
        "approval_request", "turn_pause"]

    accepted = await session.approve(call["id"], message_id="approve-1", by="alice")
    assert accepted.turn == turn.message_id and not accepted.repeated
    resumed = await asyncio.wait_for(session.follow(accepted).result(), TURN_S)
    assert resumed.stop_reason == "end_turn"
    assert [amount for amount, _ in refunds.runs] == [40]

    again = await session.approve(call["id"], message_id="approve-1")
    assert again.repeated
    with pytest.raises(FxInputError) as second:
        await session.approve(call["id"])
    assert second.value.code == "FX_DECISION_REPEATED"  # its turn ended: the first decision stood
    await wait_idle(agent, session.id, timeout_s=TURN_S)
    assert len(refunds.runs) == 1


async def test_a_second_decision_for_a_call_is_refused_while_the_first_waits(
        agent: Agent, refunds: Refunds) -> None:
    """Two answers for one call (two servers, say): the first stands, the second is
    `FX_DECISION_REPEATED`, and the call runs once."""
    from fxworker import embedded

    session = agent.session()
    result = await asyncio.wait_for((await session.prompt("refund:7")).result(), TURN_S)
    [call] = result.pending_calls
    embedded.stop_embedded_workers()  # both answers land before any worker runs
    first = await session.approve(call["id"])
    with pytest.raises(FxInputError) as second:
        await session.deny(call["id"], reason="no")
    assert second.value.code == "FX_DECISION_REPEATED"
    embedded.start_embedded_workers(1)
    assert (await asyncio.wait_for(session.follow(first).result(), TURN_S)).stop_reason == "end_turn"
    assert [amount for amount, _ in refunds.runs] == [7]


async def test_a_denial_is_the_result_the_model_reads(agent: Agent, refunds: Refunds, model: ScriptedModel) -> None:
    session = agent.session()
    [call] = (await asyncio.wait_for((await session.prompt("refund:99")).result(), TURN_S)).pending_calls
    accepted = await session.deny(call["id"], reason="over the limit")
    assert (await asyncio.wait_for(session.follow(accepted).result(), TURN_S)).stop_reason == "end_turn"
    assert refunds.runs == []
    assert any("over the limit" in text for text in tool_texts(model))


async def test_an_external_tool_takes_the_result_the_client_submits(agent: Agent, model: ScriptedModel) -> None:
    session = agent.session()
    [call] = (await asyncio.wait_for((await session.prompt("pick:*.txt")).result(), TURN_S)).pending_calls
    assert call["kind"] == "external"
    with pytest.raises(FxInputError) as wrong:
        await session.approve(call["id"])
    assert wrong.value.code == "FX_DECISION_INVALID"
    accepted = await session.submit_tool_result(call["id"], "notes.txt")
    assert (await asyncio.wait_for(session.follow(accepted).result(), TURN_S)).stop_reason == "end_turn"
    assert "notes.txt" in tool_texts(model)


async def test_a_prompt_waits_behind_a_parked_turn_and_runs_after_it(agent: Agent, refunds: Refunds) -> None:
    session = agent.session()
    [call] = (await asyncio.wait_for((await session.prompt("refund:3")).result(), TURN_S)).pending_calls
    behind = await session.prompt("after")
    state = await parked(agent, session.id)
    assert state.pending == 1 and not state.has_work
    await asyncio.sleep(0.5)  # a wake of the prompt ran nothing: it still waits (no event to await)
    state = await parked(agent, session.id)
    assert state.pending == 1
    await session.approve(call["id"])
    assert (await asyncio.wait_for(behind.result(), TURN_S)).stop_reason == "end_turn"
    assert [amount for amount, _ in refunds.runs] == [3]


async def test_a_cancel_ends_a_parked_turn_its_calls_denied(agent: Agent, refunds: Refunds) -> None:
    session = agent.session()
    turn = await session.prompt("refund:5")
    [call] = (await asyncio.wait_for(turn.result(), TURN_S)).pending_calls
    behind = await session.prompt("after")
    await session.cancel()
    assert (await asyncio.wait_for(behind.result(), TURN_S)).stop_reason == "end_turn"
    ends = [line for line in await stored_lines(agent, session.id)
            if line["type"] == "turn_end" and line["messageId"] == turn.message_id]
    assert [end["stopReason"] for end in ends] == ["cancelled"]
    with pytest.raises(FxInputError) as late:
        await session.approve(call["id"])
    assert late.value.code == "FX_DECISION_UNKNOWN_CALL"
    assert refunds.runs == []


async def test_parallel_calls_wait_together_and_each_decision_moves_one(agent: Agent, refunds: Refunds) -> None:
    session = agent.session()
    result = await asyncio.wait_for((await session.prompt("refund:1,2")).result(), TURN_S)
    first, second = result.pending_calls
    accepted = await session.approve(first["id"])
    again = await asyncio.wait_for(session.follow(accepted).result(), TURN_S)
    assert again.stop_reason == "paused" and [c["id"] for c in again.pending_calls] == [second["id"]]
    state = await parked(agent, session.id)
    assert state.paused_calls == (second["id"],)
    assert [amount for amount, _ in refunds.runs] == [1]
    accepted = await session.deny(second["id"], reason="one is enough")
    assert (await asyncio.wait_for(session.follow(accepted).result(), TURN_S)).stop_reason == "end_turn"
    assert [amount for amount, _ in refunds.runs] == [1]


async def test_decisions_for_no_waiting_call_are_refused(agent: Agent) -> None:
    session = agent.session()
    await (await session.prompt("hello")).result()
    with pytest.raises(FxInputError) as unknown:
        await session.approve("call_nope")
    assert unknown.value.code == "FX_DECISION_UNKNOWN_CALL"
    with pytest.raises(FxInputError) as bad:
        await session.approve("two\nlines")
    assert bad.value.code == "FX_DECISION_UNKNOWN_CALL"


async def test_the_turn_names_each_decision_and_who_made_it(agent: Agent) -> None:
    session = agent.session()
    [first, second] = (await asyncio.wait_for((await session.prompt("refund:1,2")).result(), TURN_S)).pending_calls
    await session.approve(first["id"], by="alice")
    await session.deny(second["id"], reason="not today", by="bob")
    await wait_idle(agent, session.id, timeout_s=TURN_S)
    decisions = [(line["id"], line["decision"], line.get("by"), line.get("reason"))
                 for line in await stored_lines(agent, session.id) if line["type"] == "approval_decision"]
    assert decisions == [(first["id"], "approve", "alice", None), (second["id"], "deny", "bob", "not today")]


async def test_the_timeline_shows_the_wait_its_decision_and_who_made_it(agent: Agent) -> None:
    from fxworker import timeline

    session = agent.session()
    turn = await session.prompt("refund:12")
    [call] = (await asyncio.wait_for(turn.result(), TURN_S)).pending_calls
    page = await timeline.read(agent.store, session.id)
    [parked_turn] = page["turns"]
    assert [part["how"] for part in parked_turn["deliveries"]] == ["paused"]
    [wait] = parked_turn["waits"]
    assert wait["id"] == call["id"] and wait["kind"] == "approval" and wait["decision"] is None
    assert wait["pausedAtMs"] is not None
    accepted = await session.approve(call["id"], by="carol")
    await asyncio.wait_for(session.follow(accepted).result(), TURN_S)
    [ended] = (await timeline.read(agent.store, session.id))["turns"]
    assert [part["how"] for part in ended["deliveries"]] == ["paused", "ended"]
    [wait] = ended["waits"]
    assert wait["decision"] == "approve" and wait["by"] == "carol"
    assert wait["waitedMs"] is not None and wait["waitedMs"] >= 0
    assert [(tool["name"], tool["outcome"]) for tool in ended["tools"]] == [("refund", "ran")]


@pytest.mark.parametrize("timeout_s", [0.5])
async def test_a_wait_past_its_timeout_is_denied_by_the_sweeper(model: ScriptedModel, refunds: Refunds,
                                                                timeout_s: float) -> None:
    with embedded_agent(model, agent_tools=refunds.tools, decision_timeout_s=timeout_s) as agent:
        session = agent.session()
        turn = await session.prompt("refund:8")
        [call] = (await asyncio.wait_for(turn.result(), TURN_S)).pending_calls
        await wait_idle(agent, session.id, timeout_s=TURN_S)  # the sweeper denied it; the turn went on
        ends = [line for line in await stored_lines(agent, session.id) if line["type"] == "turn_end"]
        assert [end["stopReason"] for end in ends] == ["end_turn"]
        decisions = [line for line in await stored_lines(agent, session.id) if line["type"] == "approval_decision"]
        assert [(d["decision"], d.get("by")) for d in decisions] == [("deny", "timeout")]
        assert any("no decision came within 0.5 s" in text for text in tool_texts(model))
        assert refunds.runs == []
        with pytest.raises(FxInputError) as late:
            await session.approve(call["id"])
        assert late.value.code == "FX_DECISION_EXPIRED"


async def test_a_parked_session_is_stored_as_one_at_rest(model: ScriptedModel, refunds: Refunds,
                                                         redis_url: str) -> None:
    """Its log and its turn's input wait in one `rest` value (no stream, no idempotency
    keys); a prompt sent behind it makes a new inbox, and the decision's claim puts the
    input back first: both turns run, in order."""
    import redis as redis_client

    from fxworker.keys import session_keys

    with embedded_agent(model, agent_tools=refunds.tools, redis_url=redis_url) as agent:
        raw = redis_client.Redis.from_url(redis_url)
        session = agent.session()
        turn = await session.prompt("refund:4")
        [call] = (await asyncio.wait_for(turn.result(), TURN_S)).pending_calls
        await parked(agent, session.id)
        keys = session_keys(agent.prefix, session.id)
        assert not raw.exists(keys.log, keys.inbox, keys.keys)
        rest = raw.get(keys.rest)
        assert rest is not None and b"i1" in rest and b"refund:4" in rest
        behind = await session.prompt("after")
        assert raw.xlen(keys.inbox) == 1 and raw.exists(keys.rest)
        await session.approve(call["id"])
        assert (await asyncio.wait_for(turn.result(), TURN_S)).stop_reason == "paused"  # the first follower's end
        assert (await asyncio.wait_for(behind.result(), TURN_S)).stop_reason == "end_turn"
        ends = [line["messageId"] for line in await stored_lines(agent, session.id) if line["type"] == "turn_end"]
        assert ends == [turn.message_id, behind.message_id]
        assert [amount for amount, _ in refunds.runs] == [4]


async def test_a_steer_sent_while_parked_joins_the_turn_when_it_resumes(agent: Agent, model: ScriptedModel) -> None:
    session = agent.session()
    turn = await session.prompt("refund:9")
    [call] = (await asyncio.wait_for(turn.result(), TURN_S)).pending_calls
    await session.steer("and say thanks")
    state = await parked(agent, session.id)
    assert state.pending == 1  # the steer waits with the parked turn
    accepted = await session.approve(call["id"])
    assert (await asyncio.wait_for(session.follow(accepted).result(), TURN_S)).stop_reason == "end_turn"
    lines = await stored_lines(agent, session.id)
    assert [line["text"] for line in lines if line["type"] == "user_message"] == ["and say thanks"]
    assert {line["messageId"] for line in lines if line["type"] in ("turn_start", "turn_end")} == {turn.message_id}


async def test_a_resume_of_a_parked_session_answers_its_pause(agent: Agent) -> None:
    session = agent.session()
    [call] = (await asyncio.wait_for((await session.prompt("refund:2")).result(), TURN_S)).pending_calls
    await parked(agent, session.id)  # released: until then it runs, and a resume follows what runs next
    resumed = await asyncio.wait_for((await session.resume()).result(), TURN_S)
    assert resumed.stop_reason == "paused" and [c["id"] for c in resumed.pending_calls] == [call["id"]]
