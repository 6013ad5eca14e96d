"""What counts as progress of an open turn (§6 poison turns) and where its lines start."""

from __future__ import annotations

from typing import Any

from fxworker.store import RedisStore
from tests.store.conftest import FakeClock


async def _open_turn(store: RedisStore, sid: str) -> Any:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder="w0", lease_ms=1000)
    assert claim is not None
    await store.append(sid, claim.epoch, records=[("w0:1", b"start", [{"start": "m1"}, {"step": "model:1"}])],
                       lines=[{"type": "turn_start", "messageId": "m1"}])
    return claim


async def _takeover(store: RedisStore, sid: str, clock: FakeClock, holder: str) -> Any:
    clock.advance(1000)  # the holder died: its lease runs out
    claim = await store.claim(sid, holder=holder, lease_ms=1000)
    assert claim is not None and claim.taken_over
    return claim


async def test_resume_and_rerun_records_of_the_same_step_do_not_restart_the_death_count(
    store: RedisStore, sid: str, clock: FakeClock
) -> None:
    await _open_turn(store, sid)
    deaths = []
    for n in range(1, 4):
        claim = await _takeover(store, sid, clock, f"w{n}")
        deaths.append(claim.deaths)
        # What a resuming worker writes before it can die again: its resume record, the
        # rerun's model request and a steer it took, all at the step the turn was at.
        await store.append(sid, claim.epoch, records=[
            (f"w{n}:r", b"resumed", [{"step": "model:1"}]),
            (f"w{n}:q", b"model_request", [{"step": "model:1"}]),
            (f"w{n}:s", b"accepted", [{"accepted": "s1"}, {"step": "model:1"}]),
        ], lines=[{"type": "turn_resume", "messageId": "m1"}, {"type": "text_delta", "delta": "x", "step": 1}])
    assert deaths == [1, 2, 3]
    assert (await _takeover(store, sid, clock, "w4")).deaths == 4


async def test_a_new_step_or_a_finished_call_restarts_the_death_count(
    store: RedisStore, sid: str, clock: FakeClock
) -> None:
    await _open_turn(store, sid)
    claim = await _takeover(store, sid, clock, "w1")
    claim = await _takeover(store, sid, clock, "w2")
    assert claim.deaths == 2
    # The model answered with two calls: a new step.
    await store.append(sid, claim.epoch, records=[("w2:a", b"model_response", [{"done": True}, {"step": "tools:1"}])])
    claim = await _takeover(store, sid, clock, "w3")
    assert claim.deaths == 1
    claim = await _takeover(store, sid, clock, "w4")
    assert claim.deaths == 2
    # One of the two calls finished: the step is still `tools:1`, but a call is done.
    await store.append(sid, claim.epoch, records=[("w4:t", b"tool_result", [{"done": True}, {"step": "tools:1"}])])
    assert (await _takeover(store, sid, clock, "w5")).deaths == 1
    # A record naming no step is not progress either.
    claim = await _takeover(store, sid, clock, "w6")
    await store.append(sid, claim.epoch, records=[("w6:x", b"unmarked", [])])
    assert (await _takeover(store, sid, clock, "w7")).deaths == 3


async def test_the_cutoff_count_keeps_its_own_rule(store: RedisStore, sid: str) -> None:
    claim = await _open_turn(store, sid)
    assert (await store.release(sid, claim.epoch, cutoff=True)).cutoffs == 1
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    await store.append(sid, claim.epoch, records=[("w1:r", b"resumed", [{"step": "model:1"}])])
    assert (await store.release(sid, claim.epoch, cutoff=True)).cutoffs == 2
    claim = await store.claim(sid, holder="w2", lease_ms=1000)
    assert claim is not None
    await store.append(sid, claim.epoch, records=[("w2:a", b"model_response", [{"done": True}, {"step": "model:2"}])])
    assert (await store.release(sid, claim.epoch, cutoff=True)).cutoffs == 1


async def test_the_claim_names_the_open_turns_start_line(store: RedisStore, sid: str, clock: FakeClock) -> None:
    await store.accept(sid, agent="default", message_id="m0", input="first")
    claim = await store.claim(sid, holder="w0", lease_ms=1000)
    assert claim is not None and claim.turn_cursor == 0
    epoch = claim.epoch
    for n in range(1, 21):  # a long history of ended turns
        turn = f"m{n - 1}"
        await store.append(sid, epoch, records=[(f"s{n}", b"start", [{"start": turn}])],
                           lines=[{"type": "turn_start", "messageId": turn}])
        await store.append(sid, epoch, lines=[{"type": "text_delta", "delta": "y", "messageId": turn}] * 3)
        await store.append(sid, epoch, records=[(f"e{n}", b"end", [{"end": True}])],
                           lines=[{"type": "turn_end", "messageId": turn}])
        await store.accept(sid, agent="default", message_id=f"m{n}", input="next")
    # The next turn's start line goes out ahead of its record, then one with it.
    await store.append(sid, epoch, lines=[{"type": "turn_start", "messageId": "m20"}])
    start = (await store.read_lines(sid, 0))[-1]["cursor"]
    await store.append(sid, epoch, records=[("s21", b"start", [{"start": "m20"}])],
                       lines=[{"type": "text_delta", "delta": "z", "step": 1, "messageId": "m20"}])
    claim = await _takeover(store, sid, clock, "w1")
    assert claim.turn_cursor == start == 101
    assert [ln["delta"] for ln in await store.read_lines(sid, claim.turn_cursor)] == ["z"]
    # With its record, the start line's own cursor is kept.
    await store.append(sid, claim.epoch, records=[("e21", b"end", [{"end": True}])],
                       lines=[{"type": "turn_end", "messageId": "m20"}])
    await store.append(sid, claim.epoch, lines=[{"type": "text_delta", "delta": "before"}])
    await store.append(sid, claim.epoch, records=[("s22", b"start", [{"start": "m21"}])],
                       lines=[{"type": "turn_start", "messageId": "m21", "input": {"type": "turn_start"}},
                              {"type": "text_delta", "delta": "w", "step": 1, "messageId": "m21"}])
    claim = await _takeover(store, sid, clock, "w2")
    assert claim.turn_cursor == 105
    assert [ln["type"] for ln in await store.read_lines(sid, claim.turn_cursor)] == ["text_delta"]
    await store.append(sid, claim.epoch, records=[("e22", b"end", [{"end": True}])])
    await store.release(sid, claim.epoch)
    claim = await store.claim(sid, holder="w3", lease_ms=1000)
    assert claim is not None and claim.open_turn is None and claim.turn_cursor == 0
