from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from fxengine import FxJournalAppendError, FxJournalVersionError, MemoryPersistence, Tool, ToolContext, create_engine
from fxengine.journal.records import FORMAT_VERSION, decode_batch
from fxengine.models.openai_chat import RESUME_NOTICE
from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call

from .conftest import Diagnostics, run, text_of, wait_until

SCHEMA = {"type": "object", "properties": {"to": {"type": "string"}}}


class CrashStore(MemoryPersistence):
    """A store whose writer can 'die' right after a barrier record is stored."""

    def __init__(self, *, stall_barrier: int | None = None) -> None:
        super().__init__()
        self.stall_barrier = stall_barrier
        self.stalled = asyncio.Event()
        self._dead = asyncio.Event()
        self._barriers = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.keys: list[str] = []
        self.appended: list[bytes] = []

    async def append(self, **kwargs: Any) -> str:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)
            cursor = await super().append(**kwargs)
            self.keys.append(kwargs["idempotency_key"])
            self.appended.append(kwargs["data"])
            if kwargs["barrier"]:
                self._barriers += 1
                if self._barriers == self.stall_barrier:
                    self.stalled.set()
                    await self._dead.wait()
                    raise ConnectionError("the old process is gone")
            return cursor
        finally:
            self.in_flight -= 1

    def kill_stalled(self) -> None:
        self._dead.set()


