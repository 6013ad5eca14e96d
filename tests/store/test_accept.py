"""Accept: message-id idempotency, ownership, ids, steer limits, cancel requests."""

from __future__ import annotations

import uuid

import pytest

from fxengine import FxLimitError
from fxworker.errors import (
    FxInvalidMessageIdError,
    FxInvalidSessionIdError,
    FxMessageIdInUseError,
    FxQueueFullError,
    FxUnknownSessionError,
)
from fxworker.store import STEER_MAX_BYTES, STEER_MAX_QUEUED, STEER_MAX_QUEUED_BYTES, RedisStore


async def test_a_repeated_prompt_stores_nothing_and_reports_the_original(store: RedisStore, sid: str) -> None:
    first = await store.accept(sid, agent="default", message_id="m1", input="hello", context={"user": 1})
    again = await store.accept(sid, agent="default", message_id="m1", input="something else")
    assert (first.repeated, first.created, first.status) == (False, True, "waiting")
    assert (again.repeated, again.created, again.seq) == (True, False, first.seq)
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    assert [(i.message_id, i.input, i.context) for i in claim.pending] == [("m1", "hello", {"user": 1})]


async def test_context_and_settings_are_stored_with_the_input_when_given(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="a")
    await store.accept(sid, agent="default", message_id="m2", input="b", settings={"model": "x"})
    await store.accept(sid, agent="default", message_id="m3", input="c", context={"user": 7})
    await store.accept(sid, agent="default", message_id="m4", input="d", context=[1], settings={"t": 0.5})
    await store.accept(sid, agent="default", kind="steer", message_id="s1", input="e", context={"via": "web"})
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    assert [(i.message_id, i.kind, i.context, i.settings) for i in claim.pending] == [
        ("m1", "prompt", None, None),
        ("m2", "prompt", None, {"model": "x"}),
        ("m3", "prompt", {"user": 7}, None),
        ("m4", "prompt", [1], {"t": 0.5}),
        ("s1", "steer", {"via": "web"}, None),
    ]


async def test_a_steer_reusing_a_prompt_id_is_refused(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="hello")
    with pytest.raises(FxMessageIdInUseError) as caught:
        await store.accept(sid, agent="default", kind="steer", message_id="m1", input="faster")
    assert caught.value.code == "FX_MESSAGE_ID_IN_USE"
    await store.accept(sid, agent="default", kind="steer", message_id="s1", input="faster")
    with pytest.raises(FxMessageIdInUseError):
        await store.accept(sid, agent="default", kind="prompt", message_id="s1", input="x")
    repeated_steer = await store.accept(sid, agent="default", kind="steer", message_id="s1", input="faster")
    assert repeated_steer.repeated


async def test_the_first_agent_owns_the_session(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="support", message_id="m1", input="a")
    other = await store.accept(sid, agent="sales", message_id="m2", input="b")
    assert (other.agent, other.created, other.repeated) == ("support", False, False)
    assert (await store.state(sid)).agent == "support"


async def test_prompts_to_an_unknown_session_can_be_refused(store: RedisStore, sid: str) -> None:
    with pytest.raises(FxUnknownSessionError):
        await store.accept(sid, agent="default", message_id="m1", input="a", create=False)
    with pytest.raises(FxUnknownSessionError):
        await store.state(sid)


async def test_a_refused_input_leaves_its_message_id_free(store: RedisStore, sid: str) -> None:
    with pytest.raises(FxUnknownSessionError):
        await store.accept(sid, agent="default", message_id="m1", input="a", create=False)
    first = await store.accept(sid, agent="default", message_id="m1", input="a")
    assert (first.created, first.repeated, first.seq) == (True, False, 1)
    with pytest.raises(FxLimitError):
        await store.accept(sid, agent="default", kind="steer", message_id="s1", input="x" * (STEER_MAX_BYTES + 1))
    steer = await store.accept(sid, agent="default", kind="steer", message_id="s1", input="small")
    assert (steer.repeated, steer.seq) == (False, 2)
    state = await store.state(sid)
    assert (state.pending, state.cursor) == (2, 0)
    # Each call, refused or not, left the session in the ready set first.
    assert [r.session_id for r in await store.ready_sessions()] == [sid]


async def test_ids_are_validated_before_anything_is_stored(store: RedisStore, sid: str) -> None:
    with pytest.raises(FxInvalidMessageIdError):
        await store.accept(sid, agent="default", message_id="bad id!", input="a")
    with pytest.raises(FxInvalidSessionIdError):
        await store.accept("no/slashes", agent="default", message_id="m1", input="a")
    own = f"my-session.{uuid.uuid4().hex[:8]}"  # an application's own id: every store takes it
    accepted = await store.accept(own, agent="default", message_id="m1", input="a")
    assert accepted.created
    if store.kind != "memory":
        with pytest.raises(FxInvalidSessionIdError) as caught:
            await store.accept("fxs_my-session", agent="default", message_id="m1", input="a")
        assert caught.value.code == "FX_INVALID_SESSION_ID"
    with pytest.raises(FxUnknownSessionError):
        await store.state(sid)


