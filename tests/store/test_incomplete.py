"""A session with a key gone (evicted or deleted) is refused whole, and an epoch never repeats."""

from __future__ import annotations

from typing import Any

import pytest

from fxworker.errors import FxSessionIncompleteError, FxUnknownSessionError
from fxworker.store import Claim, RedisStore
from tests.store.conftest import FakeClock


async def _worked(store: RedisStore, sid: str, *, packed: bool = False) -> None:
    """A session that ran one turn: every key it will ever have exists. `packed`: its end
    record's call let it go with the checkpoint (§5 "Packed at rest"): no log, the
    checkpoint holds the conversation, the lines are one chunk."""
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert isinstance(claim, Claim)
    first = await store.append(
        sid, claim.epoch, records=[("k1", b"start", [{"start": "m1"}])],
        lines=[{"type": "turn_start", "messageId": "m1"}],
    )
    let_go: dict[str, Any] = {"release": True, "checkpoint": b"FXJ\x01the conversation",
                              "pack_after": (1, first.texts)} if packed else {}
    end = await store.append(sid, claim.epoch, records=[("k2", b"end", [{"end": True}])],
                             lines=[{"type": "turn_end", "messageId": "m1", "stopReason": "end_turn"}], **let_go)
    if packed:
        assert end.released and end.packed == 2
    else:
        await store.release(sid, claim.epoch, cutoff=False)


def _delete(store: RedisStore, sid: str, name: str) -> None:
    key = getattr(store._core.keys(sid), name)
    assert store.sync.client.delete(key) == 1, f"{name} was not there to delete"


async def _running(store: RedisStore, sid: str, clock: FakeClock, *, compacted: bool = False) -> None:
    """A session with a turn open whose worker's lease ran out: the inbox holds its input
    and the log its records (at rest both go, the log into `rest`). `compacted`: a
    checkpoint covers the first record, and the log holds only the one after it."""
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert isinstance(claim, Claim)
    await store.append(sid, claim.epoch, records=[("k1", b"start", [{"start": "m1"}])],
                       lines=[{"type": "turn_start", "messageId": "m1"}])
    if compacted:
        await store.save_checkpoint(sid, claim.epoch, through="1", data=b"FXJ\x01the first record")
        await store.append(sid, claim.epoch, records=[("k2", b"step", [])])
    clock.advance(2000)


@pytest.mark.parametrize("name, at_rest", [
    ("meta", True), ("lease", True), ("ui", True), ("msgs", True), ("rest", True),
    ("meta", False), ("lease", False), ("inbox", False), ("log", False), ("ui", False), ("msgs", False),
])
async def test_a_session_missing_a_key_is_refused_by_state_accept_and_claim(
    store: RedisStore, sid: str, clock: FakeClock, name: str, at_rest: bool
) -> None:
    await (_worked(store, sid) if at_rest else _running(store, sid, clock))
    _delete(store, sid, name)
    with pytest.raises(FxSessionIncompleteError) as refused:
        await store.state(sid)
    assert refused.value.code == "FX_SESSION_INCOMPLETE" and name in str(refused.value)
    with pytest.raises(FxSessionIncompleteError):
        await store.accept(sid, agent="default", message_id="m2", input="again")
    with pytest.raises(FxSessionIncompleteError):
        await store.claim(sid, holder="w2", lease_ms=1000)
    # Nothing the refusals did brought the key back or stored the input.
    with pytest.raises(FxSessionIncompleteError):
        await store.state(sid)
    if name != "msgs":
        assert not store.sync.client.hexists(store._core.keys(sid).msgs, "m2")


@pytest.mark.parametrize("layout, name", [
    ("packed", "ckpt"), ("packed", "ui"), ("packed", "meta"), ("compacted", "ckpt"), ("compacted", "log"),
])
async def test_a_checkpointed_session_missing_a_key_is_refused(
    store: RedisStore, sid: str, clock: FakeClock, layout: str, name: str
) -> None:
    """Without its checkpoint the records after it would load as the whole conversation:
    the checkpoint must stand once one was stored (meta `through`)."""
    if layout == "packed":
        await _worked(store, sid, packed=True)
    else:
        await _running(store, sid, clock, compacted=True)
    _delete(store, sid, name)
    with pytest.raises(FxSessionIncompleteError) as refused:
        await store.state(sid)
    assert f"its {name} key is gone" in str(refused.value)
    with pytest.raises(FxSessionIncompleteError):
        await store.accept(sid, agent="default", message_id="m2", input="again")
    with pytest.raises(FxSessionIncompleteError):
        await store.claim(sid, holder="w2", lease_ms=1000)


async def test_an_incomplete_session_is_neither_woken_nor_listed(store: RedisStore, sid: str, clock: FakeClock) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    _delete(store, sid, "inbox")
    clock.advance(60_000)
    assert [r.session_id for r in await store.ready_sessions()] == []
    assert await store.states([sid]) == [None]


async def test_a_lease_key_gone_never_restarts_the_epoch(store: RedisStore, sid: str) -> None:
    await _worked(store, sid)
    await store.accept(sid, agent="default", message_id="m2", input="again")
    second = await store.claim(sid, holder="w2", lease_ms=1000)
    assert isinstance(second, Claim) and second.epoch == 2
    await store.release(sid, second.epoch, cutoff=False)
    _delete(store, sid, "lease")
    with pytest.raises(FxSessionIncompleteError):
        await store.claim(sid, holder="w3", lease_ms=1000)
    # Put back by hand at an old epoch, the lease cannot take the count back either.
    keys = store._core.keys(sid)
    store.sync.client.hset(keys.lease, mapping={"holder": "w1", "epoch": 1, "expires_ms": 0, "state": "released"})
    third = await store.claim(sid, holder="w3", lease_ms=1000)
    assert isinstance(third, Claim) and third.epoch == 3
    assert (await store.state(sid)).epoch == 3


async def test_a_session_set_to_expire_that_lost_a_key_is_gone_and_its_id_can_start_again(
    store: RedisStore, sid: str
) -> None:
    await _worked(store, sid)
    keys = store._core.keys(sid)
    client = store.sync.client
    for key in keys.names:
        client.pexpire(key, 60_000)
    client.hset(keys.meta, "expiring", 1)
    _delete(store, sid, "ui")
    with pytest.raises(FxUnknownSessionError):
        await store.state(sid)
    with pytest.raises(FxUnknownSessionError):
        await store.claim(sid, holder="w2", lease_ms=1000)
    accepted = await store.accept(sid, agent="default", message_id="m1", input="a new start")
    assert accepted.created and not accepted.repeated
    state = await store.state(sid)
    assert state is not None and state.pending == 1 and state.turns == 0
