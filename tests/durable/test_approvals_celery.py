"""Turns that wait for a decision, on real processes (docs/design.md §6 "Paused turns").

Celery worker processes (`tests.durable.approval_agents`: the durable tools, with a
`refund` that can be held mid-run, and the worker's pid on each model request) and two
`fx web` processes, A and B, on the test Redis. A `refund` call waits for approval: its
turn parks (no lease, out of the ready set) until a decision comes, over HTTP through
either web process. Every real run of `refund` is recorded in the Redis list
`refunds_key(prefix)`; each test uses amounts of its own and counts its runs there.

Amounts 500-599 hold the model's answer after the refund's result (`hold("after-<n>")`),
so the resumed turn stays open while a test sends more decisions or kills its worker;
amounts of `HELD_FROM` (900) or more hold the refund itself while it runs.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call
from fxengine.tool_calls import AMBIGUOUS_RESULT
from tests.chaos.faults import (
    Pool,
    assert_no_stale_line,
    kill_and_time_resume,
    lines_of,
    pid_of,
    redis_list,
    redis_set,
    tool_results,
    turn_prompt,
    wait_line,
)
from tests.durable.approval_tooling import HELD_FROM, done_key, held_key, release_key
from tests.durable.conftest import responder
from tests.durable.tooling import refunds_key
from tests.support.stored import stored_records
from tests.support.workers import Workers, wait_until
from tests.web._server import WebProcess

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.timeout(120)]

LEASE_S = 2.0
TURN_S = 20.0  # a turn's end, a pause, a decision's effect
TAKEOVER_S = LEASE_S + 8.0  # a dead worker's turn resumed by another one
HTTP_S = 15.0
HOLD_AFTER = range(500, 600)


def approvals_responder(request: Any) -> Reply:
    """`refund:<a>[,<b>...]`: one refund call per amount in one response; after the
    results, "done" (or, for an amount of HOLD_AFTER, "partial ", a hold, "rest").
    Reads the turn's prompt past a resume notice. Anything else: the durable responder."""
    prompt, _ = turn_prompt(request)
    kind, _, arg = prompt.partition(":")
    if kind != "refund":
        return responder(request)
    amounts = [int(a) for a in arg.split(",")]
    if not tool_results(request):
        return Reply(*[tool_call(f"call_{uuid.uuid4().hex[:8]}", "refund", {"amount": a}) for a in amounts])
    held = [a for a in amounts if a in HOLD_AFTER]
    if held:
        return Reply(text("partial "), hold(f"after-{held[0]}"), text("rest"))
    return Reply(text("done"))


def _agents_env(model: ScriptedModel) -> dict[str, str]:
    """What a worker and a web process of this module read besides the store's place."""
    return {"FX_AGENTS": "tests.durable.approval_agents", "FX_TEST_MODEL_URL": model.base_url,
            "FX_LEASE_S": str(LEASE_S)}


@pytest.fixture(scope="module")
def pool(workers: Workers, model: ScriptedModel) -> Pool:
    model.responder = approvals_responder
    env = {**_agents_env(model), "FX_SWEEP_S": "0.5", "FX_RESERVE_S": "4", "FX_DELIVERY_TIMEOUT_S": "120"}
    p = Pool(workers, env, size=1, concurrency=8)
    p.fill()
    return p


@pytest.fixture
def live(pool: Pool) -> Pool:
    pool.fill()
    return pool


@pytest.fixture(scope="module")
def webs(redis_url: str, prefix: str, model: ScriptedModel) -> Iterator[tuple[WebProcess, WebProcess]]:
    env = {"REDIS_URL": redis_url, "FX_PREFIX": prefix, **_agents_env(model)}
    a = WebProcess(env=env)
    b = WebProcess(env=env)
    try:
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------------------- helpers


def on_client_loop(coro: Any, timeout_s: float = TURN_S) -> Any:
    """Runs `coro` on the loop of this process's blocking sessions (their store client)."""
    from fxworker.agent import _loop

    return _loop().run(coro, timeout_s=timeout_s)


def store_state(client: Any, session_id: str) -> Any:
    return on_client_loop(client.store.state(session_id))


def decide(web: WebProcess, session_id: str, call_id: str, body: dict[str, Any]) -> httpx.Response:
    """`POST /v1/sessions/{id}/calls/{call_id}` on `web`."""
    return httpx.post(f"{web.url}/v1/sessions/{session_id}/calls/{call_id}", json=body, timeout=HTTP_S)


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def refunds(redis_url: str, prefix: str, *amounts: int) -> list[tuple[str, int, int]]:
    """The real runs of `refund` for these amounts: (execution id, epoch, amount), in order."""
    runs = []
    for entry in redis_list(redis_url, refunds_key(prefix)):
        execution_id, epoch, amount = entry.split("|")
        if int(amount) in amounts:
            runs.append((execution_id, int(epoch), int(amount)))
    return runs