async def test_steer_limits_hold_in_the_script(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="go")
    with pytest.raises(FxLimitError):
        await store.accept(sid, agent="default", kind="steer", message_id="big", input="x" * (STEER_MAX_BYTES + 1))
    for i in range(STEER_MAX_QUEUED):
        await store.accept(sid, agent="default", kind="steer", message_id=f"s{i}", input="x")
    with pytest.raises(FxQueueFullError) as caught:
        await store.accept(sid, agent="default", kind="steer", message_id="one-more", input="x")
    assert caught.value.code == "FX_LIMIT_QUEUE"
    # Consuming one steer frees one place.
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    await store.append(sid, claim.epoch, records=[("k1", b"r", [{"start": "m1"}, {"accepted": "s0"}])])
    await store.accept(sid, agent="default", kind="steer", message_id="one-more", input="x")


async def test_queued_steer_bytes_are_limited(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="go")
    big = "y" * (60 * 1024)
    for i in range(18):  # 17 fit in 1 MiB, the 18th does not
        try:
            await store.accept(sid, agent="default", kind="steer", message_id=f"s{i}", input=big)
        except FxQueueFullError:
            assert i == 17
            break
    else:
        pytest.fail("1 MiB of queued steers was not enforced")


async def test_a_steer_is_measured_in_bytes_of_text_not_of_json(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="go")
    # Exactly 64 KiB of text is 65538 bytes of JSON: accepted; one byte more is not.
    await store.accept(sid, agent="default", kind="steer", message_id="exact", input="w" * STEER_MAX_BYTES)
    with pytest.raises(FxLimitError) as caught:
        await store.accept(sid, agent="default", kind="steer", message_id="over", input="w" * (STEER_MAX_BYTES + 1))
    assert caught.value.code == "FX_LIMIT_STEER_SIZE"
    # Two-byte characters count two: 32 Ki of "é" is exactly the limit, one more is over.
    await store.accept(sid, agent="default", kind="steer", message_id="e-exact", input="é" * (STEER_MAX_BYTES // 2))
    with pytest.raises(FxLimitError):
        await store.accept(sid, agent="default", kind="steer", message_id="e-over",
                           input="é" * (STEER_MAX_BYTES // 2 + 1))
    # 40 KiB of double quotes is 80 KiB once escaped: still 40 KiB of text.
    quotes = '"' * (40 * 1024)
    await store.accept(sid, agent="default", kind="steer", message_id="quotes", input=quotes)
    # A refused id stays free; the accepted steers are stored as sent.
    await store.accept(sid, agent="default", kind="steer", message_id="over", input="ok")
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    steers = {i.message_id: i.input for i in claim.pending if i.kind == "steer"}
    assert steers == {"exact": "w" * STEER_MAX_BYTES, "e-exact": "é" * (STEER_MAX_BYTES // 2), "quotes": quotes,
                      "over": "ok"}


async def test_queued_steer_bytes_count_text_not_json(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="go")
    # 16 steers of 64 KiB of quotes are exactly 1 MiB of text (2 MiB of JSON): all fit.
    quotes = '"' * STEER_MAX_BYTES
    for i in range(STEER_MAX_QUEUED_BYTES // STEER_MAX_BYTES):
        await store.accept(sid, agent="default", kind="steer", message_id=f"q{i}", input=quotes)
    with pytest.raises(FxQueueFullError) as caught:
        await store.accept(sid, agent="default", kind="steer", message_id="one-byte-more", input="x")
    assert caught.value.code == "FX_LIMIT_QUEUE"
    # Consuming a steer gives back exactly its text bytes: 64 KiB fit again, one more does not.
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    await store.append(sid, claim.epoch, records=[("k1", b"r", [{"start": "m1"}, {"accepted": "q0"}])])
    await store.accept(sid, agent="default", kind="steer", message_id="refill", input=quotes)
    with pytest.raises(FxQueueFullError):
        await store.accept(sid, agent="default", kind="steer", message_id="one-byte-more", input="x")


async def test_cancel_targets_the_open_turn_else_the_waiting_one(store: RedisStore, sid: str) -> None:
    await store.accept(sid, agent="default", message_id="m1", input="a")
    await store.accept(sid, agent="default", message_id="m2", input="b")
    assert await store.request_cancel(sid) == "m1"
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    assert [i.cancelled for i in claim.pending] == [True, False]
    assert not claim.cancel_requested
    await store.append(sid, claim.epoch, records=[("k1", b"r", [{"start": "m1"}])])
    await store.release(sid, claim.epoch)
    claim = await store.claim(sid, holder="w2", lease_ms=1000)
    assert claim is not None and claim.cancel_requested
    await store.append(sid, claim.epoch, records=[("k2", b"r", [{"end": True}])])
    assert not (await store.state(sid)).cancel_requested
    assert await store.request_cancel(sid) == "m2"


async def test_cancel_with_nothing_to_cancel(store: RedisStore, sid: str) -> None:
    with pytest.raises(FxUnknownSessionError):
        await store.request_cancel(sid)
    await store.accept(sid, agent="default", message_id="m1", input="a")
    claim = await store.claim(sid, holder="w1", lease_ms=1000)
    assert claim is not None
    await store.append(sid, claim.epoch, marks=[{"drop": "m1"}])
    assert await store.request_cancel(sid) is None


async def test_the_blocking_twin_accepts_and_reads(store: RedisStore, sid: str) -> None:
    accepted = store.sync.accept(sid, agent="default", message_id="m1", input="from django")
    assert accepted.created
    assert store.sync.state(sid).status == "waiting"
    assert store.sync.read_lines(sid, 0) == []
    assert store.sync.request_cancel(sid) == "m1"
    assert sid in store.sync.list_sessions()
