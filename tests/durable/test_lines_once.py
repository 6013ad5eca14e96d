"""Every line stored exactly once, and a turn's end line with its end record (§4, §11.7).

Lost replies: the store is wrapped to lose the reply of a call *after* it ran (what a
Redis restart right after executing does); the writer's retry, or its next write, must
not store those lines again.

End lines: embedded store and one in-process worker; the store is wrapped to note every
append that succeeded (what it carried, not how it ran). Whichever way a turn ends or
yields, its `turn_end` / `turn_yield` line is the last line of the call that stores the
engine's end / yield record, and no other call carries one: both are stored or neither.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fxengine.testing import Reply, ScriptedModel, tool_call
from fxengine.tools import Tool
from fxworker import Agent, Settings, embedded
from fxworker.errors import FxStoreUnavailableError
from fxworker.ids import now_ms
from fxworker.store.persistence import LineWriter, StorePersistence
from fxworker.store import RedisStore, memory_store
from fxworker.embedded import InProcessWaker
from tests.durable.conftest import last_message_text, responder
from tests.durable.tooling import provider, tools
from tests.support.workers import wait_until


class LostReplies:
    """The store; the next `lose` appends run, then their reply is lost."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self.lose = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append(self, session_id: str, epoch: int, **kwargs: Any) -> Any:
        appended = await self._store.append(session_id, epoch, **kwargs)
        if self.lose > 0:
            self.lose -= 1
            raise FxStoreUnavailableError("the reply was lost (the call ran)")
        return appended


async def _claimed() -> tuple[LostReplies, str, Any]:
    store = LostReplies(memory_store())
    sid = "s1"
    await store.accept(sid, agent="default", message_id="m1", input="hi")
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    return store, sid, claim


def _deltas(lines: list[dict[str, Any]]) -> list[str]:
    return [line["delta"] for line in lines if line["type"] == "text_delta"]


async def test_a_retried_line_flush_stores_its_lines_once() -> None:
    store, sid, claim = await _claimed()
    writer = LineWriter(store, sid, claim.epoch, lease_due_ms=lambda: now_ms() + 10_000)
    writer.push({"type": "text_delta", "messageId": "m1", "step": 1, "delta": "a"})
    writer.push({"type": "tool_start", "messageId": "m1", "id": "c1", "name": "t", "input": {}})
    store.lose = 2  # the first try and its first retry ran; the second retry is answered
    await writer.flush()
    lines = await store.read_lines(sid, 0)
    assert [line["type"] for line in lines] == ["text_delta", "tool_start"]
    assert [line["cursor"] for line in lines] == [1, 2]
    await store.aclose()


async def test_a_batch_that_may_have_run_is_resent_under_its_key_before_newer_lines() -> None:
    store, sid, claim = await _claimed()
    due = {"ms": now_ms()}  # the lease is about over: no retry, the failure surfaces
    writer = LineWriter(store, sid, claim.epoch, lease_due_ms=lambda: due["ms"])
    writer.push({"type": "text_delta", "messageId": "m1", "step": 1, "delta": "a"})
    store.lose = 1
    with pytest.raises(FxStoreUnavailableError):
        await writer.flush()
    writer.push({"type": "text_delta", "messageId": "m1", "step": 1, "delta": "b"})
    due["ms"] = now_ms() + 10_000
    await writer.flush()
    assert _deltas(await store.read_lines(sid, 0)) == ["a", "b"]
    # A record's call that ran but lost its reply: the lines that rode with it are held
    # under the record's key, so resent alone they are not stored again.
    persistence = StorePersistence(store, claim, writer=writer)
    writer.push({"type": "text_delta", "messageId": "m1", "step": 2, "delta": "c"})
    due["ms"] = now_ms()
    store.lose = 1
    with pytest.raises(FxStoreUnavailableError):
        await persistence.append(expected=None, idempotency_key="w:0", data=b"r", barrier=False, marks=[])
    due["ms"] = now_ms() + 10_000
    writer.push({"type": "text_delta", "messageId": "m1", "step": 2, "delta": "d"})
    await writer.flush()
    assert _deltas(await store.read_lines(sid, 0)) == ["a", "b", "c", "d"]
    await store.aclose()