def requests_for(model: ScriptedModel, prompt: str) -> list[Any]:
    return [r for r in model.requests if turn_prompt(r)[0] == prompt]


def parked(client: Any, session_id: str, calls: int) -> Any:
    """The store's state once the session is parked with `calls` calls waiting."""
    def look() -> Any:
        state = store_state(client, session_id)
        return state if state.status == "paused" and len(state.paused_calls) == calls else None

    return wait_until(look, TURN_S, interval_s=0.05, what=f"{session_id} parked on {calls} call(s)")


def paused_turn(client: Any, prompt: str, calls: int = 1) -> tuple[Any, Any, list[dict[str, Any]]]:
    """A new session whose first turn, `prompt`, parked: (session, turn, its pending calls)."""
    agent = client.agents["default"]
    session = agent.blocking_session()
    turn = session.prompt(prompt)
    wait_line(agent, session.id, lambda ln: ln["type"] == "turn_pause", TURN_S, what=f"{prompt} parked")
    result = turn.result()
    assert result.stop_reason == "paused", result
    assert len(result.pending_calls) == calls
    assert all(c["name"] == "refund" and c["kind"] == "approval" for c in result.pending_calls)
    parked(client, session.id, calls)
    return session, turn, list(result.pending_calls)


def turn_ends(client: Any, session_id: str, turn_id: str) -> list[dict[str, Any]]:
    return [ln for ln in lines_of(client.agents["default"], session_id)
            if ln["type"] == "turn_end" and ln["messageId"] == turn_id]


def wait_end(client: Any, session_id: str, turn_id: str, timeout_s: float = TURN_S) -> dict[str, Any]:
    return wait_line(client.agents["default"], session_id,
                     lambda ln: ln["type"] == "turn_end" and ln["messageId"] == turn_id, timeout_s,
                     what=f"turn_end of {turn_id}")


def check_decision_lines(lines: list[dict[str, Any]], expected: dict[str, tuple[str, str | None]]) -> None:
    """Each call of `expected` (id -> (decision, by)) has one `approval_decision` line saying so."""
    seen = [ln for ln in lines if ln["type"] == "approval_decision"]
    assert sorted(ln["id"] for ln in seen) == sorted(expected), seen
    for line in seen:
        decision, by = expected[line["id"]]
        assert line["decision"] == decision and line.get("by") == by and line["name"] == "refund", line


def journal_has_in_order(redis_url: str, prefix: str, session_id: str, *kinds: bytes) -> bool:
    """True when the session's stored journal names `kinds` in this order (one batch record
    may hold several events, so the records' bytes are read as one)."""
    from fxworker.keys import session_keys

    r = redis.Redis.from_url(redis_url)
    try:
        stored = b"".join(fields.get(b"d", b"") for _, fields in stored_records(r, session_keys(prefix, session_id)))
    finally:
        r.close()
    at = 0
    for kind in kinds:
        at = stored.find(kind, at)
        if at < 0:
            return False
        at += len(kind)
    return True


def within(what: str, cond: Callable[[], object], timeout_s: float = TURN_S) -> Any:
    return wait_until(cond, timeout_s, interval_s=0.02, what=what)


# ----------------------------------------------------------------------------------- tests


