"""Leases: claim exclusion, renewal, expiry on the passed clock, release, takeovers."""

from __future__ import annotations

import uuid

import pytest

from fxworker.errors import FxLeaseLostError, FxStoreUnavailableError, FxUnknownSessionError
from fxworker.ids import new_session_id
from fxworker.store import Claim, Idle, RedisStore, redis_store
from tests.store.conftest import FakeClock
from tests.support.redis_server import RedisServer


async def _session(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="hello")


async def _open_turn(store: RedisStore, sid: str) -> Claim:
    """Prompt m1, claimed by w1 (a 1 s lease) and its turn opened by a start record."""
    await _session(store, sid)
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    await store.append(sid, claim.epoch, records=[("k1", b"start", [{"start": "m1"}])])
    return claim


async def test_a_live_lease_excludes_every_other_claim(store: RedisStore, sid: str, clock: FakeClock) -> None:
    await _session(store, sid)
    first = await store.claim(sid, holder="w1", lease_ms=1000)
    assert first is not None and first.epoch == 1 and not first.taken_over
    assert await store.claim(sid, holder="w2", lease_ms=1000) is None
    clock.advance(999)
    assert await store.claim(sid, holder="w2", lease_ms=1000) is None
    assert (await store.state(sid)).status == "running"


async def test_expiry_frees_the_lease_and_the_epoch_goes_up(store: RedisStore, sid: str, clock: FakeClock) -> None:
    await _session(store, sid)
    first = await store.claim(sid, holder="w1", lease_ms=1000)
    assert first is not None
    clock.advance(1000)
    assert (await store.state(sid)).status == "waiting"
    second = await store.claim(sid, holder="w2", lease_ms=1000)
    assert second is not None
    assert (second.epoch, second.taken_over) == (2, True)


async def test_renewal_keeps_the_lease(store: RedisStore, sid: str, clock: FakeClock) -> None:
    await _session(store, sid)
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    for _ in range(5):
        clock.advance(600)
        expires = await store.renew(sid, claim.epoch, lease_ms=1000)
        assert expires == clock.ms + 1000
        assert await store.claim(sid, holder="w2", lease_ms=1000) is None
    clock.advance(1000)  # stopped renewing: dead, and it cannot come back
    with pytest.raises(FxLeaseLostError) as caught:
        await store.renew(sid, claim.epoch, lease_ms=1000)
    assert caught.value.code == "FX_FENCED"
    assert await store.claim(sid, holder="w2", lease_ms=1000) is not None


async def test_release_frees_at_once_and_only_once(store: RedisStore, sid: str) -> None:
    await _session(store, sid)
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    assert (await store.release(sid, claim.epoch)).released
    assert not (await store.release(sid, claim.epoch)).released
    with pytest.raises(FxLeaseLostError):
        await store.renew(sid, claim.epoch, lease_ms=1000)
    with pytest.raises(FxLeaseLostError):
        await store.append(sid, claim.epoch, lines=[{"type": "text_delta", "delta": "late"}])
    nxt = await store.claim(sid, holder="w2", lease_ms=1000)
    assert nxt is not None and nxt.epoch == 2 and not nxt.taken_over
    with pytest.raises(FxLeaseLostError):
        await store.release(sid, claim.epoch)


async def test_claiming_an_unknown_session_is_refused(store: RedisStore, sid: str) -> None:
    with pytest.raises(FxUnknownSessionError):
        await store.claim(sid, holder="w1", lease_ms=1000)


async def test_cutoffs_count_in_a_row_and_progress_resets_them(store: RedisStore, sid: str) -> None:
    claim = await _open_turn(store, sid)
    counts = []
    for n in range(3):
        counts.append((await store.release(sid, claim.epoch, cutoff=True)).cutoffs)
        claim = await store.claim(sid, holder=f"w{n + 2}", lease_ms=1000)
        assert claim is not None
        assert claim.cutoffs == counts[-1]
    assert counts == [1, 2, 3]
    await store.append(sid, claim.epoch, records=[("k2", b"progress", [])])
    assert (await store.release(sid, claim.epoch, cutoff=True)).cutoffs == 1


async def test_a_named_step_keeps_its_cutoff_count(store: RedisStore, sid: str) -> None:
    await _session(store, sid)
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    await store.append(sid, claim.epoch, records=[("k1", b"s", [{"start": "m1"}, {"step": "call-1"}])])
    assert (await store.release(sid, claim.epoch, cutoff=True)).cutoffs == 1
    claim = await store.claim(sid, holder="w2", lease_ms=1000)
    assert claim is not None
    await store.append(sid, claim.epoch, records=[("k2", b"same step", [{"step": "call-1"}])])
    assert (await store.release(sid, claim.epoch, cutoff=True)).cutoffs == 2
    claim = await store.claim(sid, holder="w3", lease_ms=1000)
    assert claim is not None
    await store.append(sid, claim.epoch, records=[("k3", b"next step", [{"step": "call-2"}])])
    assert (await store.release(sid, claim.epoch, cutoff=True)).cutoffs == 1


async def test_deaths_count_takeovers_of_an_open_turn_without_progress(
    store: RedisStore, sid: str, clock: FakeClock
) -> None:
    claim = await _open_turn(store, sid)
    deaths = []
    for n in range(3):
        clock.advance(1000)  # the holder died: its lease runs out
        claim = await store.claim(sid, holder=f"w{n + 2}", lease_ms=1000)
        assert claim is not None and claim.taken_over
        assert claim.open_turn is not None and claim.open_turn.message_id == "m1"
        deaths.append(claim.deaths)
    assert deaths == [1, 2, 3]
    await store.append(sid, claim.epoch, records=[("k2", b"progress", [{"done": True}])])
    clock.advance(1000)
    claim = await store.claim(sid, holder="w9", lease_ms=1000)
    assert claim is not None and claim.deaths == 1
    # A release is not a death.
    await store.release(sid, claim.epoch)
    claim = await store.claim(sid, holder="w10", lease_ms=1000)
    assert claim is not None and (claim.deaths, claim.taken_over) == (1, False)


