"""Delivery deadlines on real Celery workers (§6, §11.6): `FX_DELIVERY_TIMEOUT_S=5`,
`FX_RESERVE_S=2`, so each delivery yields before a model request after 3 s and cuts off
whatever still runs at 4 s.

A slow turn yields and resumes across deliveries and completes, the model told nothing;
a step that always outlasts a delivery is cut off 3 times in a row and then not run
again: a tool call is answered as possibly run, a model request cancels the turn.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.faults import (
    RESUME_NOTICE_PREFIX,
    events_of,
    Pool,
    assert_no_stale_line,
    fault_env,
    lines_of,
    redis_list,
    requests_for,
    responder,
    text_without_retracted,
)
from tests.chaos.tooling import starts_key

pytestmark = [pytest.mark.redis, pytest.mark.celery]

DELIVERY_S = 5.0
RESERVE_S = 2.0


@pytest.fixture(scope="module")
def pool(workers: Any, model: Any) -> Pool:
    model.responder = responder
    env = fault_env(model, FX_DELIVERY_TIMEOUT_S=str(DELIVERY_S), FX_RESERVE_S=str(RESERVE_S))
    p = Pool(workers, env, size=1)
    p.fill()
    return p


def _types(lines: list[dict[str, Any]]) -> list[str]:
    return [ln["type"] for ln in lines]


def test_a_slow_turn_yields_and_resumes_across_deliveries_and_completes(
    pool: Pool, client: Any, model: Any, redis_url: str, prefix: str
) -> None:
    agent = client.agents["default"]
    session = agent.blocking_session()
    prompt = "chain:8:400"  # 9 model requests of 0.4 s: more than one delivery's 3 s
    result = session.prompt(prompt).result()
    assert result.stop_reason == "end_turn"
    lines = lines_of(agent, session.id)
    assert_no_stale_line(lines)
    types = _types(lines)
    assert types.count("turn_yield") >= 1
    resumes = [ln for ln in lines if ln["type"] == "turn_resume"]
    assert len(resumes) == types.count("turn_yield")
    assert all(r["interrupted"] is False and not r.get("retract") for r in resumes)
    assert text_without_retracted(lines) == "chained"
    # Soft stops only: every probe ran once, and the model was never told anything.
    probes = [ln["input"]["name"] for ln in lines if ln["type"] == "tool_start"]
    assert len(probes) == 8
    assert all(len(redis_list(redis_url, starts_key(n, prefix))) == 1 for n in probes)
    requests = requests_for(model, prompt)
    assert len(requests) == 9
    assert not any(RESUME_NOTICE_PREFIX in str(r.body["messages"]) for r in requests)
    print(f"a 9-step turn over {len(resumes) + 1} deliveries of {DELIVERY_S:.0f} s")


def test_a_model_request_that_always_outlasts_a_delivery_is_cut_off_three_times_then_cancelled(
    pool: Pool, client: Any, model: Any, redis_url: str, prefix: str
) -> None:
    agent = client.agents["default"]
    session = agent.blocking_session()
    turn = session.prompt("stuck:")
    result = turn.result()
    assert result.stop_reason == "cancelled"
    assert result.error is not None and result.error["code"] == "FX_DEADLINE_CUTOFFS"
    assert len(requests_for(model, "stuck:")) == 3
    lines = lines_of(agent, session.id)
    assert_no_stale_line(lines)
    assert _types(lines).count("turn_yield") == 3
    # The diagnostic counts the cut-offs of the one step: 1, 2, 3.
    deadlines = [e for e in events_of(redis_url, prefix) if e["type"] == "session.deadline" and e["sessionId"] == session.id]
    assert [e["cutoffs"] for e in deadlines] == [1, 2, 3]
    # The session goes on.
    after = session.prompt("after the cut-offs")
    assert after.result().stop_reason == "end_turn"


def test_a_tool_call_that_always_outlasts_a_delivery_is_cut_off_three_times_then_answered(
    pool: Pool, client: Any, model: Any
) -> None:
    agent = client.agents["default"]
    session = agent.blocking_session()
    turn = session.prompt("slowtool:")
    result = turn.result()
    assert result.stop_reason == "end_turn"
    lines = lines_of(agent, session.id)
    assert_no_stale_line(lines)
    assert _types(lines).count("turn_yield") == 3
    ends = [ln for ln in lines if ln["type"] == "tool_end"]
    assert len(ends) == 1 and ends[0]["isError"] is True and "may have partly run" in ends[0]["content"]
    # The idempotent call ran in the first three deliveries, and not in the fourth.
    assert _types(lines).count("tool_start") == 3
    assert text_without_retracted(lines) == "done"
