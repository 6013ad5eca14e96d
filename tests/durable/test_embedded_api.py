"""The Python API on the embedded store (fakeredis + in-process workers, no Celery)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from fxengine.testing import ScriptedModel
from fxworker import Agent, FxAgentExistsError, Settings, get_agent
from fxworker import embedded
from fxworker.embedded import InProcessWaker
from tests.durable.tooling import provider, tools


@pytest.fixture
def agent(model: ScriptedModel) -> Iterator[Agent]:
    from fxworker.store import embedded_store

    events: list[dict[str, Any]] = []
    a = Agent(
        "default",
        model="scripted",
        provider=provider(model.base_url),
        tools=tools(),
        api_key="test-key",
        store=embedded_store(prefix=f"fxe{uuid.uuid4().hex[:8]}"),
        waker=InProcessWaker(),
        settings=Settings(lease_s=2.0, reserve_s=4.0, sweep_s=0.5),
        on_event=events.append,
    )
    a.events = events  # type: ignore[attr-defined]
    embedded.start_embedded_workers(1)
    try:
        yield a
    finally:
        embedded.stop_embedded_workers()
        a.close()


async def test_prompt_streams_events_and_ends(agent: Agent) -> None:
    session = agent.session()
    assert session.id.startswith("fxs_")
    turn = await session.prompt("hi")
    assert turn.session_id == session.id and turn.repeated is False
    events = [e async for e in turn]
    assert "".join(e["delta"] for e in events if e["type"] == "text_delta") == "echo:hi"
    result = await turn.result()
    assert result.stop_reason == "end_turn" and result.repeated is False
    state = await session.state()
    assert state["status"] == "idle" and state["agent"] == "default" and state["turns"] == 1


async def test_a_turn_that_ends_lets_the_session_go_with_its_turn_end(agent: Agent) -> None:
    """The end record of a turn with nothing after it releases the session in the same
    store call (§5, release with the end): once a sender reads `turn_end`, the lease is
    free, so the next prompt's own wake claims it; none finds the lease held."""
    session = agent.session()
    for i in range(5):
        result = await (await session.prompt(f"turn {i}")).result()
        assert result.stop_reason == "end_turn"
        state = await agent.store.state(session.id)
        assert state.lease_holder is None and state.status == "idle", state
    assert state.turns == 5 and state.epoch == 5  # one claim a turn
    assert [e for e in agent.events if e["type"] == "session.redelivered"] == []  # type: ignore[attr-defined]


async def test_a_session_at_rest_keeps_its_turns_packed_and_reads_them_back(agent: Agent, model: ScriptedModel) -> None:
    """Each end record lets the session go with the checkpoint through it and the claim's
    lines packed (§5 "Packed at rest"): at rest there is no log, one `ui` entry a turn, and
    every line reads back as the turns streamed it, from any cursor; the next turn loads
    the conversation from the checkpoint alone."""
    import json

    from fxworker.store._packed import CHECKPOINT_MAGIC

    session = agent.session(context={"user": "u1"})
    streamed: list[dict[str, Any]] = []
    for i in range(3):
        turn = await session.prompt(f"send:bob{i}")
        streamed += [json.loads(chunk) async for chunk in turn.ndjson()]
        assert streamed[-1]["type"] == "turn_end"
    keys = agent.store.core.keys(session.id)
    client = agent.store.client
    entries = await client.xrange(keys.ui)
    ends = [line["cursor"] for line in streamed if line["type"] == "turn_end"]
    assert [int(entry_id.split(b"-")[0]) for entry_id, _ in entries] == ends
    assert all(set(fields) == {b"f", b"z", b"a"} for _, fields in entries)  # Adler-32: fakeredis has no SHA-1
    assert not await client.exists(keys.log, keys.rest)
    assert (await client.hget(keys.ckpt, "data")).startswith(CHECKPOINT_MAGIC)
    assert [line async for line in session.stream(0, follow=False)] == streamed
    assert [line async for line in session.stream(ends[0] - 1, follow=False)] == streamed[ends[0] - 1:]
    # The conversation goes on from the checkpoint: the model is sent every earlier turn.
    result = await (await session.prompt("hi")).result()
    assert result.stop_reason == "end_turn"
    sent = json.dumps(model.requests[-1].body["messages"])
    assert all(f"send:bob{i}" in sent for i in range(3)) and "hi" in sent
    assert (await agent.store.load(session.id)).journal == []


async def test_a_tool_turn_streams_tool_lines_and_ndjson(agent: Agent) -> None:
    session = agent.session(context={"user": "u1"})
    turn = await session.prompt("send:bob")
    chunks = [c async for c in turn.ndjson()]
    assert all(c.endswith(b"\n") for c in chunks)
    import json

    lines = [json.loads(c) for c in chunks]
    types = [ln["type"] for ln in lines]
    assert types[0] == "turn_start" and types[-1] == "turn_end"
    assert "tool_start" in types and "tool_end" in types
    end = lines[-1]
    assert end["stopReason"] == "end_turn"
    assert all("cursor" in ln for ln in lines)


async def test_a_repeated_message_id_runs_nothing_new(agent: Agent, model: ScriptedModel) -> None:
    session = agent.session()
    first = await session.prompt("once", message_id="mid-1")
    assert (await first.result()).stop_reason == "end_turn"
    n = len(model.requests)
    again = await session.prompt("once", message_id="mid-1")
    assert again.repeated is True
    result = await again.result()
    assert result.repeated is True and result.stop_reason == "end_turn"
    assert len(model.requests) == n


async def test_stream_resumes_from_any_cursor(agent: Agent) -> None:
    session = agent.session()
    await (await session.prompt("one")).result()
    await (await session.prompt("two")).result()
    every = [ln async for ln in session.stream(0, follow=False)]
    cursors = [ln["cursor"] for ln in every]
    assert cursors == sorted(set(cursors))
    for i, c in enumerate(cursors):
        rest = [ln async for ln in session.stream(c, follow=False)]
        assert rest == every[i + 1 :]


def test_the_blocking_session_is_the_same_api(agent: Agent) -> None:
    session = agent.blocking_session()
    turn = session.prompt("blocking")
    assert "".join(e["delta"] for e in turn if e["type"] == "text_delta") == "echo:blocking"
    assert turn.result().stop_reason == "end_turn"
    assert session.state()["status"] == "idle"
    assert [ln["type"] for ln in session.stream(0, follow=False)][-1] == "turn_end"


async def test_resume_of_an_idle_session_answers_idle(agent: Agent) -> None:
    session = agent.session()
    await (await session.prompt("x")).result()
    turn = await session.resume()
    assert (await turn.result()).stop_reason == "idle"


def test_agents_register_by_name(agent: Agent) -> None:
    assert get_agent("default") is agent
    with pytest.raises(FxAgentExistsError):
        Agent("default", model="scripted")
