"""Agents that call agents on real processes (docs/design.md §6 "Delegated turns").

Celery worker processes (`fx worker`'s Celery app, `tests.durable.delegation_agents`:
agents `triage`, `billing` and `looper`, each process knowing all three) on the test
Redis, each consuming the queues a test gives it (`fx.triage`, `fx.billing`, `fx.looper`).
A `triage` turn's calls of its `billing` tool park it (no worker held) and prompt turns of
`billing` in sessions of their own, run by whichever worker consumes `fx.billing`; their
ends answer the calls and the parent resumes on whichever worker takes its wake. Every
real run of `charge` (billing's non-idempotent tool) is recorded in the Redis list
`charges_key(prefix)`; model requests carry their worker's pid (`x-fx-pid`).

Each test has a key prefix, workers and client agents of its own (`Stack`), so it can
kill workers, or run with one worker only, without another test's workers taking its wakes.
A worker started with `FX_TEST_AT_CHILDREN` faults at the instant a parking turn prompts
its children (killed just before or after, or its loop stalled just after). The embedded-store tests of delegation are in
tests/durable/test_delegation.py.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call, usage
from tests.chaos.faults import (
    assert_no_stale_line,
    lines_of,
    pid_of,
    redis_list,
    redis_set,
    tool_results,
    turn_prompt,
    wait_line,
)
from tests.durable.conftest import Client
from fxengine.tool_calls import AMBIGUOUS_RESULT
from tests.durable.delegation_tooling import (
    LOOPER_MAX_DEPTH,
    charge_done_key,
    charge_release_key,
    charges_key,
)
from tests.support.redis_server import delete_prefix
from tests.support.workers import CeleryWorker, Workers, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.timeout(120)]

LEASE_S = 2.0
TURN_S = 20.0  # a turn's end, a pause
TAKEOVER_S = LEASE_S + 13.0  # a dead worker's turn resumed by a new one (its start included)
RESUME_S = 10.0  # a parked parent whose children have answered, resumed and ended
# Longer than the wake trust window (SENDER_TRUST_MS, 10 s) and a sweep: the sweeper wakes
# the children of a parent whose worker stalls before storing its pause.
SWEPT_STALL_S = 14.0
CANCEL_BOUND_S = 1.0  # cancel of the parent -> a child's `turn_end` (`cancelled`)


def _system(request: Any) -> str:
    for message in request.body.get("messages") or []:
        if message.get("role") == "system":
            content = message.get("content")
            return content if isinstance(content, str) else str(content)
    return ""


def call_id(task: str) -> str:
    """The id of triage's call of `billing` for `task` (so a test can name the child)."""
    return "call_" + hashlib.sha256(task.encode()).hexdigest()[:8]


def responder(request: Any) -> Reply:
    """Driven by the agent (its instructions name it) and the turn's prompt (read past a
    resume notice):

    - triage: `ask:<a>|<b>...` calls `billing` once per task (`call_id(task)`), in one response; after the
      results, "answer: <result> + <result>";
    - billing: `hold:<name>` streams "working ", waits for `model.release(name)`, then
      "billed <name>"; `charge:<amount>:<name>` calls `charge`, and after its result
      streams "working ", holds `<name>`, then "billed <name> after <result>"; anything
      else, "billed <prompt>";
    - looper: calls `looper` (itself); after the result, "gave up: <result>".
    """
    system = _system(request)
    prompt, _ = turn_prompt(request)
    results = tool_results(request)
    if "triage" in system:
        if results:
            return Reply(text("answer: " + " + ".join(results)), usage(5, 3))
        tasks = prompt[4:].split("|") if prompt.startswith("ask:") else [prompt]
        return Reply(*[tool_call(call_id(t), "billing", {"input": t}) for t in tasks], usage(7, 2))
    if "looper" in system:
        if results:
            return Reply(text("gave up: " + results[-1]))
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "looper", {"input": "loop"}))
    kind, _, arg = prompt.partition(":")
    if kind == "hold":
        return Reply(text("working "), hold(arg), text(f"billed {arg}"), usage(11, 4))
    if kind == "charge":
        amount, _, name = arg.partition(":")
        if not results:
            return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "charge", {"amount": int(amount)}))
        return Reply(text("working "), hold(name), text(f"billed {name} after {results[-1]}"), usage(11, 4))
    return Reply(text(f"billed {prompt}"), usage(11, 4))


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


