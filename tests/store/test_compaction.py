"""Checkpoints: compaction keeps what a claim loads and bounds the log."""

from __future__ import annotations

from typing import Any

import pytest

from fxengine import FxLimitError, Persistence
from fxworker.errors import FxLeaseLostError
from fxworker.store import CHECKPOINT_MAX_BYTES, Claim, RedisStore
from fxworker.store.persistence import COMPACT_AFTER_RECORDS
from tests.store.conftest import FakeClock


def fold(claim: Claim) -> list[bytes]:
    """What an engine rebuilds: the checkpoint's records (it holds them joined) + the rest."""
    base = claim.checkpoint.data.split(b"|") if claim.checkpoint and claim.checkpoint.data else []
    return base + [r.data for r in claim.records]


async def test_compaction_keeps_load_equal_and_bounds_the_log(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    data: list[bytes] = []
    lengths = []
    for i in range(40):
        data.append(f"r{i}".encode())
        appended = await store.append(sid, claim.epoch, records=[(f"k{i}", data[-1], [{"start": "m1"}] if i == 0 else [])])
        if i % 10 == 9:
            before = await store.claim(sid, holder="reader", lease_ms=1, now_ms=0)  # a live lease: refused
            assert before is None
            await store.release(sid, claim.epoch)
            before = await store.claim(sid, holder="w", lease_ms=60_000)
            assert before is not None
            length = await store.save_checkpoint(sid, before.epoch, through=appended.records[0], data=b"|".join(data))
            lengths.append(length)
            after = await store.claim(sid, holder="w", lease_ms=60_000, now_ms=store.now_ms() + 60_000)
            assert after is not None
            assert fold(before) == fold(after) == data
            assert after.records == [] and after.checkpoint is not None
            assert (after.head, after.checkpoint.through) == (appended.records[0],) * 2
            claim = after
    assert lengths == [0, 0, 0, 0]


async def test_a_checkpoint_mid_log_keeps_the_records_after_it(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    for i in range(6):
        await store.append(sid, claim.epoch, records=[(f"k{i}", f"r{i}".encode(), [])])
    assert await store.save_checkpoint(sid, claim.epoch, through="4", data=b"r0|r1|r2|r3") == 2
    await store.release(sid, claim.epoch)
    again = await store.claim(sid, holder="w2", lease_ms=60_000)
    assert again is not None
    assert [r.cursor for r in again.records] == ["5", "6"]
    assert fold(again) == [f"r{i}".encode() for i in range(6)]
    with pytest.raises(ValueError):
        await store.save_checkpoint(sid, again.epoch, through="3", data=b"backwards")
    with pytest.raises(ValueError):
        await store.save_checkpoint(sid, again.epoch, through="7", data=b"beyond the head")
    # The next record continues the chain after a compaction.
    assert (await store.append(sid, again.epoch, records=[("k6", b"r6", [])], expected="6")).records == ["7"]


async def test_checkpoints_are_fenced_and_bounded(store: RedisStore, sid: str, clock: FakeClock) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    await store.append(sid, claim.epoch, records=[("k", b"r", [])])
    with pytest.raises(FxLimitError):
        await store.save_checkpoint(sid, claim.epoch, through="1", data=b"x" * (CHECKPOINT_MAX_BYTES + 1))
    clock.advance(1000)
    assert await store.claim(sid, holder="w2", lease_ms=1000) is not None
    with pytest.raises(FxLeaseLostError):
        await store.save_checkpoint(sid, claim.epoch, through="1", data=b"stale")


async def test_the_engine_persistence_adapter(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    p = store.persistence(sid, claim.epoch, claim)
    assert isinstance(p, Persistence)
    assert (await p.load()).head is None
    p.queue_lines([{"type": "turn_start", "messageId": "m1"}])
    first = await p.append(expected=None, idempotency_key="e:1", data=b"a", barrier=True, marks=[{"start": "m1"}])
    assert [line["type"] for line in await store.read_lines(sid, 0)] == ["turn_start"]
    second = await p.append(expected=first, idempotency_key="e:2", data=b"b", barrier=False, marks=[])
    assert await p.append(expected=first, idempotency_key="e:2", data=b"b", barrier=False, marks=[]) == second
    p.queue_lines([{"type": "text_delta", "delta": "x"}])
    assert await p.flush_lines() == [2]
    # A short log is not compacted: a claim reads its few records at little cost.
    await p.save_checkpoint(through=second, data=b"ck-short")
    head = second
    for n in range(3, COMPACT_AFTER_RECORDS + 1):
        head = await p.append(expected=head, idempotency_key=f"e:{n}", data=b"r", barrier=False, marks=[])
    await p.save_checkpoint(through=head, data=b"ck")
    await store.release(sid, claim.epoch)
    again = await store.claim(sid, holder="w2", lease_ms=60_000)
    assert again is not None
    loaded = await store.persistence(sid, again.epoch, again).load()
    assert loaded.checkpoint is not None and loaded.checkpoint.data == b"ck" and loaded.head == head
    assert loaded.journal == []
    stale = store.persistence(sid, claim.epoch, claim)
    with pytest.raises(FxLeaseLostError):
        await stale.append(expected=head, idempotency_key="e:x", data=b"c", barrier=False, marks=[])


async def test_the_adapter_leaves_a_short_log_uncompacted(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    p = store.persistence(sid, claim.epoch, claim)
    first = await p.append(expected=None, idempotency_key="e:1", data=b"a", barrier=True, marks=[{"start": "m1"}])
    await p.save_checkpoint(through=first, data=b"ck")
    await store.release(sid, claim.epoch)
    again = await store.claim(sid, holder="w2", lease_ms=60_000)
    assert again is not None
    loaded = await store.persistence(sid, again.epoch, again).load()
    assert loaded.checkpoint is None and [r.cursor for r in loaded.journal] == [first]


async def test_compaction_drops_a_line_call_key_once_a_later_record_is_covered(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    keys = store.core.keys(sid)
    line = [{"type": "text_delta", "messageId": "m1", "delta": "a"}]
    r1 = await store.append(sid, claim.epoch, records=[("k1", b"r1", [{"start": "m1"}])])
    await store.append(sid, claim.epoch, lines=line, idempotency_key="lines:1")  # after record 1
    # Covering only record 1 keeps the key: a retry of that call may still be in flight.
    await store.save_checkpoint(sid, claim.epoch, through=r1.records[0], data=b"r1")
    assert await store.client.hexists(keys.keys, "lines:1") == 1
    r2 = await store.append(sid, claim.epoch, records=[("k2", b"r2", [])])
    await store.save_checkpoint(sid, claim.epoch, through=r2.records[0], data=b"r1|r2")
    assert await store.client.hexists(keys.keys, "lines:1") == 0
    assert await store.client.hlen(keys.keys) == 0
    assert await store.client.hget(keys.meta, "line_key") is None


async def test_an_end_record_releases_only_when_no_compaction_follows_it(store: RedisStore, sid: str) -> None:
    """The adapter lets the end record's call release the session (the ride's `release`
    says it may), except when a compaction is due after that record: `save_checkpoint`
    writes under the lease, so that turn is released by a call of its own."""
    async def turn(message_id: str, records_before_end: int) -> tuple[Persistence, bool]:
        await store.accept(sid, agent="default", message_id=message_id, input="hello")
        claim = await store.claim(sid, holder="w", lease_ms=60_000)
        assert claim is not None
        p = store.persistence(sid, claim.epoch, claim)
        head = await p.append(expected=(await p.load()).head, idempotency_key=f"{message_id}:0", data=b"s",
                              barrier=True, marks=[{"start": message_id}])
        for n in range(1, records_before_end):
            head = await p.append(expected=head, idempotency_key=f"{message_id}:{n}", data=b"r", barrier=False,
                                  marks=[])
        ride = p.ride_with_end({"type": "turn_end", "messageId": message_id},  # type: ignore[attr-defined]
                               release=lambda: True)
        head = await p.append(expected=head, idempotency_key=f"{message_id}:end", data=b"e", barrier=False,
                              marks=[{"end": True}])
        await p.save_checkpoint(through=head, data=b"ck-" + message_id.encode())
        return p, ride.released

    short, released = await turn("m1", 2)
    assert released and (await store.state(sid)).lease_holder is None
    with pytest.raises(FxLeaseLostError):  # nothing more under that epoch
        await short.append(expected=None, idempotency_key="late", data=b"x", barrier=False, marks=[])
    # The next turn's end record is the one after which a compaction is due.
    long, released = await turn("m2", COMPACT_AFTER_RECORDS - 4)
    assert not released and (await store.state(sid)).lease_holder == "w"
    assert (await store.load(sid)).checkpoint.data == b"ck-m2"  # type: ignore[union-attr]
    assert (await store.release(sid, long.epoch)).released  # type: ignore[attr-defined]


async def test_an_end_record_that_lets_go_carries_the_checkpoint_and_the_claims_lines(store: RedisStore,
                                                                                     sid: str) -> None:
    """With a `checkpoint` on the ride, the end record's call lets the session go even when a
    compaction would be due: the checkpoint it carries replaces the log (§5 "Packed at
    rest"), and the lines the claim stored are packed. A checkpoint that fails to build is
    left out: the call lets go all the same, and the log keeps the conversation."""
    async def turn(message_id: str, records_before_end: int, checkpoint: Any) -> Persistence:
        await store.accept(sid, agent="default", message_id=message_id, input="hello")
        claim = await store.claim(sid, holder="w", lease_ms=60_000)
        assert claim is not None
        p = store.persistence(sid, claim.epoch, claim)
        p.queue_lines([{"type": "turn_start", "messageId": message_id}])  # type: ignore[attr-defined]
        head = await p.append(expected=(await p.load()).head, idempotency_key=f"{message_id}:0", data=b"s",
                              barrier=True, marks=[{"start": message_id}])
        for n in range(1, records_before_end):
            p.queue_lines([{"type": "text_delta", "delta": f"{n}", "messageId": message_id}])  # type: ignore[attr-defined]
            head = await p.append(expected=head, idempotency_key=f"{message_id}:{n}", data=b"r", barrier=False,
                                  marks=[])
        ride = p.ride_with_end({"type": "turn_end", "messageId": message_id},  # type: ignore[attr-defined]
                               release=lambda: True, checkpoint=checkpoint)
        await p.append(expected=head, idempotency_key=f"{message_id}:end", data=b"e", barrier=False,
                       marks=[{"end": True}])
        assert ride.released
        return p

    await turn("m1", COMPACT_AFTER_RECORDS + 2, lambda: b"FXJ\x01through m1")
    loaded = await store.load(sid)
    assert loaded.checkpoint is not None and loaded.checkpoint.data == b"FXJ\x01through m1"
    assert loaded.journal == [] and loaded.head == str(COMPACT_AFTER_RECORDS + 3)
    lines = await store.read_lines(sid, 0, count=1000)
    assert [line["cursor"] for line in lines] == list(range(1, COMPACT_AFTER_RECORDS + 4))
    assert await store.client.xlen(store.core.keys(sid).ui) == 1  # one chunk

    def broken() -> bytes:
        raise RuntimeError("the state does not encode")

    await turn("m2", 2, broken)
    loaded = await store.load(sid)
    assert loaded.checkpoint is not None and loaded.checkpoint.data == b"FXJ\x01through m1"
    assert [r.data for r in loaded.journal] == [b"s", b"r", b"e"]
    assert (await store.state(sid)).lease_holder is None
