"""Agents that call agents (docs/design.md §6 "Delegated turns"), on the embedded store
(the production Lua on fakeredis) and a real Redis, with in-process workers.

A call of a delegating tool (`Agent.as_tool()`) parks the caller's turn and prompts a
turn of the tool's agent in a session of its own; that turn's end answers the call, and
the caller resumes. The real-worker and fault tests are in
tests/durable/test_delegation_celery.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from fxengine import Tool, ToolContext
from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call, usage
from fxworker import Agent, Settings, delegate_tool, embedded
from fxworker.embedded import InProcessWaker
from fxworker.store import embedded_store, redis_store
from tests.durable.conftest import last_message_text, stored_lines, system_text, wait_idle
from tests.durable.tooling import provider
from tests.support.redis_server import delete_prefix

pytestmark = pytest.mark.timeout(60)

TURN_S = 15.0


def responder(request: Any) -> Reply:
    """triage: `ask:<a>|<b>` calls `billing` once per task in one response, then answers
    with the results it read; billing: `charge:<x>` calls the non-idempotent `charge` tool,
    `hold:<n>` waits for a release, else answers `billed <task>`; `loop` (agent `looper`)
    delegates to itself for ever."""
    system = system_text(request)
    role, last = last_message_text(request)
    if "triage" in system:
        if role == "tool" or last.startswith("Resuming from"):  # the results (and a resume's notice)
            results = [m["content"] for m in request.body["messages"] if m.get("role") == "tool"]
            return Reply(text("answer: " + " + ".join(results)), usage(5, 3))
        if last.startswith("both:"):  # both:<task>: a delegated call and a slow call of `file` in one response
            return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "billing", {"input": last[5:]}),
                         tool_call(f"call_{uuid.uuid4().hex[:8]}", "file", {}))
        if last.startswith("early:"):  # early:<hold>:<call id>:<task>: the call comes after a hold
            _, name, call_id, task = last.split(":", 3)
            return Reply(hold(name), tool_call(call_id, "billing", {"input": task}))
        tasks = last[4:].split("|") if last.startswith("ask:") else [last]
        return Reply(*[tool_call(f"call_{uuid.uuid4().hex[:8]}", "billing", {"input": t}) for t in tasks],
                     usage(7, 2))
    if "looper" in system:
        if role == "tool":
            return Reply(text("gave up: " + last))
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "looper", {"input": "loop"}))
    if role == "tool":
        return Reply(text("billed after " + last), usage(11, 4))
    if last.startswith("charge:"):
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "charge", {"amount": int(last[7:])}))
    if last.startswith("hold:"):
        return Reply(text("working "), hold(last[5:]), text("billed held"), usage(11, 4))
    return Reply(text("billed " + last), usage(11, 4))


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


class Team:
    def __init__(self, triage: Agent, billing: Agent, charges: list[str]) -> None:
        self.triage, self.billing, self.charges = triage, billing, charges


@contextmanager
def make_team(model: ScriptedModel, url: str | None, *, keep: bool = False, extra_tools: tuple[Tool, ...] = (),
              **triage_options: Any) -> Iterator[Team]:
    """`triage` (whose `billing` tool delegates to agent `billing`) and `billing` (with a
    non-idempotent `charge`), on one store of their own, with two in-process workers."""
    prefix = f"fxe{uuid.uuid4().hex[:8]}"
    store = redis_store(url, prefix=prefix) if url else embedded_store(prefix=prefix)
    charges: list[str] = []

    def charge(input: Any, ctx: ToolContext) -> str:
        charges.append(ctx.execution_id)
        return f"charged {input['amount']}"

    common: dict[str, Any] = dict(model="scripted", provider=provider(model.base_url), api_key="test-key", store=store,
                                  waker=InProcessWaker(start_workers=False),
                                  settings=Settings(lease_s=2.0, reserve_s=4.0, sweep_s=0.5))
    billing = Agent("billing", instructions="You are billing.", tools=[
        Tool("charge", "Charges.", {"type": "object", "properties": {"amount": {"type": "integer"}}},
             idempotent=False, execute=charge)], **common)
    triage = Agent("triage", instructions="You are triage.", tools=[billing.as_tool(keep=keep), *extra_tools], **common,
                   **triage_options)
    embedded.start_embedded_workers(2)
    try:
        yield Team(triage, billing, charges)
    finally:
        embedded.stop_embedded_workers()
        triage.close()
        billing.close()
        if url:
            delete_prefix(url, prefix)


@pytest.fixture(params=["fakeredis", "redis"])
def team(request: pytest.FixtureRequest, model: ScriptedModel) -> Iterator[Team]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    with make_team(model, url) as t:
        yield t


async def delegations(agent: Agent, session_id: str) -> tuple[list[Any], list[Any]]:
    lines = await stored_lines(agent, session_id)
    return ([line for line in lines if line["type"] == "delegate_start"],
            [line for line in lines if line["type"] == "delegate_end"])


async def test_a_parent_delegates_two_calls_and_ends_with_both_answers(team: Team) -> None:
    session = team.triage.session()
    turn = await session.prompt("ask:charge:5|plain")
    result = await asyncio.wait_for(turn.result(), TURN_S)
    assert result.stop_reason == "end_turn", result
    lines = await stored_lines(team.triage, session.id)
    starts = [line for line in lines if line["type"] == "delegate_start"]
    ends = [line for line in lines if line["type"] == "delegate_end"]
    assert len(starts) == 2 and len(ends) == 2
    assert {line["sessionId"] for line in starts} == {line["sessionId"] for line in ends}
    assert all(line["agent"] == "billing" and line["depth"] == 1 for line in starts)
    requests = [line for line in lines if line["type"] == "approval_request"]
    assert [line.get("delegate") for line in requests] == ["billing", "billing"]  # marked from the start
    assert all(line["stopReason"] == "end_turn" for line in ends)
    final = "".join(line["delta"] for line in lines if line["type"] == "text_delta")
    assert "billed after charged 5" in final and "billed plain" in final
    assert len(team.charges) == 1
    for start in starts:
        child = team.billing.session(start["sessionId"])
        child_lines = await stored_lines(team.billing, child.id)
        assert [line["type"] for line in child_lines if line["type"] in ("turn_start", "turn_end")] == [
            "turn_start", "turn_end"]
    assert result.delegated_usage == {"inputTokens": 22, "outputTokens": 8}  # both children's, one level
    [end] = [line for line in lines if line["type"] == "turn_end"]
    assert end["delegatedUsage"] == result.delegated_usage and end["usage"]["inputTokens"] == 12  # its own two steps
    again = await asyncio.wait_for((await session.prompt("ask:charge:5|plain", message_id=turn.message_id)).result(),
                                   TURN_S)
    assert again.repeated and again.delegated_usage == result.delegated_usage


async def test_cancel_of_the_parent_cancels_its_children(team: Team, model: ScriptedModel) -> None:
    session = team.triage.session()
    hold_name = f"h{uuid.uuid4().hex[:6]}"
    turn = await session.prompt(f"ask:hold:{hold_name}")
    async for line in turn.ndjson():
        if b'"turn_pause"' in line:
            break  # parked on its child, whose model holds
    lines = await stored_lines(team.triage, session.id)
    [start] = [line for line in lines if line["type"] == "delegate_start"]
    child_turn = team.billing.session(start["sessionId"])
    await session.cancel()
    state = await wait_idle(team.billing, child_turn.id, timeout_s=TURN_S)
    assert state.status == "idle"
    child_lines = await stored_lines(team.billing, child_turn.id)
    [end] = [line for line in child_lines if line["type"] == "turn_end"]
    assert end["stopReason"] == "cancelled"
    parent_lines = await stored_lines(team.triage, session.id)
    assert [line["stopReason"] for line in parent_lines if line["type"] == "turn_end"] == ["cancelled"]
    model.release(hold_name)


async def test_recursion_stops_at_the_depth_bound(model: ScriptedModel) -> None:
    store = embedded_store(prefix=f"fxe{uuid.uuid4().hex[:8]}")
    looper = Agent("looper", instructions="You are looper.", model="scripted", provider=provider(model.base_url),
                   api_key="test-key", store=store, waker=InProcessWaker(start_workers=False),
                   settings=Settings(lease_s=2.0, reserve_s=4.0, sweep_s=0.5), max_delegation_depth=2,
                   tools=[delegate_tool("looper", name="looper", description="Asks looper.")])
    embedded.start_embedded_workers(1)
    try:
        session = looper.session()
        result = await asyncio.wait_for((await session.prompt("loop")).result(), TURN_S)
        assert result.stop_reason == "end_turn"
        depth = 0
        sid = session.id
        codes = []
        while True:
            lines = await stored_lines(looper, sid)
            starts = [line for line in lines if line["type"] == "delegate_start"]
            ends = [line for line in lines if line["type"] == "delegate_end"]
            codes += [line.get("error", {}).get("code") for line in ends]
            if not starts:
                break
            depth = starts[0]["depth"]
            sid = starts[0]["sessionId"]
        assert depth == 3 and "FX_DELEGATION_DEPTH" in codes
    finally:
        embedded.stop_embedded_workers()
        looper.close()


async def test_one_timeline_shows_the_parent_and_its_children(team: Team) -> None:
    from fxworker import timeline

    session = team.triage.session()
    result = await asyncio.wait_for((await session.prompt("ask:charge:9|plain")).result(), TURN_S)
    assert result.stop_reason == "end_turn"
    flat = await timeline.read(team.triage.store, session.id)
    [turn] = flat["turns"]
    assert [d["stopReason"] for d in turn["delegations"]] == ["end_turn", "end_turn"]
    assert all("turn" not in d for d in turn["delegations"])  # nested only when asked
    assert [d["usage"] for d in turn["delegations"]] == [{"inputTokens": 11, "outputTokens": 4}] * 2
    nested = await timeline.read(team.triage.store, session.id, children=True)
    [turn] = nested["turns"]
    children = [d["turn"] for d in turn["delegations"]]
    assert all(child is not None and child["stopReason"] == "end_turn" for child in children)
    assert sorted(child["input"] or "" for child in children if child) == ["charge:9", "plain"]
    [charging] = [child for child in children if child and child["input"] == "charge:9"]
    assert [(t["name"], t["outcome"]) for t in charging["tools"]] == [("charge", "ran")]
    assert turn["deliveries"][0]["how"] == "paused" and turn["deliveries"][-1]["how"] == "ended"


async def test_a_repeated_start_of_the_children_prompts_no_second_child(team: Team) -> None:
    """A parked parent claimed again without decisions (a worker that died right after its
    pause was stored, a resume) prompts its children again: the store answers `repeated`,
    no second child turn runs and no second `delegate_start` is written."""
    from fxworker import delegation

    session = team.triage.session()
    result = await asyncio.wait_for((await session.prompt("ask:plain")).result(), TURN_S)
    assert result.stop_reason == "end_turn"
    lines = await stored_lines(team.triage, session.id)
    [start] = [line for line in lines if line["type"] == "delegate_start"]
    child = start["sessionId"]
    [tool] = team.triage.tools
    assert isinstance(tool, delegation.DelegateTool)
    link_parent = delegation.Parent(session.id, result.message_id or "", team.triage, team.triage.store, None)
    execution = [line for line in lines if line["type"] == "approval_request"][0]
    call = delegation.Call(start["callId"], f"{session.id}:{result.message_id}:1:{start['callId']}",
                           {"input": "plain"}, tool)
    assert delegation.child_session_id(session.id, tool, call.execution_id) == child
    assert delegation.child_message_id(call.execution_id) == start["childMessageId"]
    await delegation.start_children(link_parent, [call], None)
    await wait_idle(team.billing, child, timeout_s=TURN_S)
    child_lines = await stored_lines(team.billing, child)
    assert [line["type"] for line in child_lines].count("turn_start") == 1
    assert execution["kind"] == "external"


async def test_a_delegated_prompt_is_claimed_only_by_a_process_that_reads_delegated_turns(team: Team) -> None:
    """A process of an older release would run a child's prompt as a plain one and never
    answer the parent: the prompt raises meta `newer` to DELEGATED_LEVEL, so such a claim
    takes nothing (`Newer`), and this release's claim takes it."""
    from fxworker import delegation
    from fxworker.store.types import DELEGATED_LEVEL, PARKED_LEVEL, Claim, Newer

    embedded.stop_embedded_workers()
    [tool] = team.triage.tools
    assert isinstance(tool, delegation.DelegateTool)
    parent = delegation.Parent(team.triage.new_session_id(), "msg_parent", team.triage, team.triage.store, None)
    call = delegation.Call("call_1", f"{parent.session_id}:msg_parent:1:call_1", {"input": "plain"}, tool)
    await delegation.start_children(parent, [call], None)
    child = delegation.child_session_id(parent.session_id, tool, call.execution_id)
    state = await team.billing.store.state(child)
    assert state is not None and state.newer == DELEGATED_LEVEL and state.pending == 1
    older = await team.billing.store.claim(child, holder="old", lease_ms=2000, only_work=True, reads=PARKED_LEVEL)
    assert isinstance(older, Newer) and older.level == DELEGATED_LEVEL
    assert (await team.billing.store.state(child)).pending == 1  # type: ignore[union-attr]
    claim = await team.billing.store.claim(child, holder="new", lease_ms=2000, only_work=True)
    assert isinstance(claim, Claim) and [i.message_id for i in claim.pending] == [
        delegation.child_message_id(call.execution_id)]
    link = delegation.link_of(claim.pending[0].settings)
    assert link is not None and link["parent"] == parent.session_id and link["call"] == "call_1"
    assert link["depth"] == 1 and link["refuse"] is None


