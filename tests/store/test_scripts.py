"""Every script touches one cluster slot; every script opens with its contract; NOSCRIPT reloads."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import redis
from redis.cluster import key_slot

from fxworker import scripts
from fxworker.ids import new_session_id
from fxworker.keys import SESSION_KEY_NAMES, index_keys, session_keys
from fxworker.scripts import SCRIPTS, Call
from fxworker.store import StoreCore, redis_store
from fxworker.store._senders import _accept as accept_plan


def _sample_calls() -> dict[str, Call]:
    keys = session_keys("fx", new_session_id())
    index = index_keys("fx")
    return {
        "accept": scripts.accept(keys, kind="p", message_id="m", input_json='"x"', context_json="", settings_json="",
                                 agent="a", now_ms=1, create=True, steer_max_bytes=1, steer_max_count=1,
                                 steer_max_total_bytes=1),
        "mark_ready": scripts.mark_ready(index, session_id="s", now_ms=1),
        "clear_ready": scripts.clear_ready(index, session_id="s", older_than_ms=1),
        "claim": scripts.claim(keys, holder="w", lease_ms=1, now_ms=1),
        "append": scripts.append(keys, epoch=1, now_ms=1, ttl_ms=0, expected=None, check_expected=False,
                                 records=[], marks=[], lines=[]),
        "renew": scripts.renew(keys, epoch=1, lease_ms=1, now_ms=1),
        "release": scripts.release(keys, epoch=1, cutoff=False, now_ms=1, ttl_ms=0),
        "save_checkpoint": scripts.save_checkpoint(keys, epoch=1, now_ms=1, through=0, data=b"", max_bytes=1,
                                                   ttl_ms=0),
        "cancel": scripts.cancel(keys, now_ms=1),
        "state": scripts.state(keys),
        "woken": scripts.woken(keys, now_ms=1),
        "load": scripts.load(keys),
        "ack_read": scripts.ack_read(keys, after=0),
    }


def test_every_script_has_a_wrapper_and_its_keys_map_to_one_slot() -> None:
    calls = _sample_calls()
    assert set(calls) == set(SCRIPTS)
    for name, call in calls.items():
        assert call.script.name == name
        slots = {key_slot(k.encode()) for k in call.keys}
        assert len(slots) == 1, (name, call.keys)


def test_the_one_call_accept_of_a_standalone_server_marks_ready_in_the_index_slot() -> None:
    sid = new_session_id()
    keys, index = session_keys("fx", sid), index_keys("fx")
    call = scripts.accept(keys, kind="p", message_id="m", input_json='"x"', context_json="", settings_json="",
                          agent="a", now_ms=1, create=True, steer_max_bytes=1, steer_max_count=1,
                          steer_max_total_bytes=1, ready=index, session_id=sid)
    assert list(call.keys) == keys.all() + index.all() and sid in call.args
    # Two slots: only a standalone store sends it; a cluster store marks with a call of its own.
    assert len({key_slot(k.encode()) for k in call.keys}) == 2

    def plan(core: StoreCore) -> list[Any]:
        return accept_plan(core, sid, agent="a", message_id="m", input="x", now_ms=1).steps

    assert [step.script.name for step in plan(StoreCore())] == ["accept"]
    on_cluster = plan(StoreCore(cluster=True))
    assert [step.script.name for step in on_cluster] == ["mark_ready", "accept"]
    assert all(len({key_slot(k.encode()) for k in step.keys}) == 1 for step in on_cluster)


def test_session_keys_of_different_sessions_use_their_own_tag() -> None:
    sid = new_session_id()
    keys = session_keys("fx", sid)
    assert all(f"{{{sid}}}" in k for k in keys.all())
    assert [k.rsplit(":", 1)[1] for k in keys.all()] == list(SESSION_KEY_NAMES)
    assert key_slot(keys.meta.encode()) == key_slot(sid.encode())


def test_every_script_opens_with_its_contract() -> None:
    for script in SCRIPTS.values():
        head = script.source.split("\n\n", 1)[0]
        assert head.startswith(f"-- {script.name}.lua:"), script.name
        for part in ("-- KEYS", "-- ARGV", "-- Returns", "-- Invariant"):
            assert part in script.source, (script.name, part)


def test_every_wrapper_is_typed_and_documented() -> None:
    for name in SCRIPTS:
        wrapper = getattr(scripts, name)
        assert inspect.getdoc(wrapper), name
        assert all(p.annotation is not inspect.Parameter.empty for p in inspect.signature(wrapper).parameters.values())


@pytest.mark.redis
async def test_a_flushed_script_cache_reloads_on_noscript(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix)
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="x")
    admin = redis.Redis.from_url(redis_url)
    try:
        admin.script_flush()
        second = await store.accept(sid, agent="default", message_id="m2", input="y")
        assert (second.repeated, second.seq) == (False, 2)
        admin.script_flush()
        claim = await store.claim(sid, holder="w1", lease_ms=1000)
        assert claim is not None and [i.message_id for i in claim.pending] == ["m1", "m2"]
        admin.script_flush()
        assert store.sync.state(sid).pending == 2
        # The accept (ready mark included) after a flush: the script reloads and runs once.
        admin.script_flush()
        third = store.sync.accept(sid, agent="default", message_id="m3", input="z")
        assert third.seq == 3
        assert admin.zscore(store.core.index.ready, sid) is not None
    finally:
        admin.close()
        await store.aclose()
