"""A resume reads only the open turn's lines, however long the session (§4 retract, §5).

Embedded store and in-process workers: a session with many ended turns, then a turn cut
off mid-stream by a killed worker; the worker that takes it over looks for the steps the
stream already shows from the open turn's start line (`Claim.turn_cursor`), not from 0.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fxengine.testing import ScriptedModel
from fxworker import Agent, Settings, embedded
from fxworker.embedded import InProcessWaker
from tests.durable.tooling import provider, tools
from tests.support.workers import wait_until

EARLIER_TURNS = 40


class LineReads:
    """The store, with a count of the UI lines each `read_lines` call of a worker thread returned."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.reads: list[tuple[str, int, int]] = []  # (thread, cursor, lines returned)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def read_lines(self, session_id: str, cursor: int, **kwargs: Any) -> list[dict[str, Any]]:
        lines = await self._store.read_lines(session_id, cursor, **kwargs)
        thread = threading.current_thread().name
        if thread.startswith("fx-embedded"):
            self.reads.append((thread, cursor, len(lines)))
        return lines


@pytest.fixture
def agent(model: ScriptedModel) -> Iterator[Agent]:
    from fxworker.store import embedded_store

    store = LineReads(embedded_store(prefix=f"fxr{uuid.uuid4().hex[:8]}"))
    a = Agent(
        "default", model="scripted", provider=provider(model.base_url), tools=tools(), api_key="test-key",
        store=store, waker=InProcessWaker(), settings=Settings(lease_s=1.0, reserve_s=4.0, sweep_s=0.2),
    )
    a.reads = store.reads  # type: ignore[attr-defined]
    embedded.start_embedded_workers(1)
    try:
        yield a
    finally:
        embedded.stop_embedded_workers()
        a.close()


def test_a_resume_reads_only_the_open_turns_lines(agent: Agent, model: ScriptedModel) -> None:
    session = agent.blocking_session()
    for n in range(EARLIER_TURNS):
        assert session.prompt(f"turn {n}").result().stop_reason == "end_turn"
    history = list(session.stream(0, follow=False))
    turn = session.prompt("hold:long1")
    model.wait_held("long1", timeout_s=10)
    start = wait_until(lambda: next((ln for ln in session.stream(0, follow=False) if ln["type"] == "turn_start"
                                     and ln["messageId"] == turn.message_id), None), 5, what="the turn's start line")
    wait_until(lambda: any(ln["type"] == "text_delta" and ln["messageId"] == turn.message_id
                           for ln in session.stream(0, follow=False)), 5, what="the partial text stored")
    open_lines = [ln for ln in session.stream(0, follow=False) if ln["cursor"] > start["cursor"]]  # type: ignore[index]
    del agent.reads[:]  # type: ignore[attr-defined]
    embedded.kill_embedded_worker(0)  # its replacement takes the turn over once the lease is dead
    resumed = wait_until(lambda: next((ln for ln in session.stream(0, follow=False) if ln["type"] == "turn_resume"),
                                      None), 10, what="turn_resume")
    model.release("long1")
    assert turn.result().stop_reason == "end_turn"
    assert resumed["retract"] == [1]  # type: ignore[index]
    reads = [r for r in agent.reads if r[0] == "fx-embedded-0r"]  # type: ignore[attr-defined]
    read_from = {cursor for _, cursor, n in reads if n}
    lines_read = sum(n for _, _, n in reads)
    print(f"resume after {len(history)} lines of history read {lines_read} lines from cursor {sorted(read_from)}")
    assert len(history) >= 3 * EARLIER_TURNS
    assert read_from == {start["cursor"]}  # type: ignore[index]
    assert lines_read == len(open_lines) == 1  # the partial text; nothing of the 40 turns before