def test_a_parked_turn_outlives_its_worker_and_an_approval_through_another_web_runs_it_once(
    live: Pool, webs: tuple[WebProcess, WebProcess], client: Any, model: ScriptedModel, redis_url: str, prefix: str
) -> None:
    web_a, web_b = webs
    agent = client.agents["default"]
    created = httpx.post(f"{web_a.url}/v1/sessions", json={"input": "refund:11"}, timeout=HTTP_S)
    assert created.status_code == 202, created.text
    session_id, turn_id = created.json()["sessionId"], created.json()["messageId"]
    pause = wait_line(agent, session_id, lambda ln: ln["type"] == "turn_pause", TURN_S, what="the turn parked")
    [request] = [ln for ln in lines_of(agent, session_id) if ln["type"] == "approval_request"]
    assert request["name"] == "refund" and request["input"] == {"amount": 11}
    assert pause["messageId"] == turn_id
    parker = live.by_pid(pid_of(requests_for(model, "refund:11")[-1]))

    parker.kill()
    state = parked(client, session_id, 1)
    assert state.lease_holder is None and state.paused_calls == (request["id"],) and state.decisions == 0
    info = httpx.get(f"{web_b.url}/v1/sessions/{session_id}", timeout=HTTP_S).json()
    assert info["status"] == "paused" and info["pendingCalls"] == [request["id"]]
    assert refunds(redis_url, prefix, 11) == []

    fresh = live.start()  # a new worker; the one that parked the turn is dead
    assert fresh.pid != parker.pid
    approved = decide(web_b, session_id, request["id"], {"type": "approve", "messageId": "approve-11"})
    assert approved.status_code == 202, approved.text
    body = approved.json()
    assert body["repeated"] is False and body["turnId"] == turn_id and body["callId"] == request["id"]

    end = wait_end(client, session_id, turn_id)
    assert end["stopReason"] == "end_turn"
    assert pid_of(requests_for(model, "refund:11")[-1]) != parker.pid
    [(execution_id, epoch, _)] = refunds(redis_url, prefix, 11)
    lines = lines_of(agent, session_id)
    assert_no_stale_line(lines)
    assert len(turn_ends(client, session_id, turn_id)) == 1
    [tool_end] = [ln for ln in lines if ln["type"] == "tool_end"]
    assert tool_end["id"] == request["id"] and tool_end["isError"] is False and tool_end["content"] == "refunded 11"
    assert epoch > pause["epoch"]
    check_decision_lines(lines, {request["id"]: ("approve", None)})
    within("the session idle", lambda: store_state(client, session_id).status == "idle")


def test_two_approvals_of_one_call_run_it_once_and_the_same_message_id_is_a_repeat(
    live: Pool, webs: tuple[WebProcess, WebProcess], client: Any, model: ScriptedModel, redis_url: str, prefix: str
) -> None:
    from fxengine.errors import FxInputError

    web_a, web_b = webs
    session, turn, [call] = paused_turn(client, "refund:521")
    first = decide(web_a, session.id, call["id"], {"type": "approve", "messageId": "first-521"})
    assert first.status_code == 202 and first.json()["repeated"] is False, first.text
    # The turn took the decision and ran the refund; its model step is held, so it is open.
    model.wait_held("after-521", timeout_s=TURN_S)
    assert len(refunds(redis_url, prefix, 521)) == 1

    second = decide(web_b, session.id, call["id"], {"type": "approve", "messageId": "second-521"})
    assert second.status_code == 409 and error_code(second) == "FX_DECISION_REPEATED", second.text
    with pytest.raises(FxInputError) as library:
        session.approve(call["id"], message_id="third-521")
    assert library.value.code == "FX_DECISION_REPEATED"
    same = decide(web_b, session.id, call["id"], {"type": "approve", "messageId": "first-521"})
    assert same.status_code == 202 and same.json()["repeated"] is True, same.text
    assert same.json()["turnId"] == turn.message_id

    model.release("after-521")
    end = wait_end(client, session.id, turn.message_id)
    assert end["stopReason"] == "end_turn"
    after = decide(web_a, session.id, call["id"], {"type": "approve", "messageId": "first-521"})
    assert after.status_code == 202 and after.json()["repeated"] is True, after.text
    # Its turn ended: the first decision stood, and a later one is told so.
    late = decide(web_a, session.id, call["id"], {"type": "approve", "messageId": "late-521"})
    assert late.status_code == 409 and error_code(late) == "FX_DECISION_REPEATED", late.text
    assert len(refunds(redis_url, prefix, 521)) == 1
    assert len(turn_ends(client, session.id, turn.message_id)) == 1
    check_decision_lines(lines_of(client.agents["default"], session.id), {call["id"]: ("approve", None)})


def test_a_denial_is_the_tool_result_the_model_reads_and_the_refund_never_runs(
    live: Pool, webs: tuple[WebProcess, WebProcess], client: Any, model: ScriptedModel, redis_url: str, prefix: str
) -> None:
    web_a, _ = webs
    reason = "over the limit for this customer"
    session, turn, [call] = paused_turn(client, "refund:33")
    asked = len(requests_for(model, "refund:33"))
    denied = decide(web_a, session.id, call["id"], {"type": "deny", "reason": reason})
    assert denied.status_code == 202 and denied.json()["repeated"] is False, denied.text
    end = wait_end(client, session.id, turn.message_id)
    assert end["stopReason"] == "end_turn"

    requests = requests_for(model, "refund:33")
    assert len(requests) == asked + 1
    tool_messages = [m for m in requests[-1].body["messages"] if m.get("role") == "tool"]
    assert len(tool_messages) == 1 and tool_messages[0]["tool_call_id"] == call["id"]
    assert reason in str(tool_messages[0]["content"])
    assert refunds(redis_url, prefix, 33) == []
    lines = lines_of(client.agents["default"], session.id)
    [tool_end] = [ln for ln in lines if ln["type"] == "tool_end"]
    assert tool_end["id"] == call["id"] and reason in str(tool_end["content"])
    assert len(turn_ends(client, session.id, turn.message_id)) == 1
    check_decision_lines(lines, {call["id"]: ("deny", None)})
    [line] = [ln for ln in lines if ln["type"] == "approval_decision"]
    assert line["reason"] == reason and line["messageId"] == turn.message_id


