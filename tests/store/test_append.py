"""The fenced append: only the chain head's writes are stored; marks track turns and inputs."""

from __future__ import annotations

import pytest

from fxengine import FxFencedError
from fxworker.errors import FxLeaseLostError
from fxworker.store import RedisStore, StoreRecord
from tests.store.conftest import FakeClock


async def _claimed(store: RedisStore, sid: str, holder: str = "w1", lease_ms: int = 1000) -> int:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder=holder, lease_ms=lease_ms)
    assert claim is not None
    return claim.epoch


async def test_a_stale_epoch_stores_nothing_in_the_log_or_the_ui(store: RedisStore, sid: str, clock: FakeClock) -> None:
    old = await _claimed(store, sid)
    await store.append(sid, old, records=[("w1:1", b"one", [{"start": "m1"}])], lines=[{"type": "turn_start"}])
    clock.advance(1000)
    new = await store.claim(sid, holder="w2", lease_ms=1000)
    assert new is not None and new.epoch == old + 1
    with pytest.raises(FxLeaseLostError) as caught:
        await store.append(sid, old, records=[("w1:2", b"stale", [])], lines=[{"type": "text_delta", "delta": "stale"}])
    assert isinstance(caught.value, FxFencedError)
    await store.append(sid, new.epoch, records=[("w2:1", b"two", [])], lines=[{"type": "turn_resume"}])
    lines = await store.read_lines(sid, 0)
    assert [(line["type"], line["epoch"]) for line in lines] == [("turn_start", old), ("turn_resume", new.epoch)]
    assert "stale" not in str(lines)
    await store.release(sid, new.epoch)
    reread = await store.claim(sid, holder="w3", lease_ms=1000)
    assert reread is not None
    assert [r.data for r in reread.records] == [b"one", b"two"]


async def test_an_expired_lease_writes_nothing_even_unclaimed(store: RedisStore, sid: str, clock: FakeClock) -> None:
    epoch = await _claimed(store, sid)
    clock.advance(1000)
    with pytest.raises(FxLeaseLostError):
        await store.append(sid, epoch, records=[("k", b"late", [])])
    assert (await store.state(sid)).head is None


async def test_records_get_increasing_cursors_and_a_repeated_key_returns_the_first(store: RedisStore, sid: str) -> None:
    epoch = await _claimed(store, sid)
    first = await store.append(sid, epoch, records=[StoreRecord("a", b"1"), StoreRecord("b", b"2")],
                               lines=[{"type": "text_delta", "delta": "x"}])
    assert (first.records, first.lines, first.head) == (["1", "2"], [1], "2")
    again = await store.append(sid, epoch, records=[StoreRecord("a", b"1"), StoreRecord("b", b"2")],
                               lines=[{"type": "text_delta", "delta": "x"}])
    assert (again.records, again.lines, again.repeated) == (["1", "2"], [1], True)
    assert len(await store.read_lines(sid, 0)) == 1
    third = await store.append(sid, epoch, records=[("c", b"3", [])])
    assert third.records == ["3"]


async def test_expected_must_name_the_head(store: RedisStore, sid: str) -> None:
    epoch = await _claimed(store, sid)
    first = await store.append(sid, epoch, records=[("a", b"1", [])], expected=None)
    with pytest.raises(FxFencedError) as caught:
        await store.append(sid, epoch, records=[("b", b"2", [])], expected=None)
    assert not isinstance(caught.value, FxLeaseLostError)
    second = await store.append(sid, epoch, records=[("b", b"2", [])], expected=first.records[0])
    assert second.records == ["2"]


async def test_marks_open_yield_and_close_turns_and_consume_inputs(store: RedisStore, sid: str) -> None:
    epoch = await _claimed(store, sid)
    await store.accept(sid, agent="default", kind="steer", message_id="s1", input="also")
    await store.accept(sid, agent="default", message_id="m2", input="next")
    await store.append(sid, epoch, records=[("k1", b"r1", [{"start": "m1"}])])
    await store.append(sid, epoch, records=[("k2", b"r2", [{"accepted": "s1"}, {"yield": True}])])
    await store.release(sid, epoch)
    claim = await store.claim(sid, holder="w2", lease_ms=1000)
    assert claim is not None and claim.open_turn is not None
    assert (claim.open_turn.message_id, claim.open_turn.yielded) == ("m1", True)
    assert claim.open_turn.input is not None and claim.open_turn.input.input == "hello"
    assert [i.message_id for i in claim.pending] == ["m2"]
    state = await store.state(sid)
    assert (state.turns, state.open_turn, state.pending) == (1, "m1", 1)
    repeated = await store.accept(sid, agent="default", message_id="m1", input="hello")
    assert (repeated.repeated, repeated.status) == (True, "running")
    await store.append(sid, claim.epoch, records=[("k3", b"r3", [{"end": True}])],
                       lines=[{"type": "turn_end", "messageId": "m1", "stopReason": "end_turn"}])
    ended = await store.accept(sid, agent="default", message_id="m1", input="hello")
    assert (ended.status, ended.end_cursor) == ("done", 1)
    state = await store.state(sid)
    assert (state.open_turn, state.last_turn, state.status) == (None, "m1", "running")
    await store.append(sid, claim.epoch, marks=[{"drop": "m2"}])
    await store.release(sid, claim.epoch)
    assert (await store.state(sid)).status == "idle"


async def test_inputs_come_back_in_acceptance_order(store: RedisStore, sid: str) -> None:
    ids = [f"m{i}" for i in range(12)]
    for i, mid in enumerate(ids):
        await store.accept(sid, agent="default", kind="steer" if i % 3 == 2 else "prompt", message_id=mid, input=i)
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    assert [i.message_id for i in claim.pending] == ids
    assert [i.seq for i in claim.pending] == sorted(i.seq for i in claim.pending)


async def test_a_running_worker_sees_steers_and_cancels_on_the_inbox(store: RedisStore, sid: str) -> None:
    epoch = await _claimed(store, sid)
    claim = await store.claim(sid, holder="w2", lease_ms=1000)
    assert claim is None
    await store.append(sid, epoch, records=[("k1", b"r1", [{"start": "m1"}])])
    state = await store.state(sid)
    cursor = 1  # the claim's inbox_cursor: m1 is seq 1
    assert await store.watch_inbox(sid, cursor, block_ms=None) == []
    await store.accept(sid, agent="default", kind="steer", message_id="s1", input="hurry")
    await store.request_cancel(sid)
    seen = await store.watch_inbox(sid, cursor, block_ms=1000)
    assert [(i.kind, i.message_id) for i in seen] == [("steer", "s1"), ("cancel", "m1")]
    assert state.open_turn == "m1"