def test_a_link_is_checked_as_it_is_read() -> None:
    from fxworker import delegation

    good = {"v": 1, "parent": "fxs_x", "turn": "t", "call": "c", "depth": 2, "maxDepth": 3, "refuse": None}
    assert delegation.link_of({"delegation": good}) == good
    assert delegation.link_of(None) is None and delegation.link_of({"model": "m"}) is None
    for broken in ({**good, "v": 2}, {**good, "depth": "2"}, {**good, "call": ""}, {**good, "depth": True}, "x"):
        assert delegation.link_of({"delegation": broken}) is None
    forged = delegation.link_of({"delegation": {**good, "refuse": {"code": "FX_OTHER", "message": "m"}}})
    assert forged is not None and forged["refuse"] == {"code": "FX_DELEGATION_INVALID",
                                                       "message": "the delegation was refused"}


async def test_past_max_children_a_call_is_answered_with_its_code_and_runs_nothing(model: ScriptedModel) -> None:
    with make_team(model, None, max_children=2) as team:
        session = team.triage.session()
        result = await asyncio.wait_for((await session.prompt("ask:a1|a2|a3")).result(), TURN_S)
        assert result.stop_reason == "end_turn"
        starts, ends = await delegations(team.triage, session.id)
        by_call = {line["callId"]: line for line in ends}
        outcomes = [(by_call[s["callId"]]["stopReason"], by_call[s["callId"]].get("error", {}).get("code"))
                    for s in starts]
        assert outcomes == [("end_turn", None), ("end_turn", None), ("error", "FX_DELEGATION_FANOUT")]
        refused = starts[2]["sessionId"]
        refused_lines = await stored_lines(team.billing, refused)
        assert [line["type"] for line in refused_lines if line["type"] in ("turn_start", "turn_end", "text_delta")] \
            == ["turn_end"]  # ended before any model request
        texts = [m["content"] for r in model.requests for m in r.body["messages"] if m.get("role") == "tool"]
        assert any("FX_DELEGATION_FANOUT" in t for t in texts)  # the parent's model read why


