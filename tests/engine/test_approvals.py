"""Turns that wait for a person or a client: tool approvals and external tools (docs/design.md §6)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fxengine import (
    FxInputError,
    MemoryPersistence,
    Tool,
    ToolContext,
    approve,
    deny,
    submit_result,
    tool,
)
from fxengine.journal.records import decode_batch
from fxengine.models.openai_chat import RESUME_NOTICE
from fxengine.testing import Reply, ScriptedModel, text, tool_call

from .conftest import run, text_of

SCHEMA = {"type": "object", "properties": {"amount": {"type": "integer"}}}


class Refunds:
    """A refund tool that counts its runs; `approval` is what the tool declares."""

    def __init__(self, approval: Any = True, *, idempotent: bool = False) -> None:
        self.runs: list[tuple[int, str]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.started = asyncio.Event()

        async def execute(input: Any, ctx: ToolContext) -> str:
            self.runs.append((input["amount"], ctx.execution_id))
            self.started.set()
            await self.release.wait()
            return f"refunded {input['amount']}"

        self.tool = Tool("refund", "Refunds an order.", SCHEMA, idempotent=idempotent, execute=execute,
                         approval=approval)


def lookup_tool(runs: list[str]) -> Tool:
    def execute(input: Any, ctx: ToolContext) -> str:
        runs.append("lookup")
        return "order 7"

    return Tool("lookup", "Finds an order.", {"type": "object"}, idempotent=True, execute=execute)


@tool(idempotent=False, external=True)
def pick_file(pattern: str) -> str:
    """Lets the user pick a file on their machine."""
    raise AssertionError("an external tool's body never runs")


def tool_messages(request: Any) -> list[tuple[str, str]]:
    return [(m["tool_call_id"], m["content"]) for m in request.body["messages"] if m["role"] == "tool"]


def user_texts(request: Any) -> list[str]:
    return [m["content"] if isinstance(m["content"], str) else str(m["content"])
            for m in request.body["messages"] if m["role"] == "user"]


class KeptStore(MemoryPersistence):
    """A memory store that also keeps every record a checkpoint made unneeded."""

    def __init__(self) -> None:
        super().__init__()
        self.appended: list[bytes] = []

    async def append(self, **kwargs: Any) -> str:
        cursor = await super().append(**kwargs)
        self.appended.append(kwargs["data"])
        return cursor


def journaled(store: KeptStore) -> list[str]:
    return [kind for data in store.appended for kind, _ in decode_batch(data)]


# parking and deciding


async def test_a_call_that_needs_approval_parks_the_turn_then_runs_once_approved(
        model: ScriptedModel, make_engine: Any) -> None:
    refunds = Refunds()
    model.script(Reply(text("Refunding."), tool_call("c1", "refund", {"amount": 500})), Reply(text("Refunded.")))
    engine = await make_engine(tools=[refunds.tool], persistence=MemoryPersistence())
    events, result = await run(engine.prompt("refund order 7", turn_id="t1"))
    assert result.stop_reason == "paused" and refunds.runs == []
    pending = {"id": "c1", "executionId": "t1:1:c1", "name": "refund", "kind": "approval", "step": 1,
               "input": {"amount": 500}}
    assert result.pending_calls == [pending] and engine.pending_calls == [pending]
    assert [e for e in events if e["type"] == "approval_request"] == [
        {"type": "approval_request", "id": "c1", "name": "refund", "kind": "approval", "step": 1,
         "input": {"amount": 500}}]
    assert not [e for e in events if e["type"] in ("tool_start", "tool_end")]
    assert engine.open_turn is not None and engine.open_turn["paused"] and engine.in_flight is None
    assert len(model.requests) == 1

    resumed = engine.resume(decisions={"c1": approve()})
    events, result = await run(resumed)
    assert result.stop_reason == "end_turn" and text_of(events) == "Refunded."
    assert refunds.runs == [(500, "t1:1:c1")]
    assert [e["type"] for e in events[:3]] == ["approval_decision", "tool_start", "tool_end"]
    assert events[0] == {"type": "approval_decision", "id": "c1", "name": "refund", "decision": "approve", "step": 1}
    last = model.requests[-1]
    assert tool_messages(last) == [("c1", "refunded 500")]
    assert RESUME_NOTICE not in user_texts(last)
    assert engine.open_turn is None and engine.pending_calls == []


async def test_a_denial_is_what_the_model_reads(model: ScriptedModel, make_engine: Any) -> None:
    refunds = Refunds()
    model.script(Reply(tool_call("c1", "refund", {"amount": 500})), Reply(text("I could not refund it.")))
    engine = await make_engine(tools=[refunds.tool])
    _, result = await run(engine.prompt("refund"))
    assert result.stop_reason == "paused"
    events, result = await run(engine.resume(decisions={"c1": deny("over the limit")}))
    assert result.stop_reason == "end_turn" and refunds.runs == []
    assert events[0] == {"type": "approval_decision", "id": "c1", "name": "refund", "decision": "deny",
                         "reason": "over the limit", "step": 1}
    assert events[1] == {"type": "tool_end", "id": "c1", "name": "refund", "isError": True, "step": 1,
                         "content": "The user denied this tool call: over the limit"}
    assert tool_messages(model.requests[-1]) == [("c1", "The user denied this tool call: over the limit")]


async def test_an_external_tool_is_answered_by_the_submitted_result(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(tool_call("f1", "pick_file", {"pattern": "*.csv"})), Reply(text("Read it.")))
    engine = await make_engine(tools=[pick_file])
    events, result = await run(engine.prompt("open my report"))
    assert result.stop_reason == "paused"
    assert [(c["id"], c["kind"], c.get("input")) for c in result.pending_calls] == [
        ("f1", "external", {"pattern": "*.csv"})]
    assert [e["kind"] for e in events if e["type"] == "approval_request"] == ["external"]
    with pytest.raises(FxInputError) as wrong:
        engine.resume(decisions={"f1": approve()})
    assert wrong.value.code == "FX_DECISION_INVALID"
    events, result = await run(engine.resume(decisions={"f1": submit_result({"path": "q3.csv"})}))
    assert result.stop_reason == "end_turn"
    assert tool_messages(model.requests[-1]) == [("f1", '{"path":"q3.csv"}')]

    model.script(Reply(tool_call("f2", "pick_file", {"pattern": "*"})), Reply(text("No file then.")))
    await run(engine.prompt("again"))
    await run(engine.resume(decisions={"f2": submit_result("the user closed the dialog", is_error=True)}))
    assert tool_messages(model.requests[-1])[-1] == ("f2", "the user closed the dialog")


async def test_an_approval_check_that_says_no_runs_the_call_without_asking(
        model: ScriptedModel, make_engine: Any) -> None:
    asked: list[tuple[Any, str]] = []

    def above_limit(input: dict[str, Any], ctx: ToolContext) -> bool:
        asked.append((input, ctx.execution_id))
        return bool(input["amount"] > 100)

    refunds = Refunds(approval=above_limit)
    model.script(Reply(tool_call("small", "refund", {"amount": 20})), Reply(text("Done.")),
                 Reply(tool_call("big", "refund", {"amount": 900})))
    engine = await make_engine(tools=[refunds.tool])
    events, result = await run(engine.prompt("refund 20", turn_id="t1"))
    assert result.stop_reason == "end_turn" and refunds.runs == [(20, "t1:1:small")]
    assert not [e for e in events if e["type"] == "approval_request"]
    _, result = await run(engine.prompt("refund 900", turn_id="t2"))
    assert result.stop_reason == "paused" and [c["id"] for c in result.pending_calls] == ["big"]
    assert asked == [({"amount": 20}, "t1:1:small"), ({"amount": 900}, "t2:1:big")]


async def test_a_plain_call_of_the_same_response_runs_and_the_turn_parks(
        model: ScriptedModel, make_engine: Any) -> None:
    refunds = Refunds()
    looked: list[str] = []
    model.script(Reply(tool_call("c1", "refund", {"amount": 500}), tool_call("c2", "lookup", {})), Reply(text("ok")))
    engine = await make_engine(tools=[refunds.tool, lookup_tool(looked)])
    events, result = await run(engine.prompt("refund and look up"))
    assert result.stop_reason == "paused" and looked == ["lookup"] and refunds.runs == []
    assert [(e["type"], e["id"]) for e in events] == [("approval_request", "c1"), ("tool_start", "c2"),
                                                      ("tool_end", "c2")]
    assert [c["id"] for c in result.pending_calls] == ["c1"]
    await run(engine.resume(decisions={"c1": approve()}))
    assert tool_messages(model.requests[-1]) == [("c1", "refunded 500"), ("c2", "order 7")]  # in call order
    assert looked == ["lookup"]


async def test_parallel_approvals_wait_together_and_undecided_ones_keep_waiting(
        model: ScriptedModel, make_engine: Any) -> None:
    refunds = Refunds()
    store = KeptStore()
    model.script(Reply(tool_call("a", "refund", {"amount": 1}), tool_call("b", "refund", {"amount": 2})),
                 Reply(text("Both handled.")))
    engine = await make_engine(tools=[refunds.tool], persistence=store)
    events, result = await run(engine.prompt("two refunds", turn_id="t1"))
    assert result.stop_reason == "paused" and [c["id"] for c in result.pending_calls] == ["a", "b"]
    assert [e["id"] for e in events if e["type"] == "approval_request"] == ["a", "b"]
    assert journaled(store).count("turn_pause") == 1

    head = store.head
    _, result = await run(engine.resume())  # no decision: still paused, nothing journaled
    assert result.stop_reason == "paused" and store.head == head and len(model.requests) == 1

    _, result = await run(engine.resume(decisions={"a": approve()}))
    assert result.stop_reason == "paused" and [c["id"] for c in result.pending_calls] == ["b"]
    assert refunds.runs == [(1, "t1:1:a")] and len(model.requests) == 1  # no request while b waits

    _, result = await run(engine.resume(decisions={"b": deny("no")}))
    assert result.stop_reason == "end_turn" and refunds.runs == [(1, "t1:1:a")]
    assert tool_messages(model.requests[-1]) == [("a", "refunded 1"), ("b", "The user denied this tool call: no")]


async def test_a_new_engine_resumes_a_paused_turn_with_its_decisions(model: ScriptedModel, make_engine: Any) -> None:
    refunds = Refunds()
    store = KeptStore()
    model.script(Reply(tool_call("c1", "refund", {"amount": 500})), Reply(text("Refunded.")))
    first = await make_engine(tools=[refunds.tool], persistence=store)
    _, result = await run(first.prompt("refund", turn_id="t1"))
    assert result.stop_reason == "paused"
    await first.close()

    second = await make_engine(tools=[refunds.tool], persistence=store)
    assert second.open_turn is not None and second.open_turn["turnId"] == "t1" and second.open_turn["paused"]
    assert second.pending_calls == result.pending_calls and second.in_flight is None
    events, result = await run(second.resume(decisions={"c1": approve()}))
    assert result.stop_reason == "end_turn" and refunds.runs == [(500, "t1:1:c1")]
    last = model.requests[-1]
    assert RESUME_NOTICE not in user_texts(last)
    assert tool_messages(last) == [("c1", "refunded 500")]
    assert not any("may have partly run" in e.get("content", "") for e in events)
    kinds = journaled(store)
    assert kinds.index("tool_wait") < kinds.index("turn_pause") < kinds.index("tool_approved") < kinds.index("turn_end")


async def test_a_crash_while_an_approved_call_runs_is_answered_as_possibly_run(
        model: ScriptedModel, make_engine: Any) -> None:
    refunds = Refunds()
    store = MemoryPersistence()
    model.script(Reply(tool_call("c1", "refund", {"amount": 500})), Reply(text("Checked.")))
    first = await make_engine(tools=[refunds.tool], persistence=store)
    await run(first.prompt("refund", turn_id="t1"))
    refunds.release.clear()
    turn = first.resume(decisions={"c1": approve()})
    await asyncio.wait_for(refunds.started.wait(), 5)
    turn.detach()  # the process dies while the approved call runs
    assert (await asyncio.wait_for(turn.result(), 5)).detached

    second = await make_engine(tools=[refunds.tool], persistence=store)
    assert second.pending_calls == [] and second.in_flight == {"kind": "tool", "step": 1,
                                                                "calls": [{"id": "c1", "name": "refund"}]}
    with pytest.raises(FxInputError) as again:
        second.resume(decisions={"c1": approve()})
    assert again.value.code == "FX_DECISION_REPEATED"
    events, result = await run(second.resume())
    assert result.stop_reason == "end_turn" and refunds.runs == [(500, "t1:1:c1")]  # never twice
    assert events[0]["type"] == "tool_end" and "may have partly run" in events[0]["content"]
    assert RESUME_NOTICE in user_texts(model.requests[-1])  # this one was interrupted


async def test_decisions_that_cannot_apply_are_refused_before_anything_is_journaled(
        model: ScriptedModel, make_engine: Any) -> None:
    refunds = Refunds()
    store = MemoryPersistence()
    model.script(Reply(tool_call("a", "refund", {"amount": 1}), tool_call("b", "refund", {"amount": 2})))
    engine = await make_engine(tools=[refunds.tool], persistence=store)
    with pytest.raises(FxInputError) as no_turn:
        engine.resume(decisions={"a": approve()})
    assert no_turn.value.code == "FX_DECISION_UNKNOWN_CALL"
    await run(engine.prompt("two"))
    head = store.head
    refused = [({"zzz": approve()}, "FX_DECISION_UNKNOWN_CALL"),
               ({"a": {"type": "maybe"}}, "FX_DECISION_INVALID"),
               ({"a": submit_result("x")}, "FX_DECISION_INVALID"),
               ({"a": {"type": "deny", "reason": 7}}, "FX_DECISION_INVALID"),
               (["a"], "FX_DECISION_INVALID"),
               ({"a": approve(), "zzz": approve()}, "FX_DECISION_UNKNOWN_CALL")]
    for decisions, code in refused:
        with pytest.raises(FxInputError) as error:
            engine.resume(decisions=decisions)
        assert error.value.code == code, decisions
    assert store.head == head and engine.pending_calls and len(engine.pending_calls) == 2
    await run(engine.resume(decisions={"a": deny()}))
    with pytest.raises(FxInputError) as repeated:
        engine.resume(decisions={"a": approve()})
    assert repeated.value.code == "FX_DECISION_REPEATED"


async def test_ending_a_paused_turn_denies_its_calls(model: ScriptedModel, make_engine: Any) -> None:
    refunds = Refunds()
    store = MemoryPersistence()
    model.script(Reply(tool_call("c1", "refund", {"amount": 500})), Reply(text("Next.")))
    engine = await make_engine(tools=[refunds.tool], persistence=store)
    await run(engine.prompt("refund", turn_id="t1"))
    result = await engine.end_open_turn("cancelled")
    assert result is not None and result.stop_reason == "cancelled"
    assert engine.open_turn is None and engine.pending_calls == [] and refunds.runs == []
    assert [m for m in engine.messages if m["role"] == "tool"] == [
        {"role": "tool", "id": "c1", "name": "refund", "content": "The user denied this tool call: cancelled",
         "isError": True}]
    await run(engine.prompt("something else"))
    assert tool_messages(model.requests[-1]) == [("c1", "The user denied this tool call: cancelled")]


async def test_the_parked_state_survives_a_checkpoint_and_the_records(model: ScriptedModel, make_engine: Any) -> None:
    refunds = Refunds()
    looked: list[str] = []
    store = MemoryPersistence()
    model.script(Reply(tool_call("c1", "refund", {"amount": 5}), tool_call("c2", "lookup", {})), Reply(text("ok")))
    tools = [refunds.tool, lookup_tool(looked)]
    engine = await make_engine(tools=tools, persistence=store)
    _, result = await run(engine.prompt("go", turn_id="t1"))
    from_checkpoint = await make_engine(tools=tools, checkpoint=engine.checkpoint())
    from_records = await make_engine(tools=tools, persistence=store)
    for other in (from_checkpoint, from_records):
        assert other.pending_calls == result.pending_calls
        assert other.open_turn is not None and other.open_turn["paused"] and other.in_flight is None
        assert other.messages == engine.messages
    events, result = await run(from_checkpoint.resume(decisions={"c1": approve()}))
    assert result.stop_reason == "end_turn" and looked == ["lookup"]
    assert tool_messages(model.requests[-1]) == [("c1", "refunded 5"), ("c2", "order 7")]


async def test_an_async_approval_check_is_awaited_and_one_that_fails_asks(
        model: ScriptedModel, make_engine: Any, diagnostics: Any) -> None:
    async def above_limit(input: dict[str, Any], ctx: ToolContext) -> bool:
        if input["amount"] < 0:
            raise ValueError("no negative refunds")
        return bool(input["amount"] > 100)

    refunds = Refunds(approval=above_limit)
    model.script(Reply(tool_call("ok", "refund", {"amount": 5}), tool_call("odd", "refund", {"amount": -5})))
    engine = await make_engine(tools=[refunds.tool])
    _, result = await run(engine.prompt("two refunds"))
    assert result.stop_reason == "paused" and [c["id"] for c in result.pending_calls] == ["odd"]
    assert refunds.runs == [(5, result.pending_calls[0]["executionId"].replace("odd", "ok"))]
    assert diagnostics.of("tool.approval_error")[0]["error"] == "ValueError"