class AppendCalls:
    """The store, noting for each append that succeeded its record marks and line types."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: list[tuple[str, list[Any], list[dict[str, Any]]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append(self, session_id: str, epoch: int, **kwargs: Any) -> Any:
        appended = await self._store.append(session_id, epoch, **kwargs)
        marks = [mark for record in kwargs.get("records") or () for mark in record.marks]
        self.calls.append((session_id, marks, [dict(line) for line in kwargs.get("lines") or ()]))
        return appended


def ends_with(calls: list[tuple[str, list[Any], list[dict[str, Any]]]], session_id: str, line_type: str,
              mark: str) -> list[dict[str, Any]]:
    """The `line_type` lines of the session, after checking each rode with a `mark` record."""
    found = []
    for sid, marks, lines in calls:
        if sid != session_id:
            continue
        typed = [line for line in lines if line["type"] == line_type]
        if typed:
            assert len(typed) == 1 and lines[-1] is typed[0], f"{line_type} is not the call's last line: {lines}"
            assert any(mark in m for m in marks), f"{line_type} rode without a {mark!r} record: {marks}"
            found.append(typed[0])
        elif any(mark in m for m in marks):
            raise AssertionError(f"a {mark!r} record was stored without its {line_type} line: {lines}")
    return found


GATE = threading.Event()


async def _gate(input: dict[str, Any], ctx: Any) -> str:
    await asyncio.to_thread(GATE.wait, 10)
    return "opened"


def end_responder(request: Any) -> Reply:
    """The durable tests' model, plus `gate`: a call of the `gate` tool (it returns once the
    test opens `GATE`), so the turn has a model request to yield before."""
    role, last = last_message_text(request)
    if role == "user" and last == "gate":
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "gate", {}))
    return responder(request)


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = end_responder
        yield m


@pytest.fixture
def agent(model: ScriptedModel) -> Iterator[Agent]:
    from fxworker.store import embedded_store

    store = AppendCalls(embedded_store(prefix=f"fxe{uuid.uuid4().hex[:8]}"))
    a = Agent(
        "default", model="scripted", provider=provider(model.base_url), api_key="test-key",
        tools=[*tools(), Tool("gate", "Waits for the test.", {"type": "object", "properties": {}}, idempotent=True,
                              execute=_gate)],
        store=store, waker=InProcessWaker(), settings=Settings(lease_s=2.0, reserve_s=4.0, sweep_s=0.2),
    )
    a.calls = store.calls  # type: ignore[attr-defined]
    embedded.start_embedded_workers(1)
    try:
        yield a
    finally:
        embedded.stop_embedded_workers()
        a.close()


def test_turn_end_rides_with_the_end_record(agent: Agent, model: ScriptedModel) -> None:
    session = agent.blocking_session()
    assert session.prompt("hello").result().stop_reason == "end_turn"
    held = session.prompt("hold:end1")
    model.wait_held("end1", timeout_s=10)
    session.cancel()
    assert held.result().stop_reason == "cancelled"
    model.release("end1")
    # The reader may see the line before the worker's call returned to the spy.
    def both_noted() -> list[dict[str, Any]] | None:
        ends = ends_with(agent.calls, session.id, "turn_end", "end")  # type: ignore[attr-defined]
        return ends if len(ends) == 2 else None

    ends = wait_until(both_noted, 5, what="both end calls noted")
    assert [(ln["messageId"], ln["stopReason"]) for ln in ends] == [
        (ends[0]["messageId"], "end_turn"), (held.message_id, "cancelled")]
    stored = [ln for ln in session.stream(0, follow=False) if ln["type"] == "turn_end"]
    assert [ln["stopReason"] for ln in stored] == ["end_turn", "cancelled"]


def test_turn_yield_rides_with_the_yield_record(agent: Agent, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fxworker.runner")
    session = agent.blocking_session()
    GATE.clear()
    turn = session.prompt("gate")
    wait_until(lambda: any(ln["type"] == "tool_start" for ln in session.stream(0, follow=False)), 10,
               what="the gate tool running")
    embedded.begin_warm_shutdown()  # the turn yields before its next model request
    try:
        wait_until(lambda: f"warm shutdown: {session.id} yields" in caplog.text, 5, what="the runner told to yield")
        GATE.set()
        wait_until(lambda: any(ln["type"] == "turn_yield" for ln in session.stream(0, follow=False)), 10,
                   what="the turn's yield line")
    finally:
        for worker in embedded.embedded_workers():
            worker.stopping.clear()
    assert turn.result().stop_reason == "end_turn"  # a requeued delivery resumes and ends it

    def noted() -> list[dict[str, Any]] | None:
        return ends_with(agent.calls, session.id, "turn_end", "end")  # type: ignore[attr-defined]

    assert [ln["messageId"] for ln in wait_until(noted, 5, what="the end call noted")] == [turn.message_id]
    yields = ends_with(agent.calls, session.id, "turn_yield", "yield")  # type: ignore[attr-defined]
    assert yields and all(ln["messageId"] == turn.message_id for ln in yields)