async def test_takeovers_after_outages_are_spared_only_so_often(store: RedisStore, sid: str, clock: FakeClock) -> None:
    """A takeover from a holder silent since an outage is spared, 6 times without progress;
    then they count as deaths again, so a turn that kills its workers ends as poison even
    on a store that keeps failing (§6). Progress restarts both counts."""
    claim = await _open_turn(store, sid)
    deaths = []
    for n in range(9):
        clock.advance(1000)
        store.core.saw_outage()  # what the store's error mapper notes when a call meets an outage
        claim = await store.claim(sid, holder=f"w{n + 2}", lease_ms=1000)
        assert claim is not None and claim.taken_over
        deaths.append(claim.deaths)
    assert deaths == [0, 0, 0, 0, 0, 0, 1, 2, 3]
    await store.append(sid, claim.epoch, records=[("k2", b"progress", [{"done": True}])])
    clock.advance(1000)
    store.core.saw_outage()
    claim = await store.claim(sid, holder="w20", lease_ms=1000)
    assert claim is not None and claim.deaths == 0


async def test_a_claim_for_work_leaves_a_session_with_nothing_to_run_as_it_is(store: RedisStore, sid: str) -> None:
    """A second wake of work already run (the release's wake and the sender's both fire)
    must not bump the epoch or take a lease: the session reads the same afterwards."""
    await _session(store, sid)
    first = await store.claim(sid, holder="w1", lease_ms=60_000, only_work=True)
    assert isinstance(first, Claim) and first.epoch == 1  # an input waits: work
    await store.append(sid, first.epoch, marks=[{"drop": "m1"}])
    await store.release(sid, first.epoch)
    before = await store.state(sid)
    assert await store.claim(sid, holder="w2", lease_ms=60_000, only_work=True) == Idle(1, "default")
    assert await store.state(sid) == before
    assert await store.claim(sid, holder="w3", lease_ms=60_000, only_work=False) is not None  # the plain claim still takes it
    assert (await store.state(sid)).epoch == 2


async def test_a_claim_for_work_still_takes_over_an_expired_lease(store: RedisStore, sid: str, clock: FakeClock) -> None:
    await _session(store, sid)
    first = await store.claim(sid, holder="w1", lease_ms=1000)
    assert first is not None
    await store.append(sid, first.epoch, marks=[{"drop": "m1"}])
    clock.advance(1000)  # died holding it, with nothing left to run: the next claim ends the chain
    second = await store.claim(sid, holder="w2", lease_ms=1000, only_work=True)
    assert isinstance(second, Claim) and (second.epoch, second.taken_over) == (2, True)


async def test_a_claim_retried_by_its_holder_answers_the_same_epoch(store: RedisStore, sid: str, clock: FakeClock) -> None:
    """A claim whose reply was lost is retried under the same holder id: it must not bump
    the epoch (which would fence the retrying worker itself) nor count a death."""
    await _session(store, sid)
    first = await store.claim(sid, holder="w1", lease_ms=1000)
    assert first is not None
    clock.advance(1000)  # w1 died holding it: w2's claim is a takeover and counts a death
    taken = await store.claim(sid, holder="w2", lease_ms=1000, only_work=True)
    assert isinstance(taken, Claim) and (taken.epoch, taken.deaths, taken.taken_over) == (2, 1, True)
    clock.advance(300)
    again = await store.claim(sid, holder="w2", lease_ms=1000, only_work=True)
    assert isinstance(again, Claim) and (again.epoch, again.deaths, again.taken_over) == (2, 1, False)
    assert again.lease_expires_ms == clock.ms + 1000 and again.pending == taken.pending
    assert await store.claim(sid, holder="w3", lease_ms=1000) is None  # still exclusive
    await store.renew(sid, 2, lease_ms=1000)  # the retrying holder's writes still go through


@pytest.mark.redis
async def test_a_holder_silent_since_an_outage_the_claimer_met_is_not_counted_dead(clock: FakeClock) -> None:
    """A store outage (a failover, a restart, a full Redis) silences every holder at once:
    a takeover from a holder whose last renewal came before an outage this process met
    counts no death (three in a row would end a healthy turn as poison); a takeover from
    one silent since after it does."""
    server = RedisServer(appendonly=True)
    store = redis_store(server.url, prefix=f"fxt{uuid.uuid4().hex[:10]}", clock=clock)
    try:
        sid = new_session_id()
        claim = await _open_turn(store, sid)
        clock.advance(400)
        server.stop()  # the store goes away under the holder's renewal
        with pytest.raises(FxStoreUnavailableError):
            await store.renew(sid, claim.epoch, lease_ms=1000)
        server.start()
        clock.advance(1000)
        claim = await store.claim(sid, holder="w2", lease_ms=1000)
        assert claim is not None and claim.taken_over
        assert claim.deaths == 0, "a holder cut off by the outage was counted dead"
        clock.advance(1000)  # w2 renewed nothing since its claim, after the outage: it died
        claim = await store.claim(sid, holder="w3", lease_ms=1000)
        assert claim is not None and claim.taken_over and claim.deaths == 1
    finally:
        await store.aclose()
        server.close()
