"""Stored values that no longer decode (§5 "Packed at rest") are a session's error, never a
process's loop: with a real worker on the embedded store (the same Lua), a checkpoint
cut short ends the prompt that meets it FX_JOURNAL_INVALID once, in at most two claims,
and the export raises the same code; a damaged line chunk is FX_SESSION_INCOMPLETE to
every reader."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import fakeredis
import httpx
import pytest

from fxengine.codes import Code
from fxengine.errors import FxJournalError
from fxengine.testing import ScriptedModel
from fxworker import Agent, Settings
from fxworker.errors import FxSessionIncompleteError
from fxworker.keys import session_keys
from fxworker.store._packed import CHECKPOINT_MAGIC
from fxworker.store.embedded import shared_server
from tests.durable.conftest import embedded_agent

END_TIMEOUT_S = 15.0


@pytest.fixture
def agent(model: ScriptedModel) -> Iterator[Agent]:
    with embedded_agent(model) as a:
        yield a


async def _at_rest(agent: Agent, text: str) -> tuple[Any, Any]:
    """A session that ran one turn and went at rest: (session, its keys)."""
    session = agent.session()
    turn = await session.prompt(text)
    assert (await asyncio.wait_for(turn.result(), END_TIMEOUT_S)).stop_reason == "end_turn"
    return session, session_keys(agent.prefix, session.id)  # type: ignore[attr-defined]


async def test_a_checkpoint_cut_short_ends_the_prompt_once_in_at_most_two_claims(agent: Agent) -> None:
    session, keys = await _at_rest(agent, "a conversation long enough to be stored compressed " * 8)
    admin = fakeredis.FakeRedis(server=shared_server())
    stored = admin.hget(keys.ckpt, "data")
    assert stored is not None and stored.startswith(CHECKPOINT_MAGIC)
    admin.hset(keys.ckpt, "data", stored[: len(stored) // 2])
    before = (await agent.store.state(session.id)).epoch

    claims = []
    turns = []
    for text in ("meets the damaged checkpoint", "and so does the next prompt"):
        turn = await session.prompt(text)
        result = await asyncio.wait_for(turn.result(), END_TIMEOUT_S)
        assert result.stop_reason == "error" and result.error["code"] == Code.JOURNAL_INVALID, result
        state = await agent.store.state(session.id)
        assert state.status == "idle"
        claims.append(state.epoch - before)
        before = state.epoch
        turns.append(turn)
    print(f"claims to end each prompt: {claims}")
    assert all(n <= 2 for n in claims), claims
    lines = await agent.store.read_lines(session.id, 0, count=10_000)
    for message_id in (turn.message_id for turn in turns):
        ends = [line for line in lines if line.get("messageId") == message_id and line["type"] == "turn_end"]
        errors = [line for line in lines if line.get("messageId") == message_id and line["type"] == "session_error"]
        assert len(ends) == 1 and len(errors) == 1, lines
    with pytest.raises(FxJournalError) as raised:
        await session.checkpoint()
    assert raised.value.code == Code.JOURNAL_INVALID
    await asyncio.sleep(1.5)  # nothing claims it again: the epoch stays where it is
    assert (await agent.store.state(session.id)).epoch == state.epoch
    admin.close()


async def test_a_damaged_chunk_is_incomplete_to_the_stream_never_other_lines(agent: Agent) -> None:
    session, keys = await _at_rest(agent, "hello")
    admin = fakeredis.FakeRedis(server=shared_server())
    [(entry_id, fields)] = admin.xrange(keys.ui)
    assert b"z" in fields and b"a" in fields  # the embedded store's Lua has no SHA-1
    z = fields[b"z"]
    admin.delete(keys.ui)
    admin.xadd(keys.ui, {**fields, b"z": z[: len(z) // 2]}, id=entry_id)
    with pytest.raises(FxSessionIncompleteError):
        async for _ in session.stream(0, follow=False):
            pass
    admin.close()


async def test_a_damaged_chunk_is_said_by_the_http_stream_the_timeline_and_fx_tail(agent: Agent) -> None:
    """Over HTTP: the stream ends with a `session_error` line carrying the code (its status
    was sent already), the timeline answers 410 with it, and `fx tail` names it and exits
    3 instead of reconnecting until FX_CONNECT."""
    from click.testing import CliRunner

    from fxworker.cli import main
    from fxworker.web import create_app
    from fxworker.web.client import ApiClient, ApiError
    from tests.web._inprocess import ThreadServer

    session, keys = await _at_rest(agent, "hello")
    admin = fakeredis.FakeRedis(server=shared_server())
    [(entry_id, fields)] = admin.xrange(keys.ui)
    admin.delete(keys.ui)
    z = fields[b"z"]
    admin.xadd(keys.ui, {**fields, b"z": z[:-2]}, id=entry_id)
    admin.close()
    app = create_app(agents={"default": agent}, settings=Settings(prefix=agent.prefix))  # type: ignore[attr-defined]

    def over_http(url: str) -> None:
        with httpx.Client(base_url=url, timeout=10.0) as http:
            streamed = http.get(f"/v1/sessions/{session.id}/stream", params={"follow": "0"})
            lines = [json.loads(raw) for raw in streamed.text.splitlines() if raw.strip()]
            assert streamed.status_code == 200 and lines and lines[-1]["type"] == "session_error", lines
            assert lines[-1]["code"] == Code.SESSION_INCOMPLETE and "cursor" not in lines[-1]
            timeline = http.get(f"/v1/sessions/{session.id}/timeline")
            assert timeline.status_code == 410 and timeline.json()["error"]["code"] == Code.SESSION_INCOMPLETE
        client = ApiClient(url)
        for follow in (False, True):
            with pytest.raises(ApiError) as raised:
                list(client.tail(session.id, follow=follow))
            assert raised.value.code == Code.SESSION_INCOMPLETE, raised.value
        client.close()
        result = CliRunner().invoke(main, ["tail", session.id, "--url", url, "--no-follow"])
        assert result.exit_code == 3, result.output
        assert "FX_SESSION_INCOMPLETE" in result.output and "FX_CONNECT" not in result.output, result.output

    with ThreadServer(app) as url:
        await asyncio.to_thread(over_http, url)
