"""A stored layout written by a newer release (§5, docs/operations.md "Upgrading"): a
process that cannot read it ends nothing and drops nothing. It lets the session go with
meta `newer`, and claims of processes that read below it take nothing (no epoch, no count
of claims without progress, no loop); a process that reads it takes the session on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from fxengine.journal.records import FORMAT_VERSION, decode_record, encode_record
from fxengine.testing import ScriptedModel
from fxworker import Agent
from fxworker.keys import session_keys
from fxworker.store._packed import pack_checkpoint, unpack_checkpoint
from fxworker.store.embedded import shared_server
from fxworker.store.types import LAYOUT_LEVEL, Claim, Newer
from tests.durable.conftest import embedded_agent

END_TIMEOUT_S = 10.0


@pytest.fixture
def agent(model: ScriptedModel) -> Iterator[Agent]:
    events: list[dict[str, Any]] = []
    with embedded_agent(model, on_event=events.append) as a:
        a.events = events  # type: ignore[attr-defined]
        yield a


async def test_a_newer_checkpoint_is_left_for_a_newer_process_with_nothing_ended(agent: Agent) -> None:
    session = agent.session()
    first = await session.prompt("written before the newer release")
    assert (await asyncio.wait_for(first.result(), END_TIMEOUT_S)).stop_reason == "end_turn"
    # What a newer release would have stored: the same checkpoint, its format one ahead.
    keys = session_keys(agent.prefix, session.id)  # type: ignore[attr-defined]
    admin = fakeredis.FakeRedis(server=shared_server())
    try:
        kind, body = decode_record(unpack_checkpoint(admin.hget(keys.ckpt, "data")))
        admin.hset(keys.ckpt, "data", pack_checkpoint(encode_record(kind, {**body, "v": FORMAT_VERSION + 1})))
    finally:
        admin.close()

    waiting = await session.prompt("meets the newer checkpoint")
    async def let_go() -> Any:
        while True:
            state = await agent.store.state(session.id)
            if state.newer is not None and state.lease_holder is None:
                return state
            await asyncio.sleep(0.02)
    state = await asyncio.wait_for(let_go(), END_TIMEOUT_S)
    assert state.newer == LAYOUT_LEVEL + 1 and state.status == "waiting" and state.pending == 1, state
    assert any(e["type"] == "session.newer" for e in agent.events)  # type: ignore[attr-defined]
    lines = await agent.store.read_lines(session.id, 0, count=10_000)
    assert [line for line in lines if line.get("messageId") == waiting.message_id] == []  # nothing ended

    # More wakes and sweeps take nothing: the epoch stands, no claim is counted.
    epoch = state.epoch
    await asyncio.sleep(1.5)
    agent.wake(session.id, reason="test")
    assert isinstance(await agent.store.claim(session.id, holder="old", lease_ms=2000), Newer)
    await asyncio.sleep(0.5)
    after = await agent.store.state(session.id)
    assert after.epoch == epoch and after.pending == 1 and after.status == "waiting", after

    # A process that reads the newer level takes it on (here: its claim; the turn is its to run).
    claim = await agent.store.claim(session.id, holder="newer", lease_ms=2000, reads=LAYOUT_LEVEL + 1)
    # The claim that met it counted one claim without progress; the refusals since, none.
    assert isinstance(claim, Claim) and claim.epoch == epoch + 1 and claim.futile == 2
    assert (await agent.store.state(session.id)).newer is None