def test_two_web_processes_approving_at_once_give_one_acceptance_and_one_run(
    live: Pool, webs: tuple[WebProcess, WebProcess], client: Any, model: ScriptedModel, redis_url: str, prefix: str
) -> None:
    session, turn, [call] = paused_turn(client, "refund:544")
    start = threading.Barrier(2, timeout=10)

    def approve(web: WebProcess, message_id: str) -> httpx.Response:
        start.wait()
        return decide(web, session.id, call["id"], {"type": "approve", "messageId": message_id})

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(approve, webs, ("via-a-544", "via-b-544")))
    by_status = sorted(answers, key=lambda r: r.status_code)
    assert [r.status_code for r in by_status] == [202, 409], [r.text for r in answers]
    assert by_status[0].json()["repeated"] is False
    assert error_code(by_status[1]) == "FX_DECISION_REPEATED"

    model.wait_held("after-544", timeout_s=TURN_S)
    model.release("after-544")
    end = wait_end(client, session.id, turn.message_id)
    assert end["stopReason"] == "end_turn"
    assert len(refunds(redis_url, prefix, 544)) == 1
    assert len(turn_ends(client, session.id, turn.message_id)) == 1


def test_a_worker_killed_after_the_approved_refund_ran_resumes_without_running_it_again(
    live: Pool, webs: tuple[WebProcess, WebProcess], client: Any, model: ScriptedModel, redis_url: str, prefix: str
) -> None:
    agent = client.agents["default"]
    session, turn, [call] = paused_turn(client, "refund:555")
    approved = decide(webs[0], session.id, call["id"], {"type": "approve"})
    assert approved.status_code == 202, approved.text
    model.wait_held("after-555", timeout_s=TURN_S)
    # The refund's result is stored before the model step that is held now.
    within("the result stored", lambda: journal_has_in_order(
        redis_url, prefix, session.id, b"tool_approved", b"tool_result", b"model_request"))
    wait_line(agent, session.id, lambda ln: ln["type"] == "tool_end", 5, what="the refund's tool_end")
    victim = live.by_pid(pid_of(requests_for(model, "refund:555")[-1]))
    live.fill(spare=1)  # a worker to take over is up before the kill
    before = lines_of(agent, session.id)[-1]["cursor"]
    elapsed_s, resumed = kill_and_time_resume(victim, agent, session.id, before, TAKEOVER_S)
    model.release("after-555")
    print(f"kill -9 after the approved refund ran → turn_resume: {elapsed_s:.2f} s")

    end = wait_end(client, session.id, turn.message_id)
    assert end["stopReason"] == "end_turn"
    assert resumed["interrupted"] is True and resumed["messageId"] == turn.message_id
    assert len(refunds(redis_url, prefix, 555)) == 1
    lines = lines_of(agent, session.id)
    assert_no_stale_line(lines)
    assert len(turn_ends(client, session.id, turn.message_id)) == 1
    ends = [ln for ln in lines if ln["type"] == "tool_end"]
    assert [(e["id"], e["isError"], e["content"]) for e in ends] == [(call["id"], False, "refunded 555")]
    assert all("may have partly run" not in r for req in requests_for(model, "refund:555") for r in tool_results(req))
    assert [ln["type"] for ln in lines].count("approval_request") == 1