class Stack:
    """One test's prefix, its worker processes and this process's agents on them."""

    def __init__(self, redis_url: str, model: ScriptedModel) -> None:
        self.redis_url = redis_url
        self.model = model
        self.prefix = f"fxd{uuid.uuid4().hex[:10]}"
        self.workers = Workers(redis_url=redis_url, prefix=self.prefix)
        self.client = Client(redis_url, self.prefix, model, ("triage", "billing", "looper"))

    def start(self, *queues: str, concurrency: int = 8, env: dict[str, str] | None = None) -> CeleryWorker:
        """A worker consuming the queues of `queues` (agent names), ready."""
        return self.workers.start(queues=queues, concurrency=concurrency, env={
            "FX_AGENTS": "tests.durable.delegation_agents", "FX_TEST_MODEL_URL": self.model.base_url,
            "FX_LEASE_S": str(LEASE_S), "FX_SWEEP_S": "0.5", "FX_RESERVE_S": "4", **(env or {})})

    def agent(self, name: str) -> Any:
        return self.client.agents[name]

    def lines(self, agent: str, session_id: str) -> list[dict[str, Any]]:
        return lines_of(self.agent(agent), session_id)

    def wait_end(self, agent: str, session_id: str, timeout_s: float = TURN_S) -> dict[str, Any]:
        return wait_line(self.agent(agent), session_id, lambda ln: ln["type"] == "turn_end", timeout_s,
                         what=f"the turn_end of {agent} session {session_id}")

    def wait_pause(self, agent: str, session_id: str) -> dict[str, Any]:
        return wait_line(self.agent(agent), session_id, lambda ln: ln["type"] == "turn_pause", TURN_S,
                         what=f"{session_id} parked")

    def charges(self) -> list[list[str]]:
        """The real runs of `charge`: [execution id, epoch, amount, pid] each, in order."""
        return [entry.split("|") for entry in redis_list(self.redis_url, charges_key(self.prefix))]

    def close(self) -> None:
        self.workers.close()
        self.client.close()
        delete_prefix(self.redis_url, self.prefix)


@pytest.fixture
def stack(redis_url: str, model: ScriptedModel) -> Iterator[Stack]:
    s = Stack(redis_url, model)
    try:
        yield s
    finally:
        s.close()