async def test_a_kept_child_session_remembers_the_calls_before(model: ScriptedModel) -> None:
    with make_team(model, None, keep=True) as team:
        session = team.triage.session()
        first = await asyncio.wait_for((await session.prompt("ask:one")).result(), TURN_S)
        second = await asyncio.wait_for((await session.prompt("ask:two")).result(), TURN_S)
        assert first.stop_reason == second.stop_reason == "end_turn"
        starts, _ = await delegations(team.triage, session.id)
        assert len(starts) == 2 and starts[0]["sessionId"] == starts[1]["sessionId"]
        child = starts[0]["sessionId"]
        assert (await team.billing.session(child).state())["turns"] == 2
        other = team.triage.session()
        await asyncio.wait_for((await other.prompt("ask:three")).result(), TURN_S)
        [start], _ = await delegations(team.triage, other.id)
        assert start["sessionId"] != child  # kept per parent session


async def test_a_delegated_call_whose_wait_times_out_stops_its_child(model: ScriptedModel) -> None:
    with make_team(model, None, decision_timeout_s=0.5) as team:
        session = team.triage.session()
        hold_name = f"h{uuid.uuid4().hex[:6]}"
        result = await asyncio.wait_for((await session.prompt(f"ask:hold:{hold_name}")).result(), TURN_S)
        assert result.stop_reason == "end_turn"  # the timeout's denial answered the call
        [start], [end] = await delegations(team.triage, session.id)
        assert end["callId"] == start["callId"] and end["stopReason"] == "cancelled"
        assert end["error"]["code"] == "FX_DECISION_EXPIRED"
        state = await wait_idle(team.billing, start["sessionId"], timeout_s=TURN_S)
        child_lines = await stored_lines(team.billing, state.session_id)
        assert [line["stopReason"] for line in child_lines if line["type"] == "turn_end"] == ["cancelled"]
        model.release(hold_name)


