"""A session whose agent the claiming process does not run: nothing taken, a backoff, a give-up."""

from __future__ import annotations

from fxworker.store import Claim, Idle, RedisStore, Serving, Unserved
from tests.store.conftest import FakeClock

ONLY_A = Serving(("a",), give_up_ms=60_000, retry_max_ms=2_000)


async def test_an_unserved_claim_takes_nothing_and_backs_off_to_the_bound(
    store: RedisStore, sid: str, clock: FakeClock
) -> None:
    await store.accept(sid, agent="b", message_id="m1", input="for b")
    started = clock.ms
    waits = []
    for _ in range(6):
        missed = await store.claim(sid, holder="wa", lease_ms=1000, only_work=True, serving=ONLY_A)
        assert isinstance(missed, Unserved) and missed.agent == "b" and missed.since_ms == started
        assert not missed.spare
        waits.append(missed.next_ms - clock.ms)
        # A second wake before the first is due again is spare: it counts nothing.
        spare = await store.claim(sid, holder="wc", lease_ms=1000, only_work=True, serving=ONLY_A)
        assert isinstance(spare, Unserved) and spare.spare and spare.next_ms == missed.next_ms
        clock.ms = missed.next_ms
    assert waits == [250, 500, 1000, 2000, 2000, 2000]
    state = await store.state(sid)
    assert (state.epoch, state.status, state.lease_holder) == (0, "waiting", None)
    assert state.unserved_since_ms == started and state.unserved_next_ms == clock.ms
    ready = await store.ready_sessions()
    assert [(r.session_id, r.unserved_next_ms) for r in ready] == [(sid, state.unserved_next_ms)]


async def test_a_claim_that_can_run_it_takes_it_and_forgets_the_misses(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="b", message_id="m1", input="for b")
    assert isinstance(await store.claim(sid, holder="wa", lease_ms=1000, serving=ONLY_A), Unserved)
    claim = await store.claim(sid, holder="wb", lease_ms=1000, serving=Serving(("a", "b"), 60_000, 2_000))
    assert isinstance(claim, Claim) and claim.epoch == 1 and not claim.give_up
    state = await store.state(sid)
    assert state.unserved_since_ms is None and state.unserved_next_ms is None


async def test_past_the_give_up_the_claim_is_taken_to_end_the_inputs(
    store: RedisStore, sid: str, clock: FakeClock
) -> None:
    await store.accept(sid, agent="b", message_id="m1", input="for b")
    assert isinstance(await store.claim(sid, holder="wa", lease_ms=1000, serving=ONLY_A), Unserved)
    clock.advance(59_999)
    assert isinstance(await store.claim(sid, holder="wa", lease_ms=1000, serving=ONLY_A), Unserved)
    clock.advance(1)
    claim = await store.claim(sid, holder="wa", lease_ms=1000, serving=ONLY_A)
    assert isinstance(claim, Claim) and claim.give_up and claim.agent == "b" and claim.epoch == 1
    assert [p.message_id for p in claim.pending] == ["m1"]
    # The clock starts again for the session's next input.
    assert (await store.state(sid)).unserved_since_ms is None


async def test_a_session_with_nothing_to_run_is_idle_whoever_owns_it(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="b", message_id="m1", input="for b")
    claim = await store.claim(sid, holder="wb", lease_ms=1000)
    assert isinstance(claim, Claim)
    await store.append(sid, claim.epoch, records=[("k1", b"drop", [{"drop": "m1"}])])
    await store.release(sid, claim.epoch, cutoff=False)
    idle = await store.claim(sid, holder="wa", lease_ms=1000, only_work=True, serving=ONLY_A)
    assert isinstance(idle, Idle) and (await store.state(sid)).unserved_since_ms is None
