from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from fxengine import MemoryPersistence, Tool, ToolContext
from fxengine.testing import Reply, ScriptedModel, text, tool_call

from .conftest import run

SCHEMA = {"type": "object", "properties": {"i": {"type": "integer"}}}
WORK_S = 0.08


class Timeline:
    """Start and end times each tool call records, to measure overlap."""

    def __init__(self) -> None:
        self.spans: dict[str, tuple[float, float]] = {}
        self.running = 0
        self.max_running = 0

    def tool(
        self, name: str, *, idempotent: bool, writes: bool | None = None, sync: bool = False,
        together: threading.Barrier | None = None,
    ) -> Tool:
        """A tool that records its span; a sync one given `together` also waits there until
        all the barrier's parties run at once (it breaks, and the call fails, otherwise)."""
        timeline = self

        async def execute(input: dict[str, Any], ctx: ToolContext) -> str:
            start = time.monotonic()
            timeline.running += 1
            timeline.max_running = max(timeline.max_running, timeline.running)
            await asyncio.sleep(WORK_S)
            timeline.running -= 1
            timeline.spans[f"{name}{input['i']}"] = (start, time.monotonic())
            return "done"

        def execute_sync(input: dict[str, Any], ctx: ToolContext) -> str:
            start = time.monotonic()
            if together is not None:
                together.wait()
            time.sleep(WORK_S)
            timeline.spans[f"{name}{input['i']}"] = (start, time.monotonic())
            return "done"

        return Tool(name, name, SCHEMA, idempotent=idempotent, writes=writes, execute=execute_sync if sync else execute)


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


async def test_sixteen_idempotent_calls_overlap_while_a_writer_runs_alone(model: ScriptedModel, make_engine: Any) -> None:
    timeline = Timeline()
    tools = [timeline.tool("read", idempotent=True), timeline.tool("write", idempotent=True, writes=True)]
    calls = [tool_call(f"r{i}", "read", {"i": i}) for i in range(16)]
    calls += [tool_call("w0", "write", {"i": 0})]
    calls += [tool_call(f"r{i}", "read", {"i": i}) for i in range(16, 18)]
    model.script(Reply(*calls), Reply(text("ok")))
    engine = await make_engine(tools=tools, persistence=MemoryPersistence())
    started = time.monotonic()
    events, result = await run(engine.prompt("go"))
    elapsed = time.monotonic() - started
    assert result.stop_reason == "end_turn"

    first = [timeline.spans[f"read{i}"] for i in range(16)]
    writer = timeline.spans["write0"]
    later = [timeline.spans[f"read{i}"] for i in (16, 17)]
    # the 16 reads were all running at one instant
    assert max(s for s, _ in first) < min(e for _, e in first)
    # the writer overlaps nothing, starts after every earlier call and before every later one
    assert not any(overlaps(writer, span) for span in first + later)
    assert writer[0] >= max(e for _, e in first) and all(s >= writer[1] for s, _ in later)
    # three waves of work, not 19 one after another
    assert elapsed < 19 * WORK_S
    # results reach the model in call order
    tool_ids = [m["tool_call_id"] for m in model.requests[1].body["messages"] if m["role"] == "tool"]
    assert tool_ids == [f"r{i}" for i in range(16)] + ["w0", "r16", "r17"]


async def test_at_most_sixteen_calls_run_at_once(model: ScriptedModel, make_engine: Any) -> None:
    timeline = Timeline()
    model.script(Reply(*[tool_call(f"r{i}", "read", {"i": i}) for i in range(24)]), Reply(text("ok")))
    engine = await make_engine(tools=[timeline.tool("read", idempotent=True)])
    _, result = await run(engine.prompt("go"))
    assert result.stop_reason == "end_turn"
    assert timeline.max_running == 16
    assert len(timeline.spans) == 24


async def test_sync_tools_overlap_on_threads_and_non_idempotent_ones_run_alone(
    model: ScriptedModel, make_engine: Any
) -> None:
    timeline = Timeline()
    # The 16 reads meet at a barrier: it lets them go only if all 16 run at one instant,
    # whatever the machine's load does to their start times.
    together = threading.Barrier(16, timeout=10)
    tools = [timeline.tool("read", idempotent=True, sync=True, together=together),
             timeline.tool("send", idempotent=False, sync=True)]
    model.script(
        Reply(*[tool_call(f"r{i}", "read", {"i": i}) for i in range(16)], tool_call("s0", "send", {"i": 0}),
              tool_call("s1", "send", {"i": 1})),
        Reply(text("ok")),
    )
    engine = await make_engine(tools=tools)
    loop_ticks = 0

    async def ticker() -> None:
        nonlocal loop_ticks
        while True:
            await asyncio.sleep(0.01)
            loop_ticks += 1

    tick = asyncio.create_task(ticker())
    _, result = await run(engine.prompt("go"))
    tick.cancel()
    assert result.stop_reason == "end_turn"
    assert not together.broken, "the 16 idempotent sync calls did not all run at once"
    reads = [timeline.spans[f"read{i}"] for i in range(16)]
    sends = [timeline.spans["send0"], timeline.spans["send1"]]
    assert not overlaps(sends[0], sends[1])
    assert not any(overlaps(s, r) for s in sends for r in reads)
    assert loop_ticks >= 5  # the event loop kept running while sync tools slept


class SlowBarrierStore(MemoryPersistence):
    """Holds the second barrier append (a tool's intent) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.holding = asyncio.Event()
        self.barriers_acked: list[float] = []
        self._barriers = 0

    async def append(self, **kwargs: Any) -> str:
        if kwargs["barrier"]:
            self._barriers += 1
            if self._barriers == 2:
                self.holding.set()
                await self.release.wait()
        cursor = await super().append(**kwargs)
        if kwargs["barrier"]:
            self.barriers_acked.append(time.monotonic())
        return cursor


async def test_a_tool_with_effects_starts_only_after_its_intent_is_durable(model: ScriptedModel, make_engine: Any) -> None:
    started: list[float] = []
    tool_started = asyncio.Event()
    loop = asyncio.get_running_loop()

    def send(input: dict[str, Any], ctx: ToolContext) -> str:
        started.append(time.monotonic())
        loop.call_soon_threadsafe(tool_started.set)
        return "sent"

    store = SlowBarrierStore()
    model.script(Reply(text("sending"), tool_call("s", "send", {"i": 1})), Reply(text("ok")))
    engine = await make_engine(tools=[Tool("send", "s", SCHEMA, idempotent=False, execute=send)], persistence=store)
    turn = engine.prompt("go")
    await asyncio.wait_for(store.holding.wait(), 5)
    # the intent record is held: the call must not start (a wrongly eager tool would now)
    try:
        await asyncio.wait_for(tool_started.wait(), 0.2)
    except TimeoutError:
        pass
    assert started == []
    store.release.set()
    _, result = await run(turn)
    assert result.stop_reason == "end_turn"
    assert len(started) == 1 and started[0] >= store.barriers_acked[1]
    assert store.marks[0][0] == {"start": turn.turn_id}
