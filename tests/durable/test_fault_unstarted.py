"""A delivery that fails before its turn opens ends, it never loops (§6, §11.1).

On real Celery workers (`tests.chaos.agents`, `FX_LEASE_S=2`): a prompt whose turn the
engine refuses to open (a model setting the worker's catalog does not have) ends `error`
with the engine's code, a `session_error` line and `session.error`, the lease is let go,
and the prompts behind it run in the same delivery; a prompt whose workers died 3 times
before its turn opened is dropped as poison; a turn whose journal cannot be read ends
`error` too, and so does an input whose stored fields do not decode; a turn whose poison
ending died as well is ended without loading its journal.

The inputs are stored with the store's own `accept` (what `session.prompt` calls once
its checks pass): the settings these tests need are refused at the door.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import redis

from fxworker.keys import session_keys
from tests.chaos.faults import Pool, events_of, fault_env, lines_of, requests_for, responder, wait_line
from tests.support.workers import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery]

LEASE_S = 2.0
END_BOUND_S = 2 * LEASE_S + 6.0  # a wake (or the sweeper's) and one delivery


@pytest.fixture(scope="module")
def pool(workers: Any, model: Any) -> Pool:
    model.responder = responder
    return Pool(workers, fault_env(model, FX_LEASE_S=str(LEASE_S)), size=1)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _store_prompt(client: Any, session_id: str, text: str, *, settings: dict[str, Any] | None = None) -> str:
    message_id = f"msg_{uuid.uuid4().hex}"
    client.store.sync.accept(session_id, agent="default", kind="prompt", message_id=message_id,
                             input=[{"type": "text", "text": text}], settings=settings, now_ms=_now_ms())
    return message_id


def _end_of(agent: Any, session_id: str, message_id: str) -> dict[str, Any]:
    return wait_line(agent, session_id, lambda ln: ln["type"] == "turn_end" and ln["messageId"] == message_id,
                     END_BOUND_S, what=f"turn_end of {message_id}")


def _assert_ended_with(agent: Any, session_id: str, message_id: str, code: str) -> None:
    end = _end_of(agent, session_id, message_id)
    assert end["stopReason"] == "error" and end["error"]["code"] == code, end
    lines = lines_of(agent, session_id)
    errors = [ln for ln in lines if ln["type"] == "session_error" and ln["messageId"] == message_id]
    assert len(errors) == 1 and errors[0]["code"] == code and errors[0]["id"] == message_id
    assert errors[0]["cursor"] < end["cursor"], "a follower of the turn stops at turn_end"


def _wait_released(agent: Any, session_id: str) -> dict[str, Any]:
    def released() -> Any:
        state = agent.store.sync.state(session_id)
        return state if state.lease_holder is None and state.status == "idle" else None

    return wait_until(released, LEASE_S + 2, what=f"{session_id} idle with its lease let go")  # type: ignore[return-value]


def _stop_workers(pool: Pool) -> None:
    """No worker runs until the test has played the dead ones."""
    for worker in pool.live():
        worker.stop()


def _claim_and_die(client: Any, session_id: str, holder: str) -> Any:
    """Claims as a worker that dies at once; returns the claim once its lease ran out."""
    claim = client.store.sync.claim(session_id, holder=holder, lease_ms=50, now_ms=_now_ms())
    assert claim is not None
    time.sleep(0.06)  # the dead worker's 50 ms lease runs out: no event tells a test of that
    return claim


def test_a_prompt_whose_workers_die_before_its_turn_opens_is_dropped_and_the_next_runs(
    pool: Pool, client: Any, model: Any, redis_url: str, prefix: str
) -> None:
    # No worker yet: this test plays three workers that claim the session and die.
    _stop_workers(pool)
    agent = client.agents["default"]
    session = agent.blocking_session()
    first = _store_prompt(client, session.id, "never opened")
    second = _store_prompt(client, session.id, "the next prompt")
    for death in range(3):
        claim = _claim_and_die(client, session.id, f"wkr_dead{death}")
        assert claim.open_turn is None and claim.deaths == death
    pool.fill()
    agent.wake(session.id, reason="prompt")
    _assert_ended_with(agent, session.id, first, "FX_POISON_TURN")
    assert "died 3 times before its turn started" in _end_of(agent, session.id, first)["error"]["message"]
    assert requests_for(model, "never opened") == []
    assert _end_of(agent, session.id, second)["stopReason"] == "end_turn"
    errors = [e for e in events_of(redis_url, prefix) if e["type"] == "session.error" and e["sessionId"] == session.id]
    assert [e["error"]["code"] for e in errors] == ["FX_POISON_TURN"]


@pytest.mark.parametrize(
    ("model_setting", "code"),
    [({"id": "no-such-model"}, "FX_MODEL_UNKNOWN"), ({"id": "scripted", "effort": "high"}, "FX_MODEL_UNSUPPORTED_EFFORT")],
)
def test_a_prompt_whose_turn_cannot_open_ends_with_an_error_and_the_next_prompt_runs(
    pool: Pool, client: Any, model: Any, redis_url: str, prefix: str, model_setting: dict[str, Any], code: str
) -> None:
    pool.fill()
    agent = client.agents["default"]
    session = agent.blocking_session()
    bad = _store_prompt(client, session.id, "a bad model setting", settings={"model": model_setting})
    behind = _store_prompt(client, session.id, "waiting behind it")
    agent.wake(session.id, reason="prompt")
    _assert_ended_with(agent, session.id, bad, code)
    assert _end_of(agent, session.id, behind)["stopReason"] == "end_turn"
    state = _wait_released(agent, session.id)
    epoch = state.epoch
    assert {ln["epoch"] for ln in lines_of(agent, session.id)} == {epoch}, "both ran in one delivery"
    assert requests_for(model, "a bad model setting") == []
    errors = [e for e in events_of(redis_url, prefix) if e["type"] == "session.error" and e["sessionId"] == session.id]
    assert [e["error"]["code"] for e in errors] == [code]
    # The session goes on, and nothing redelivers the failed prompt.
    after = session.prompt("after the failure")
    assert after.result().stop_reason == "end_turn"
    assert [ln["type"] for ln in lines_of(agent, session.id) if ln["messageId"] == bad] == ["session_error", "turn_end"]
    assert agent.store.sync.state(session.id).epoch == epoch + 1


def test_an_input_whose_stored_fields_do_not_decode_ends_and_the_next_prompt_runs(
    pool: Pool, client: Any, model: Any, redis_url: str, prefix: str
) -> None:
    pool.fill()
    agent = client.agents["default"]
    session = agent.blocking_session()
    broken = _store_prompt(client, session.id, "a broken entry")
    behind = _store_prompt(client, session.id, "the prompt behind it")
    # The inbox rewritten with the same ids, the first entry's input no longer JSON (a
    # stream entry cannot be changed in place).
    inbox = session_keys(prefix, session.id).inbox
    r = redis.Redis.from_url(redis_url)
    try:
        entries = r.xrange(inbox)
        assert len(entries) == 2
        r.delete(inbox)
        for entry_id, fields in entries:
            if fields[b"id"] == broken.encode():
                fields[b"in"] = b'[{"type": "text", "te'
            r.xadd(inbox, fields, id=entry_id)
    finally:
        r.close()
    agent.wake(session.id, reason="prompt")
    _assert_ended_with(agent, session.id, broken, "FX_INVALID_INPUT")
    assert "not valid JSON" in _end_of(agent, session.id, broken)["error"]["message"]
    assert _end_of(agent, session.id, behind)["stopReason"] == "end_turn"
    _wait_released(agent, session.id)
    assert requests_for(model, "a broken entry") == []
    errors = [e for e in events_of(redis_url, prefix) if e["type"] == "session.error" and e["sessionId"] == session.id]
    assert [e["error"]["code"] for e in errors] == ["FX_INVALID_INPUT"]


def test_a_turn_whose_journal_cannot_be_read_ends_with_an_error_instead_of_looping(
    pool: Pool, client: Any, model: Any
) -> None:
    pool.fill()
    agent = client.agents["default"]
    session = agent.blocking_session()
    # A worker opened the turn and stored a record no engine can decode, then died.
    opened = _store_prompt(client, session.id, "a corrupt journal")
    claim = client.store.sync.claim(session.id, holder="wkr_corrupt", lease_ms=50, now_ms=_now_ms())
    assert claim is not None
    client.store.sync.append(session.id, claim.epoch, records=[("rec:corrupt", b"\x00not msgpack", [{"start": opened}])],
                             now_ms=_now_ms())
    _assert_ended_with(agent, session.id, opened, "FX_JOURNAL_INVALID")
    state = _wait_released(agent, session.id)
    assert state.open_turn is None
    assert requests_for(model, "a corrupt journal") == []
    # The conversation cannot be loaded, so no later prompt can run on it either: each one
    # ends at once with the same code (the records stay for whoever repairs or exports
    # them), and nothing loops.
    after = session.prompt("after the corrupt journal")
    result = after.result()
    assert result.stop_reason == "error" and result.error["code"] == "FX_JOURNAL_INVALID", result
    assert _wait_released(agent, session.id).open_turn is None
    assert requests_for(model, "after the corrupt journal") == []


def test_a_turn_whose_poison_ending_died_too_is_ended_without_loading_its_journal(
    pool: Pool, client: Any, model: Any, redis_url: str, prefix: str
) -> None:
    # No worker yet: this test plays the workers that open the turn and die in it, the
    # last of them while it was to end the turn as poison.
    _stop_workers(pool)
    agent = client.agents["default"]
    session = agent.blocking_session()
    opened = _store_prompt(client, session.id, "a journal that kills its loader")
    behind = _store_prompt(client, session.id, "the prompt after it")
    claim = client.store.sync.claim(session.id, holder="wkr_opener", lease_ms=50, now_ms=_now_ms())
    assert claim is not None
    # A record no engine can decode: were it loaded, the turn would end FX_JOURNAL_INVALID.
    client.store.sync.append(session.id, claim.epoch, records=[("rec:fatal", b"\x00not msgpack", [{"start": opened}])],
                             now_ms=_now_ms())
    time.sleep(0.06)  # the opener dies too: its 50 ms lease runs out
    for death in range(1, 5):
        claim = _claim_and_die(client, session.id, f"wkr_dead{death}")
        assert claim.open_turn is not None and claim.deaths == death
    pool.fill()
    agent.wake(session.id, reason="prompt")
    end = _end_of(agent, session.id, opened)
    assert end["stopReason"] == "cancelled" and end["error"]["code"] == "FX_POISON_TURN", end
    assert "while loading it" in end["error"]["message"]
    # The prompt behind it does load the journal, and ends on the record no engine reads.
    assert _end_of(agent, session.id, behind)["error"]["code"] == "FX_JOURNAL_INVALID"
    errors = [e for e in events_of(redis_url, prefix) if e["type"] == "session.error" and e["sessionId"] == session.id]
    assert [e["error"]["code"] for e in errors] == ["FX_POISON_TURN", "FX_JOURNAL_INVALID"]