class Effects:
    """Tools that count their runs; `block` makes a run wait until released (or aborted)."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str]] = []
        self.block = True
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    def tool(self, name: str, *, idempotent: bool, writes: bool | None = None) -> Tool:
        async def execute(input: dict[str, Any], ctx: ToolContext) -> str:
            self.runs.append((name, ctx.execution_id))
            self.started.set()
            if self.block:
                await self.release.wait()
            return f"{name} done"

        return Tool(name, name, SCHEMA, idempotent=idempotent, writes=writes, execute=execute)


async def crash(turn: Any) -> None:
    """The process running `turn` stops: nothing more of it is written."""
    turn.detach()
    result = await asyncio.wait_for(turn.result(), 5)
    assert result.detached and result.stop_reason == "unknown"


def contents(request: Any) -> list[Any]:
    return [(m["role"], m.get("content")) for m in request.body["messages"]]


@pytest.mark.parametrize("idempotent", [True, False])
async def test_a_turn_crashed_during_a_tool_resumes(model: ScriptedModel, make_engine: Any,
                                                    diagnostics: Diagnostics, idempotent: bool) -> None:
    effects = Effects()
    tools = [effects.tool("send", idempotent=idempotent)]
    store = CrashStore()
    model.script(Reply(text("Sending."), tool_call("c1", "send", {"to": "bob"})), Reply(text("All done.")))
    first = await make_engine(tools=tools, persistence=store)
    turn = first.prompt("send it", turn_id="t1")
    await asyncio.wait_for(effects.started.wait(), 5)
    await crash(turn)
    assert first.open_turn is not None

    effects.block = False
    second = await make_engine(tools=tools, persistence=store)
    assert second.open_turn is not None and second.open_turn["turnId"] == "t1"
    assert second.in_flight == {"kind": "tool", "step": 1, "calls": [{"id": "c1", "name": "send"}]}
    assert second.recorded_steps("t1") == {1}
    resumed = second.resume()
    assert resumed is not None and resumed.turn_id == "t1" and resumed.retract_candidates == []
    events, result = await run(resumed)
    assert result.stop_reason == "end_turn" and text_of(events) == "All done."
    if idempotent:
        # rerun under the same execution id, with a diagnostic
        assert effects.runs == [("send", "t1:1:c1"), ("send", "t1:1:c1")]
        assert [e["type"] for e in events[:2]] == ["tool_start", "tool_end"]
        assert events[1]["content"] == "send done" and not events[1]["isError"]
        assert diagnostics.of("tool.rerun")[0]["executionId"] == "t1:1:c1"
    else:
        # never twice: answered to the model as possibly partly run
        assert effects.runs == [("send", "t1:1:c1")]
        assert events[0]["type"] == "tool_end" and events[0]["isError"]
        assert "may have partly run" in events[0]["content"]
        assert not diagnostics.of("tool.rerun")
    last = model.requests[-1]
    assert contents(last)[-1] == ("user", RESUME_NOTICE)
    assert [m["role"] for m in last.body["messages"]] == ["user", "assistant", "tool", "user"]
    assert second.open_turn is None


async def test_a_crash_right_after_the_intent_barrier(model: ScriptedModel, make_engine: Any) -> None:
    effects = Effects()
    effects.block = False
    tools = [effects.tool("send", idempotent=False), effects.tool("read", idempotent=True)]
    store = CrashStore(stall_barrier=2)  # the turn's first record, then the intent
    model.script(Reply(tool_call("r", "read", {}), tool_call("s", "send", {"to": "x"})), Reply(text("ok")))
    first = await make_engine(tools=tools, persistence=store)
    turn = first.prompt("go", turn_id="t2")
    await asyncio.wait_for(store.stalled.wait(), 5)
    await crash(turn)
    store.kill_stalled()
    assert ("send", "t2:1:s") not in effects.runs  # the writer never started: its ack never came

    asked: list[dict[str, Any]] = []
    second = await make_engine(tools=tools, persistence=store)
    resumed = second.resume(on_ambiguous=lambda call: asked.append(call) or "no")
    assert resumed is not None
    events, result = await run(resumed)
    assert result.stop_reason == "end_turn"
    assert asked == [{"executionId": "t2:1:s", "name": "send", "input": {"to": "x"}}]
    ends = {e["id"]: e for e in events if e["type"] == "tool_end"}
    assert ends["s"]["isError"] and "may have partly run" in ends["s"]["content"]
    # The read's result may have been stored in the intent's batch (then it is not run again).
    assert "r" not in ends or not ends["r"]["isError"]
    assert effects.runs.count(("send", "t2:1:s")) == 0


async def test_on_ambiguous_rerun_and_no_rerun(model: ScriptedModel, make_engine: Any) -> None:
    effects = Effects()
    tools = [effects.tool("send", idempotent=False), effects.tool("read", idempotent=True)]
    store = CrashStore()
    model.script(Reply(tool_call("s", "send", {"to": "a"})), Reply(text("sent")))
    turn = (await make_engine(tools=tools, persistence=store)).prompt("one", turn_id="t3")
    await asyncio.wait_for(effects.started.wait(), 5)
    await crash(turn)
    effects.block = False
    second = await make_engine(tools=tools, persistence=store)
    resumed = second.resume(on_ambiguous=lambda call: "rerun")
    assert resumed is not None
    events, result = await run(resumed)
    assert effects.runs == [("send", "t3:1:s"), ("send", "t3:1:s")]
    assert result.stop_reason == "end_turn"

    # no_rerun answers even an idempotent call as possibly run
    effects.block = True
    effects.started.clear()
    model.script(Reply(tool_call("r", "read", {})), Reply(text("read")))
    turn = second.prompt("two", turn_id="t4")
    await asyncio.wait_for(effects.started.wait(), 5)
    await crash(turn)
    third = await make_engine(tools=tools, persistence=store)
    resumed = third.resume(no_rerun=True)
    assert resumed is not None
    events, result = await run(resumed)
    assert events[0]["type"] == "tool_end" and events[0]["isError"]
    assert effects.runs.count(("read", "t4:1:r")) == 1


async def test_a_finished_call_keeps_its_result(model: ScriptedModel, make_engine: Any) -> None:
    runs: list[str] = []
    gate = asyncio.Event()
    fast_done = asyncio.Event()

    async def fast(input: Any, ctx: ToolContext) -> str:
        runs.append("fast")
        fast_done.set()
        return "fast result"

    async def slow(input: Any, ctx: ToolContext) -> str:
        runs.append("slow")
        await gate.wait()
        return "slow result"

    tools = [Tool("fast", "f", SCHEMA, idempotent=True, execute=fast), Tool("slow", "s", SCHEMA, idempotent=True, execute=slow)]
    store = CrashStore()
    model.script(Reply(tool_call("f", "fast", {}), tool_call("s", "slow", {})), Reply(text("both")))
    first = await make_engine(tools=tools, persistence=store)
    turn = first.prompt("go")
    await asyncio.wait_for(fast_done.wait(), 5)
    await first.core.journal.flush()  # the fast result is stored
    await crash(turn)
    gate.set()
    second = await make_engine(tools=tools, persistence=store)
    assert second.in_flight is not None and [c["id"] for c in second.in_flight["calls"]] == ["s"]
    resumed = second.resume()
    assert resumed is not None
    events, result = await run(resumed)
    assert runs == ["fast", "slow", "slow"]
    tool_msgs = [m for m in model.requests[-1].body["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in tool_msgs] == [("f", "fast result"), ("s", "slow result")]


async def test_a_crash_mid_stream_retracts_the_step(model: ScriptedModel, make_engine: Any,
                                                    diagnostics: Diagnostics) -> None:
    store = CrashStore()
    model.script(Reply(text("half of "), hold("h"), text("it")), Reply(text("fresh answer")))
    first = await make_engine(persistence=store)
    turn = first.prompt("q", turn_id="t5")
    events = aiter(turn)  # kept open: closing it early would cancel the turn
    assert (await anext(events))["delta"] == "half of "
    await crash(turn)
    model.release("h")
    second = await make_engine(persistence=store)
    assert second.in_flight == {"kind": "model", "step": 1, "calls": []}
    assert second.recorded_steps("t5") == set()
    resumed = second.resume(next_step=7)
    assert resumed is not None and resumed.retract_candidates == [1]
    events, result = await run(resumed)
    assert result.stop_reason == "end_turn"
    assert [(e["delta"], e["step"]) for e in events] == [("fresh answer", 7)]
    assert contents(model.requests[-1]) == [("user", "q"), ("user", RESUME_NOTICE)]
    assert second.recorded_steps("t5") == {7}


async def test_two_engines_on_one_store_the_stale_one_is_fenced(model: ScriptedModel, make_engine: Any) -> None:
    store = MemoryPersistence()
    stale = await make_engine(persistence=store)
    current = await make_engine(persistence=store)
    model.script(Reply(text("first")))
    await run(current.prompt("hello"))
    records = len(store.records)

    _, result = await run(stale.prompt("me too"))
    assert result.stop_reason == "error" and result.error is not None
    assert result.error["code"] == "FX_JOURNAL_APPEND_FAILED"
    assert result.error["cause"]["code"] == "FX_FENCED"
    assert len(model.requests) == 1  # the stale engine never reached the model
    assert len(store.records) == records  # and stored nothing
    with pytest.raises(FxJournalAppendError):
        stale.prompt("again")


async def test_a_replaced_engine_stops_at_its_next_write(model: ScriptedModel, make_engine: Any) -> None:
    effects = Effects()
    tools = [effects.tool("read", idempotent=True)]
    store = CrashStore()
    model.script(Reply(tool_call("r", "read", {})), Reply(text("from the new engine")))
    old = await make_engine(tools=tools, persistence=store)
    old_turn = old.prompt("go", turn_id="t6")
    await asyncio.wait_for(effects.started.wait(), 5)
    # a new engine takes the session over while the old one still runs the tool
    new = await make_engine(tools=tools, persistence=store)
    effects.block = False
    resumed = new.resume()
    assert resumed is not None
    await wait_until(lambda: len(model.requests) == 2)
    new_writer = new.core.journal.writer_id
    effects.release.set()  # the old call finishes and tries to record its result
    old_result = await asyncio.wait_for(old_turn.result(), 5)
    assert old_result.stop_reason == "error" and old_result.error is not None
    assert old_result.error["cause"]["code"] == "FX_FENCED"
    events, result = await run(resumed)
    assert result.stop_reason == "end_turn"
    kinds = [k for data in store.appended for k, _ in decode_batch(data)]
    assert kinds.count("tool_result") == 1  # only the new engine's account
    assert new_writer and old.core.journal.failure is not None


async def test_yield_at_stops_before_the_next_request_and_resumes_silently(model: ScriptedModel, make_engine: Any) -> None:
    effects = Effects()
    effects.block = False
    tools = [effects.tool("read", idempotent=True)]
    store = MemoryPersistence()
    model.script(Reply(tool_call("r", "read", {})), Reply(text("after the yield")))
    first = await make_engine(tools=tools, persistence=store)
    events, result = await run(first.prompt("go", yield_at=0, turn_id="t7"))
    assert result.stop_reason == "yielded"
    assert len(model.requests) == 1  # the first request always goes
    assert any({"yield": True} in marks for marks in store.marks)
    assert store.checkpoint is not None  # a checkpoint holds the open turn
    second = await make_engine(tools=tools, persistence=store)
    assert second.open_turn is not None and second.open_turn["yielded"]
    resumed = second.resume()
    assert resumed is not None
    events, result = await run(resumed)
    assert result.stop_reason == "end_turn" and text_of(events) == "after the yield"
    assert RESUME_NOTICE not in str(model.requests[-1].body["messages"])
    assert effects.runs == [("read", "t7:1:r")]


async def test_end_open_turn_and_the_marks(model: ScriptedModel, make_engine: Any) -> None:
    store = MemoryPersistence()
    model.script(Reply(text("x"), hold("h")))
    first = await make_engine(persistence=store)
    turn = first.prompt("q", turn_id="t8")
    await wait_until(lambda: len(model.requests) == 1)
    await crash(turn)
    model.release("h")
    second = await make_engine(persistence=store)
    ended = await second.end_open_turn("cancelled", {"code": "FX_CUTOFF", "message": "cut off 3 times"})
    assert ended is not None and ended.stop_reason == "cancelled"
    assert second.open_turn is None and second.resume() is None
    assert await second.end_open_turn() is None
    flat = [m for marks in store.marks for m in marks]
    assert flat[0] == {"start": "t8"} and flat[-1] == {"end": True}
    repeated = second.prompt("q", turn_id="t8")
    assert (await repeated.result()).repeated


async def test_checkpoint_saved_after_a_turn_and_loaded_with_a_mismatch_reported(
    model: ScriptedModel, make_engine: Any, diagnostics: Diagnostics
) -> None:
    effects = Effects()
    store = MemoryPersistence()
    model.script(Reply(text("one")), Reply(text("two")))
    first = await make_engine(tools=[effects.tool("a", idempotent=True)], persistence=store)
    await run(first.prompt("hi"))
    assert store.checkpoint is not None and store.records == []  # the store trimmed what it covers
    assert diagnostics.of("checkpoint.save")
    second = await make_engine(tools=[effects.tool("a", idempotent=False)], persistence=store)
    mismatch = diagnostics.of("checkpoint.mismatch")
    assert mismatch and mismatch[0]["changed"] == ["toolSchemaHash"]
    await run(second.prompt("again"))
    assert contents(model.requests[-1]) == [("user", "hi"), ("assistant", "one"), ("user", "again")]


async def test_one_append_in_flight_and_idempotency_keys(model: ScriptedModel, make_engine: Any) -> None:
    effects = Effects()
    effects.block = False
    store = CrashStore()
    model.script(Reply(*[tool_call(f"r{i}", "read", {}) for i in range(10)]), Reply(text("ok")))
    engine = await make_engine(tools=[effects.tool("read", idempotent=True)], persistence=store)
    await run(engine.prompt("go"))
    assert store.max_in_flight == 1
    writer = engine.core.journal.writer_id
    seqs = [int(key.split(":")[1]) for key in store.keys]
    assert all(key.startswith(writer + ":") for key in store.keys)
    assert seqs == sorted(set(seqs)) and seqs[0] == 1


async def test_a_newer_journal_or_checkpoint_is_refused(model: ScriptedModel) -> None:
    newer_record = MemoryPersistence()
    await newer_record.append(expected=None, idempotency_key="w:1", data=b"FXJ\x02" + msgpack.packb(["batch", {}]),
                              barrier=True, marks=[])
    with pytest.raises(FxJournalVersionError):
        await create_engine(model.model_id, provider=model.provider, persistence=newer_record)

    newer_body = MemoryPersistence()
    body = {"v": FORMAT_VERSION + 1, "seq": 1, "events": []}
    await newer_body.append(expected=None, idempotency_key="w:1", data=b"FXJ\x01" + msgpack.packb(["batch", body]),
                            barrier=True, marks=[])
    with pytest.raises(FxJournalVersionError):
        await create_engine(model.model_id, provider=model.provider, persistence=newer_body)

    checkpoint = b"FXJ\x01" + msgpack.packb(["checkpoint", {"v": 9, "state": {}}])
    with pytest.raises(FxJournalVersionError):
        await create_engine(model.model_id, provider=model.provider, checkpoint=checkpoint)


async def test_a_new_prompt_ends_a_turn_left_open(model: ScriptedModel, make_engine: Any) -> None:
    store = CrashStore()
    model.script(Reply(text("x"), hold("h")), Reply(text("fresh")))
    first = await make_engine(persistence=store)
    turn = first.prompt("old", turn_id="t9")
    await wait_until(lambda: len(model.requests) == 1)
    await crash(turn)
    model.release("h")
    second = await make_engine(persistence=store)
    _, result = await run(second.prompt("new"))
    assert result.stop_reason == "end_turn"
    ends = [b for data in store.appended for k, b in decode_batch(data) if k == "turn_end"]
    assert ends[0]["stopReason"] == "cancelled" and ends[0]["error"]["code"] == "FX_TURN_INTERRUPTED"
    assert contents(model.requests[-1]) == [("user", "old"), ("user", "new")]


async def test_close_does_not_wait_for_a_stalled_append(model: ScriptedModel, make_engine: Any) -> None:
    store = CrashStore(stall_barrier=1)
    engine = await make_engine(persistence=store)
    turn = engine.prompt("q")
    await asyncio.wait_for(store.stalled.wait(), 5)
    await crash(turn)
    await asyncio.wait_for(engine.close(), 2)
    assert model.requests == []  # the first record never acknowledged: nothing was sent
    store.kill_stalled()