def test_a_worker_killed_while_the_approved_refund_runs_never_reruns_it_and_tells_the_model(
    live: Pool, webs: tuple[WebProcess, WebProcess], client: Any, model: ScriptedModel, redis_url: str, prefix: str
) -> None:
    agent = client.agents["default"]
    amount = HELD_FROM + 77
    session, turn, [call] = paused_turn(client, f"refund:{amount}")
    approved = decide(webs[1], session.id, call["id"], {"type": "approve"})
    assert approved.status_code == 202, approved.text
    [held] = within("the refund running", lambda: redis_list(redis_url, held_key(amount, prefix)))
    execution_id, pid = held.split("|")
    victim = live.by_pid(int(pid))
    live.fill(spare=1)
    before = lines_of(agent, session.id)[-1]["cursor"]
    elapsed_s, resumed = kill_and_time_resume(victim, agent, session.id, before, TAKEOVER_S)
    # Released now: a rerun would run to its end and show in the done list.
    redis_set(redis_url, release_key(amount, prefix))
    print(f"kill -9 while the approved refund ran → turn_resume: {elapsed_s:.2f} s")

    end = wait_end(client, session.id, turn.message_id)
    assert end["stopReason"] == "end_turn"
    assert resumed["interrupted"] is True
    assert [run[0] for run in refunds(redis_url, prefix, amount)] == [execution_id]
    assert redis_list(redis_url, done_key(amount, prefix)) == []
    lines = lines_of(agent, session.id)
    assert_no_stale_line(lines)
    assert len(turn_ends(client, session.id, turn.message_id)) == 1
    ends = [ln for ln in lines if ln["type"] == "tool_end"]
    assert len(ends) == 1 and ends[0]["id"] == call["id"] and ends[0]["isError"] is True
    assert ends[0]["content"] == AMBIGUOUS_RESULT
    told = requests_for(model, f"refund:{amount}")[-1]
    assert tool_results(told) == [AMBIGUOUS_RESULT]
    assert "may have partly run" in AMBIGUOUS_RESULT


def test_parallel_calls_one_approved_through_one_web_one_denied_through_the_other(
    live: Pool, webs: tuple[WebProcess, WebProcess], client: Any, model: ScriptedModel, redis_url: str, prefix: str
) -> None:
    web_a, web_b = webs
    session, turn, calls = paused_turn(client, "refund:61,62", calls=2)
    by_amount = {c["input"]["amount"]: c for c in calls}
    state = store_state(client, session.id)
    assert sorted(state.paused_calls) == sorted(c["id"] for c in calls) and state.lease_holder is None
    approved = decide(web_a, session.id, by_amount[61]["id"], {"type": "approve"})
    denied = decide(web_b, session.id, by_amount[62]["id"], {"type": "deny", "reason": "one is enough"})
    assert (approved.status_code, denied.status_code) == (202, 202), (approved.text, denied.text)
    assert approved.json()["turnId"] == denied.json()["turnId"] == turn.message_id

    end = wait_end(client, session.id, turn.message_id)
    assert end["stopReason"] == "end_turn"
    assert [run[2] for run in refunds(redis_url, prefix, 61, 62)] == [61]
    lines = lines_of(client.agents["default"], session.id)
    assert len(turn_ends(client, session.id, turn.message_id)) == 1
    ends = {ln["id"]: ln for ln in lines if ln["type"] == "tool_end"}
    assert set(ends) == {by_amount[61]["id"], by_amount[62]["id"]}
    assert ends[by_amount[61]["id"]]["content"] == "refunded 61" and not ends[by_amount[61]["id"]]["isError"]
    assert "one is enough" in str(ends[by_amount[62]["id"]]["content"])
    last = requests_for(model, "refund:61,62")[-1]
    results = tool_results(last)
    assert len(results) == 2 and "refunded 61" in results and any("one is enough" in r for r in results)
    check_decision_lines(lines, {by_amount[61]["id"]: ("approve", None), by_amount[62]["id"]: ("deny", None)})
    assert store_state(client, session.id).paused_calls == ()



def test_a_cancel_through_a_web_process_ends_a_parked_turn_and_the_prompt_behind_it_runs(
    live: Pool, webs: tuple[WebProcess, WebProcess], client: Any, redis_url: str, prefix: str
) -> None:
    web_a, web_b = webs
    session, turn, [call] = paused_turn(client, "refund:71")
    behind = session.prompt("after the refund")
    state = parked(client, session.id, 1)
    assert state.pending == 1 and state.lease_holder is None and not state.has_work
    cancelled = httpx.post(f"{web_b.url}/v1/sessions/{session.id}/cancel", json={}, timeout=HTTP_S)
    assert cancelled.status_code == 202, cancelled.text

    assert wait_end(client, session.id, turn.message_id)["stopReason"] == "cancelled"
    assert wait_end(client, session.id, behind.message_id)["stopReason"] == "end_turn"
    assert refunds(redis_url, prefix, 71) == []
    assert len(turn_ends(client, session.id, turn.message_id)) == 1
    late = decide(web_a, session.id, call["id"], {"type": "approve"})
    assert late.status_code == 409 and error_code(late) == "FX_DECISION_UNKNOWN_CALL", late.text
    within("the session idle", lambda: store_state(client, session.id).status == "idle")
    assert refunds(redis_url, prefix, 71) == []