def of_type(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [ln for ln in lines if ln["type"] == kind]


def turn_text(lines: list[dict[str, Any]]) -> str:
    return "".join(ln["delta"] for ln in of_type(lines, "text_delta"))


def prompted(model: ScriptedModel, prompt: str, agent: str) -> list[Any]:
    """The model requests of `agent`'s turns whose prompt is `prompt`, in order."""
    return [r for r in model.requests if turn_prompt(r)[0] == prompt and agent in _system(r)]


def on_client_loop(coro: Any, timeout_s: float = TURN_S) -> Any:
    """Runs `coro` on the loop of this process's blocking sessions (their store client)."""
    from fxworker.agent import _loop

    return _loop().run(coro, timeout_s=timeout_s)


def tag() -> str:
    return uuid.uuid4().hex[:8]


# ----------------------------------------------------------------------------------- tests


def test_two_children_on_another_queue_outlive_kill_9_of_the_parents_and_the_childrens_workers(
    stack: Stack, model: ScriptedModel
) -> None:
    """A `triage` turn (its worker consumes only fx.triage) delegates two calls in one
    response to `billing` (its worker consumes only fx.billing) and parks. With both
    children mid-turn (their model replies held; one has run `charge`), kill -9 of the
    parent's worker and of the children's: new workers resume each child once, where it
    was (the charge is not run again), each child's end answers its call once, and the
    parent resumes once, on the new triage worker, and ends with both answers."""
    parents_worker = stack.start("triage")
    childrens_worker = stack.start("billing")
    a, b = f"a{tag()}", f"b{tag()}"
    first, second = f"hold:{a}", f"charge:7:{b}"
    parent = stack.agent("triage").blocking_session()
    turn = parent.prompt(f"ask:{first}|{second}")
    pause = stack.wait_pause("triage", parent.id)
    model.wait_held(a, timeout_s=TURN_S)
    model.wait_held(b, timeout_s=TURN_S)

    lines = stack.lines("triage", parent.id)
    starts = of_type(lines, "delegate_start")
    assert len(starts) == 2, starts
    assert sorted(c["id"] for c in pause["pendingCalls"]) == sorted(s["callId"] for s in starts)
    assert all(s["agent"] == "billing" and s["depth"] == 1 and s["sessionId"] != parent.id for s in starts)
    assert len({s["sessionId"] for s in starts}) == 2
    assert [pid_of(r) for r in prompted(model, f"ask:{first}|{second}", "triage")] == [parents_worker.pid]
    assert {pid_of(r) for p in (first, second) for r in prompted(model, p, "billing")} == {childrens_worker.pid}
    [charge] = stack.charges()
    assert charge[2:] == ["7", str(childrens_worker.pid)]
    children: dict[str, dict[str, Any]] = {}
    for start in starts:
        [child_start] = of_type(stack.lines("billing", start["sessionId"]), "turn_start")
        assert child_start["messageId"] == start["childMessageId"]
        children[start["sessionId"]] = start

    parents_worker.kill()
    childrens_worker.kill()
    new_parents = stack.start("triage")
    new_childrens = stack.start("billing")
    # Each child resumes on the new billing worker and asks the model again (held again).
    wait_until(lambda: all(any(pid_of(r) == new_childrens.pid for r in prompted(model, p, "billing"))
                           for p in (first, second)), TAKEOVER_S, interval_s=0.05,
               what="both children resumed on the new billing worker")
    model.release(a)
    model.release(b)

    end = stack.wait_end("triage", parent.id, TAKEOVER_S)
    assert end["stopReason"] == "end_turn", end
    result = turn.result()
    assert result.stop_reason == "end_turn", result
    lines = stack.lines("triage", parent.id)
    assert_no_stale_line(lines)
    assert len(of_type(lines, "turn_end")) == 1
    assert len(of_type(lines, "delegate_start")) == 2, "a second start of the children is the store's repeat"
    delegate_ends = of_type(lines, "delegate_end")
    assert sorted(e["callId"] for e in delegate_ends) == sorted(s["callId"] for s in starts)
    assert all(e["stopReason"] == "end_turn" and e["agent"] == "billing" and "error" not in e for e in delegate_ends)
    assert {e["sessionId"] for e in delegate_ends} == set(children)
    final = turn_text(lines)
    assert f"billed {a}" in final and f"billed {b} after charged 7" in final, final
    # The parent asked the model twice: its first step, and once after both answers.
    asks = prompted(model, f"ask:{first}|{second}", "triage")
    assert [len(tool_results(r)) for r in asks] == [0, 2]
    assert pid_of(asks[-1]) == new_parents.pid
    tool_ends = of_type(lines, "tool_end")
    assert sorted(t["id"] for t in tool_ends) == sorted(s["callId"] for s in starts)
    assert all(t["isError"] is False for t in tool_ends), tool_ends

    for child_id in children:
        child_lines = stack.lines("billing", child_id)
        assert_no_stale_line(child_lines)
        [child_end] = of_type(child_lines, "turn_end")
        assert child_end["stopReason"] == "end_turn", child_end
        assert child_end["epoch"] > child_lines[0]["epoch"], "the end came from the new worker"
        assert [ln["interrupted"] for ln in of_type(child_lines, "turn_resume")] == [True]
    assert stack.charges() == [charge], "the charge ran once, before the kill"
    assert sum(e["usage"].get("inputTokens", 0) for e in delegate_ends) == result.delegated_usage.get("inputTokens")


def test_a_child_whose_worker_dies_mid_charge_is_not_charged_again_and_its_parent_ends_once(
    stack: Stack, model: ScriptedModel
) -> None:
    """One child runs `charge` (not idempotent, held mid-run), the other ends at once (so
    the parent resumes with one answer of two and parks again). kill -9 of the billing
    worker mid-charge: a new one resumes the child, which never runs the charge again (its
    model reads that it may have partly run) and ends once; its answer resumes the parent
    once more, which ends with both answers."""
    stack.start("triage")
    billing = stack.start("billing")
    n, plain = f"n{tag()}", f"p{tag()}"
    charged = f"charge:950:{n}"
    parent = stack.agent("triage").blocking_session()
    parent.prompt(f"ask:{charged}|{plain}")
    stack.wait_pause("triage", parent.id)
    [run] = wait_until(stack.charges, TURN_S, what="the charge started")  # type: ignore[misc]
    assert run[2:] == ["950", str(billing.pid)]
    starts = {s["sessionId"]: s for s in of_type(stack.lines("triage", parent.id), "delegate_start")}
    [charging] = [sid for sid in starts
                  if [ln["input"] for ln in of_type(stack.lines("billing", sid), "turn_start")] == [charged]]
    wait_line(stack.agent("triage"), parent.id, lambda ln: ln["type"] == "delegate_end", TURN_S,
              what="the plain child's answer taken")
    model.release(n)  # the charging child's answer, once it reads its charge's result, is not held

    billing.kill()
    redis_set(stack.redis_url, charge_release_key(950, stack.prefix))  # a rerun would now finish
    stack.start("billing")
    end = stack.wait_end("triage", parent.id, TAKEOVER_S)
    assert end["stopReason"] == "end_turn", end

    assert stack.charges() == [run], "the charge never ran again"
    assert redis_list(stack.redis_url, charge_done_key(950, stack.prefix)) == [], "the one run was cut"
    child_lines = stack.lines("billing", charging)
    assert_no_stale_line(child_lines)
    [tool_end] = of_type(child_lines, "tool_end")
    assert tool_end["isError"] is True and tool_end["content"] == AMBIGUOUS_RESULT, tool_end
    assert [ln["stopReason"] for ln in of_type(child_lines, "turn_end")] == ["end_turn"]
    lines = stack.lines("triage", parent.id)
    assert_no_stale_line(lines)
    assert len(of_type(lines, "turn_end")) == 1 and len(of_type(lines, "delegate_start")) == 2
    ends = of_type(lines, "delegate_end")
    assert sorted(e["sessionId"] for e in ends) == sorted(starts) and all(e["stopReason"] == "end_turn" for e in ends)
    final = turn_text(lines)
    assert f"billed {plain}" in final and f"billed {n} after " in final, final
    asks = prompted(model, f"ask:{charged}|{plain}", "triage")
    assert [len(tool_results(r)) for r in asks] == [0, 2], "the parent's model read both answers, once"


@pytest.mark.parametrize("fault", ["die-before", "die-after"])
def test_a_parent_worker_killed_as_it_prompts_its_children_leaves_one_child_per_call(
    stack: Stack, model: ScriptedModel, fault: str
) -> None:
    """The parent's worker is killed -9 just before, or just after, it prompts its children
    as its turn parks (`FX_TEST_AT_CHILDREN`): the worker that takes the parent over
    leaves one child per call (no second child whose work is done again: the charge runs
    once), and the parent ends with both answers, its model asked once after them. (The
    calls were stored before the children were prompted: the held calls' record is durable
    before the turn goes on, so the next worker resumes the same calls.)"""
    dying = stack.start("triage", env={"FX_TEST_AT_CHILDREN": fault})
    stack.start("billing")
    n, plain = f"k{tag()}", f"q{tag()}"
    model.release(n)  # the charging child's answer is not held
    prompt = f"ask:charge:8:{n}|{plain}"
    parent = stack.agent("triage").blocking_session()
    parent.prompt(prompt)
    wait_until(lambda: dying.proc is not None and dying.proc.poll() is not None, TURN_S, interval_s=0.02,
               what=f"the parent's worker killed ({fault})")
    assert dying.proc is not None and dying.proc.returncode == -9, dying.log_tail()
    stack.start("triage")
    end = stack.wait_end("triage", parent.id, TAKEOVER_S)
    assert end["stopReason"] == "end_turn", end

    lines = stack.lines("triage", parent.id)
    assert_no_stale_line(lines)
    asks = prompted(model, prompt, "triage")
    charged = [c for c in stack.charges() if c[2] == "8"]
    children_asked = prompted(model, f"charge:8:{n}", "billing") + prompted(model, plain, "billing")
    print(f"{fault}: parent model requests (tool results each): {[len(tool_results(r)) for r in asks]}; "
          f"charges: {len(charged)}; children's model requests: {len(children_asked)}; "
          f"delegate_start lines: {len(of_type(lines, 'delegate_start'))}")
    assert len(charged) == 1, charged
    assert len(children_asked) == 3, "one turn per child: the charging one asked twice, the other once"
    assert [len(tool_results(r)) for r in asks][-1:] == [2] and len(asks) <= 3, "once after both answers"
    starts = of_type(lines, "delegate_start")
    ends = of_type(lines, "delegate_end")
    assert {e["sessionId"] for e in ends} == {s["sessionId"] for s in starts} and len(ends) == 2
    final = turn_text(lines)
    assert f"billed {plain}" in final and f"billed {n} after charged 8" in final, final


def test_children_that_answer_before_their_parents_pause_is_stored_are_not_lost(
    stack: Stack, model: ScriptedModel
) -> None:
    """The parent's worker stalls (its event loop blocked, `SWEPT_STALL_S`) just after
    prompting its children, before it stores the record that parks the parent. Its worker
    wakes the children only once that record is stored, but their prompts are ready: once
    the wake trust window has passed the sweeper wakes them, and both answer during the
    stall. Their answers, refused while no call waits, are sent again while the parent's
    turn is open and unparked (each child's end waits for its answer), and taken once it
    parks: the children end, and the parent ends with both."""
    from fxworker.delegation import child_session_id, delegate_tool

    stack.start("triage", env={"FX_TEST_AT_CHILDREN": "stall-after", "FX_TEST_STALL_S": str(SWEPT_STALL_S),
                               "FX_LEASE_S": "30"})
    stack.start("billing")
    x, y = f"s{tag()}", f"r{tag()}"
    parent = stack.agent("triage").blocking_session()
    t0 = time.monotonic()
    turn = parent.prompt(f"ask:{x}|{y}")
    tool = delegate_tool("billing", name="billing", description="")
    children = [child_session_id(parent.id, tool, f"{parent.id}:{turn.message_id}:1:{call_id(task)}")
                for task in (x, y)]
    wait_until(lambda: all(of_type(stack.lines("billing", c), "text_delta") for c in children), SWEPT_STALL_S,
               what="both children answered while the parent's worker stalled")
    assert time.monotonic() - t0 < SWEPT_STALL_S, "the children ran during the stall"
    # Each child's end waits for its answer to be taken: not before its parent parks.
    assert all(not of_type(stack.lines("billing", c), "turn_end") for c in children)
    assert stack.agent("triage").blocking_session(parent.id).state()["status"] == "running"  # not parked yet
    end = stack.wait_end("triage", parent.id, SWEPT_STALL_S + RESUME_S)
    assert end["stopReason"] == "end_turn", end
    final = turn_text(stack.lines("triage", parent.id))
    assert f"billed {x}" in final and f"billed {y}" in final, final


def test_one_worker_of_concurrency_1_runs_a_parent_and_its_children(stack: Stack, model: ScriptedModel) -> None:
    """One worker process, `-c 1`, consuming both fx.triage and fx.billing: the parked
    parent holds no worker thread, so the children run on it, and then the parent."""
    only = stack.start("triage", "billing", concurrency=1)
    x, y = f"x{tag()}", f"y{tag()}"
    parent = stack.agent("triage").blocking_session()
    t0 = time.monotonic()
    turn = parent.prompt(f"ask:{x}|{y}")
    end = stack.wait_end("triage", parent.id)
    took_s = time.monotonic() - t0
    print(f"a parent and two children on one -c 1 worker: {took_s:.2f} s")
    assert end["stopReason"] == "end_turn", end
    assert turn.result().stop_reason == "end_turn"
    lines = stack.lines("triage", parent.id)
    assert f"billed {x}" in turn_text(lines) and f"billed {y}" in turn_text(lines)
    ends = of_type(lines, "delegate_end")
    assert len(ends) == 2 and all(e["stopReason"] == "end_turn" for e in ends)
    assert {pid_of(r) for r in model.requests if x in str(r.body) or y in str(r.body)} == {only.pid}
    for e in ends:
        assert [ln["stopReason"] for ln in of_type(stack.lines("billing", e["sessionId"]), "turn_end")] == ["end_turn"]


def test_cancel_of_the_parent_ends_its_running_children_cancelled_within_a_second(
    stack: Stack, model: ScriptedModel
) -> None:
    """The parent parked on two children whose model replies are held: its cancel ends
    the parent `cancelled`, and each child, mid-turn on another worker, `cancelled` within
    `CANCEL_BOUND_S` of the cancel (the parent's worker takes the cancel's wake and cancels
    the children; each child's worker reads its inbox every 250 ms)."""
    stack.start("triage")
    stack.start("billing")
    a, b = f"c{tag()}", f"d{tag()}"
    parent = stack.agent("triage").blocking_session()
    parent.prompt(f"ask:hold:{a}|hold:{b}")
    stack.wait_pause("triage", parent.id)
    try:
        model.wait_held(a, timeout_s=TURN_S)
        model.wait_held(b, timeout_s=TURN_S)
        children = [s["sessionId"] for s in of_type(stack.lines("triage", parent.id), "delegate_start")]
        assert len(children) == 2
        t0 = time.monotonic()
        parent.cancel()
        ended: dict[str, float] = {}

        def both_ended() -> bool:
            for child in children:
                if child not in ended and of_type(stack.lines("billing", child), "turn_end"):
                    ended[child] = time.monotonic() - t0
            return len(ended) == len(children)

        wait_until(both_ended, TURN_S, interval_s=0.01, what="both children ended")
    finally:
        model.release(a)
        model.release(b)
    print("cancel of the parent -> each child's turn_end: " + ", ".join(f"{s:.3f} s" for s in ended.values()))
    for child in children:
        [end] = of_type(stack.lines("billing", child), "turn_end")
        assert end["stopReason"] == "cancelled", end
    assert max(ended.values()) < CANCEL_BOUND_S, ended
    parent_end = stack.wait_end("triage", parent.id)
    assert parent_end["stopReason"] == "cancelled", parent_end
    lines = stack.lines("triage", parent.id)
    assert len(of_type(lines, "turn_end")) == 1 and of_type(lines, "delegate_end") == []


def test_recursion_past_the_depth_bound_is_refused_with_fx_delegation_depth(stack: Stack, model: ScriptedModel) -> None:
    """`looper` delegates to itself (`max_delegation_depth=2`): the turns at depth 1 and 2
    run, the call at depth 3 is refused, its `delegate_end` says FX_DELEGATION_DEPTH, and
    each turn up the chain ends `end_turn` having read its child's answer."""
    stack.start("looper")
    session = stack.agent("looper").blocking_session()
    turn = session.prompt("loop")
    end = stack.wait_end("looper", session.id)
    assert end["stopReason"] == "end_turn", end
    assert turn.result().stop_reason == "end_turn"
    chain: list[tuple[int, dict[str, Any]]] = []  # (depth, delegate_end) down the chain
    session_id = session.id
    while True:
        lines = stack.lines("looper", session_id)
        assert [ln["stopReason"] for ln in of_type(lines, "turn_end")] in (["end_turn"], ["error"]), session_id
        starts = of_type(lines, "delegate_start")
        if not starts:
            break
        [start] = starts
        [delegate_end] = of_type(lines, "delegate_end")
        chain.append((start["depth"], delegate_end))
        session_id = start["sessionId"]
    assert [depth for depth, _ in chain] == [1, 2, LOOPER_MAX_DEPTH + 1]
    refused = chain[-1][1]
    assert refused["stopReason"] == "error" and refused["error"]["code"] == "FX_DELEGATION_DEPTH", refused
    assert all("error" not in e and e["stopReason"] == "end_turn" for _, e in chain[:-1]), chain
    # The refused child asked the model nothing: two requests at each of the three levels that ran.
    assert len([r for r in model.requests if "looper" in _system(r)]) == 2 * (LOOPER_MAX_DEPTH + 1)
    assert "FX_DELEGATION_DEPTH" in turn_text(stack.lines("looper", session.id)), "the top turn read why"


def test_a_traced_prompt_is_one_trace_across_the_parent_and_its_children(stack: Stack, model: ScriptedModel) -> None:
    """With the workers exporting traces (OTLP) and the prompt stored with a `traceparent`
    (as a traced web request stores it), the parent's deliveries (the one that parked it
    and the one its children's answers woke) and each child's `fx.delivery` are in the
    prompt's trace, and each child's delivery sits under the parent's turn that started it."""
    from fxengine.limits import check_prompt_input
    from fxworker.ids import new_message_id, now_ms
    from tests.support.otlp import OtlpReceiver

    trace_id, root_span = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    with OtlpReceiver() as receiver:
        unset = {name: "" for name in os.environ if name.startswith("OTEL_")}
        traced = {**unset, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "fx-delegation",
                  "OTEL_BSP_SCHEDULE_DELAY": "100"}
        stack.start("triage", env=traced)
        stack.start("billing", env=traced)
        triage = stack.agent("triage")
        parent = triage.blocking_session()
        accepted = on_client_loop(triage.store.accept(
            parent.id, agent="triage", kind="prompt", message_id=new_message_id(),
            input=check_prompt_input(f"ask:t{tag()}|u{tag()}", json_only=True), now_ms=now_ms(),
            traceparent=f"00-{trace_id}-{root_span}-01"))
        assert accepted.wake
        triage.wake(parent.id, agent="triage", reason="prompt")
        assert stack.wait_end("triage", parent.id)["stopReason"] == "end_turn"
        children = {s["sessionId"] for s in of_type(stack.lines("triage", parent.id), "delegate_start")}
        assert len(children) == 2
        sessions = children | {parent.id}

        def exported() -> list[dict[str, Any]]:
            spans = [s for s in receiver.spans if s["attributes"].get("fx.session.id") in sessions
                     and s["name"] in ("fx.delivery", "fx.turn")]
            return spans if len(spans) >= 8 else []  # a delivery and a turn: the parent's two, one per child

        spans = wait_until(exported, 10, interval_s=0.05, what="the parent's and children's spans exported")
        stack.workers.close()  # before the receiver goes: nothing left to send to it
    assert {s["trace"] for s in spans} == {trace_id}, "one trace"  # type: ignore[attr-defined]

    def named(name: str, session_id: str) -> list[dict[str, Any]]:
        return sorted((s for s in spans if s["name"] == name  # type: ignore[attr-defined]
                       and s["attributes"]["fx.session.id"] == session_id), key=lambda s: s["attributes"]["fx.epoch"])

    parked, resumed = named("fx.delivery", parent.id)
    assert parked["parent"] == root_span and resumed["parent"] == root_span
    assert resumed["attributes"]["fx.turn.resumed"] is True
    parked_turn = named("fx.turn", parent.id)[0]
    assert parked_turn["parent"] == parked["span"] and parked_turn["attributes"]["fx.outcome"] == "paused"
    for child in children:
        [delivery] = named("fx.delivery", child)
        assert delivery["parent"] == parked_turn["span"], (delivery, parked_turn)