async def test_an_answer_that_comes_before_its_parent_parks_waits_for_the_pause(team: Team,
                                                                                 model: ScriptedModel) -> None:
    """Order of calls: a child's answer reaches the parent while the parent's turn is open but
    its pause is not stored yet (its worker is slow): the door refuses it (no call waits), so
    the child retries while the parent's turn stays open and unparked, and is taken once the
    call waits. A late second answer for the call finds it decided and is dropped."""
    from fxworker import delegation

    session = team.triage.session()
    parent_hold, child_hold = f"p{uuid.uuid4().hex[:6]}", f"c{uuid.uuid4().hex[:6]}"
    call_id = f"call_{uuid.uuid4().hex[:8]}"
    turn = await session.prompt(f"early:{parent_hold}:{call_id}:hold:{child_hold}")
    await asyncio.wait_for(_open(team.triage, session.id, turn.message_id), TURN_S)
    link: delegation.Link = {"v": 1, "parent": session.id, "turn": turn.message_id or "", "call": call_id,
                             "depth": 1, "maxDepth": 3, "refuse": None}
    early = asyncio.ensure_future(delegation.reply(
        team.billing, team.billing.store, link, child_session="fxs_01J00000000000000000000EAR", child_turn="t1",
        stop_reason="end_turn", text="the early answer", error=None, usage={"inputTokens": 1}))
    await asyncio.sleep(0.3)
    assert not early.done()  # refused (no call waits yet) and retrying while the turn is open
    model.release(parent_hold)
    await asyncio.wait_for(early, TURN_S)
    result = await asyncio.wait_for(turn.result(), TURN_S)
    assert result.stop_reason == "end_turn"
    texts = [m["content"] for r in model.requests for m in r.body["messages"]
             if m.get("role") == "tool" and m.get("tool_call_id") == call_id]
    assert texts and set(texts) == {"the early answer"}
    model.release(child_hold)  # the real child ends now: its answer finds the call decided
    starts, ends = await delegations(team.triage, session.id)
    [start] = starts
    await wait_idle(team.billing, start["sessionId"], timeout_s=TURN_S)
    _, ends = await delegations(team.triage, session.id)
    assert len(ends) == 1 and ends[0]["sessionId"].endswith("EAR")


