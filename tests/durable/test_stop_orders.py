"""A worker stopped while it runs a turn (`stop_embedded_workers`: its loop closes), on the
embedded store (the same Lua) with an in-process worker (§5, §7).

A stopping worker lets its turns go as they stand: it writes nothing more (no `turn_end`
`cancelled`, no line of a record whose call it cut short) and leaves the lease to expire,
so the next worker resumes the turn, or starts the input, and each input ends once."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest

from fxengine.testing import ScriptedModel
from fxworker import Agent, embedded
from tests.durable.conftest import embedded_agent, stored_lines, wait_idle

IDLE_TIMEOUT_S = 15.0


async def _stop_workers() -> None:
    """Stops the embedded workers from another thread (as an application's shutdown does)."""
    await asyncio.to_thread(embedded.stop_embedded_workers)


async def test_a_stop_during_the_first_record_writes_nothing_and_the_prompt_runs_once(
    model: ScriptedModel, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with embedded_agent(model) as agent:
        in_flight = threading.Event()
        append = agent.store.append

        async def gated(session_id: str, epoch: int, **kwargs: Any) -> Any:
            records = kwargs.get("records") or []
            if epoch == 1 and any({"start": "p1"} in record.marks for record in records):
                in_flight.set()
                await asyncio.Event().wait()  # the turn's first record call, cut short by the stop
            return await append(session_id, epoch, **kwargs)

        monkeypatch.setattr(agent.store, "append", gated)
        session = agent.session()
        turn = await session.prompt("hi", message_id="p1")
        assert await asyncio.to_thread(in_flight.wait, IDLE_TIMEOUT_S)
        await _stop_workers()
        # The stopped worker's epoch wrote nothing: no start line without its record, no end.
        assert await stored_lines(agent, session.id) == []
        embedded.start_embedded_workers(1)  # the next claim, once the lease expired
        await wait_idle(agent, session.id, timeout_s=IDLE_TIMEOUT_S)
        assert (await asyncio.wait_for(turn.result(), IDLE_TIMEOUT_S)).stop_reason == "end_turn"
        lines = await stored_lines(agent, session.id)
        ends = [(line["messageId"], line["stopReason"]) for line in lines if line["type"] == "turn_end"]
        assert ends == [("p1", "end_turn")], lines
        assert Counter(line["messageId"] for line in lines if line["type"] == "turn_start") == {"p1": 1}, lines


async def test_a_stop_during_a_model_request_leaves_the_turn_to_the_next_worker(
    model: ScriptedModel,
) -> None:
    with embedded_agent(model) as agent:
        session = agent.session()
        turn = await session.prompt("hold:stop", message_id="p1")
        await asyncio.to_thread(model.wait_held, "stop", IDLE_TIMEOUT_S)
        await _stop_workers()
        lines = await stored_lines(agent, session.id)
        assert [line["type"] for line in lines if line["type"] in ("turn_end", "turn_yield")] == [], lines
        model.release("stop")
        embedded.start_embedded_workers(1)
        await wait_idle(agent, session.id, timeout_s=IDLE_TIMEOUT_S)
        assert (await asyncio.wait_for(turn.result(), IDLE_TIMEOUT_S)).stop_reason == "end_turn"
        lines = await stored_lines(agent, session.id)
        ends = [(line["messageId"], line["stopReason"]) for line in lines if line["type"] == "turn_end"]
        assert ends == [("p1", "end_turn")], lines
        assert [line["type"] for line in lines if line["type"] in ("turn_start", "turn_resume")] == [
            "turn_start", "turn_resume"], lines