async def test_an_answer_for_a_turn_that_moved_on_stops_retrying(team: Team, model: ScriptedModel) -> None:
    """The bound of that retry: once the parent's turn no longer might wait on the call (it
    parked on other calls, it ended), the answer is dropped at once."""
    from fxworker import delegation

    session = team.triage.session()
    hold_name = f"p{uuid.uuid4().hex[:6]}"
    turn = await session.prompt(f"early:{hold_name}:call_{uuid.uuid4().hex[:8]}:plain")
    await asyncio.wait_for(_open(team.triage, session.id, turn.message_id), TURN_S)
    link: delegation.Link = {"v": 1, "parent": session.id, "turn": turn.message_id or "", "call": "call_none",
                             "depth": 1, "maxDepth": 3, "refuse": None}
    early = asyncio.ensure_future(delegation.reply(
        team.billing, team.billing.store, link, child_session="fxs_01J00000000000000000000EAR", child_turn="t2",
        stop_reason="end_turn", text="x", error=None, usage=None))
    await asyncio.sleep(0.2)
    assert not early.done()
    model.release(hold_name)
    await asyncio.wait_for(early, TURN_S)  # returns once the turn parked on its own call
    assert (await asyncio.wait_for(turn.result(), TURN_S)).stop_reason == "end_turn"
    _, ends = await delegations(team.triage, session.id)
    assert [end["sessionId"].endswith("EAR") for end in ends] == [False]


async def _open(agent: Agent, session_id: str, turn_id: str | None) -> None:
    while True:
        state = await agent.store.state(session_id)
        if state is not None and state.open_turn == turn_id and state.status == "running":
            return
        await asyncio.sleep(0.02)


async def test_a_parent_whose_worker_dies_before_its_pause_is_stored_parks_once_and_ends(
        model: ScriptedModel) -> None:
    """Order of calls: the response holds a delegated call (its wait recorded with the
    response) and runs a slow sibling call; the worker dies during the sibling, before the
    pause (and the children's prompts) were stored. The next worker resumes the turn, which
    settles the sibling ("may have partly run": it is not idempotent), stores the pause,
    prompts the child and announces it once; the child's answer ends the turn."""
    started = asyncio.Event()
    runs: list[str] = []

    async def file(input: Any, ctx: ToolContext) -> str:
        runs.append(ctx.execution_id)
        if len(runs) == 1:
            started.set()
            await asyncio.sleep(60)  # cut short by the worker's death
        return "filed"

    slow = Tool("file", "Files the case.", {"type": "object", "properties": {}}, idempotent=False, execute=file)
    with make_team(model, None, extra_tools=(slow,)) as team:
        session = team.triage.session()
        turn = await session.prompt("both:plain")
        await asyncio.wait_for(_set_in_any_loop(started), TURN_S)
        embedded.stop_embedded_workers()  # the worker dies: nothing more is written by it
        starts, _ = await delegations(team.triage, session.id)
        assert starts == [] and (await team.triage.store.state(session.id)).paused_calls == ()  # type: ignore[union-attr]
        embedded.start_embedded_workers(2)
        result = await asyncio.wait_for(turn.result(), TURN_S + 10)
        assert result.stop_reason == "end_turn"
        starts, ends = await delegations(team.triage, session.id)
        assert len(starts) == 1 and len(ends) == 1 and ends[0]["stopReason"] == "end_turn"
        assert len(runs) == 1  # the sibling was not run again
        child_lines = await stored_lines(team.billing, starts[0]["sessionId"])
        assert [line["type"] for line in child_lines].count("turn_start") == 1


async def _set_in_any_loop(event: asyncio.Event) -> None:
    """Waits for `event`, set by a tool on a worker's loop (another thread's): polled."""
    while not event.is_set():
        await asyncio.sleep(0.02)


async def test_an_answer_to_a_parent_session_that_is_gone_is_dropped(team: Team) -> None:
    """The parent's session is gone (deleted, expired): the child's answer finds no session
    and is dropped, so the child's turn still ends (no retry, no death of its worker)."""
    from fxworker import delegation

    link: delegation.Link = {"v": 1, "parent": team.triage.new_session_id(), "turn": "t", "call": "c",
                             "depth": 1, "maxDepth": 3, "refuse": None}
    await asyncio.wait_for(delegation.reply(
        team.billing, team.billing.store, link, child_session="fxs_01J00000000000000000000EAR", child_turn="t3",
        stop_reason="end_turn", text="x", error=None, usage=None), TURN_S)


async def test_a_link_of_a_newer_version_is_left_for_a_newer_process(team: Team) -> None:
    """A delegated prompt whose link a newer release wrote (`v` 2): this release would run
    it as a plain prompt that answers no one, so it leaves it (meta `newer`), nothing
    ended, its prompt still pending."""
    from fxworker.store.types import LAYOUT_LEVEL

    child = team.billing.new_session_id()
    link = {"v": 2, "parent": team.triage.new_session_id(), "turn": "t", "call": "c", "depth": 1, "maxDepth": 3,
            "refuse": None}
    accepted = await team.billing.store.accept(child, agent="billing", kind="prompt", message_id="dlg_newer",
                                               input="plain", settings={"delegation": link})
    team.billing.wake(child, reason="test")
    assert not accepted.repeated

    async def let_go() -> Any:
        while True:
            state = await team.billing.store.state(child)
            if state is not None and state.newer is not None and state.lease_holder is None and state.epoch > 0:
                return state
            await asyncio.sleep(0.02)
    state = await asyncio.wait_for(let_go(), TURN_S)
    assert state.newer == LAYOUT_LEVEL + 1 and state.status == "waiting" and state.pending == 1, state
    lines = await stored_lines(team.billing, child)
    assert [line for line in lines if line.get("messageId") == "dlg_newer"] == []  # nothing ended
