"""`POST /v1/wake`: HMAC-SHA256 signatures accepted, refused, expired and replayed; 503 semantics."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from fxworker.ids import new_session_id
from fxworker.store import redis_store
from fxworker.web import sign_wake
from fxworker.web.wake import WINDOW_S
from tests.support.workers import wait_until
from tests.web._server import WebProcess
from tests.web.conftest import TOKEN, WAKE_SECRET, read_turn

pytestmark = [pytest.mark.redis, pytest.mark.celery]


def post_wake(client: httpx.Client, payload: dict, *, secret: str = WAKE_SECRET, now_s: float | None = None) -> httpx.Response:
    body = json.dumps(payload).encode()
    return client.post("/v1/wake", content=body, headers={"Content-Type": "application/json", **sign_wake(body, secret, now_s=now_s)})


@pytest.fixture
def idle_session(api: httpx.Client) -> str:
    sid = api.post("/v1/sessions", json={"input": "wake target"}).json()["sessionId"]
    read_turn(api, sid)
    return sid


def test_a_signed_wake_is_handled_and_its_replay_refused(api: httpx.Client, idle_session: str) -> None:
    payload = {"sessionId": idle_session, "agent": "default", "reason": "test"}
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", **sign_wake(body, WAKE_SECRET)}
    first = api.post("/v1/wake", content=body, headers=headers)
    assert first.status_code == 200, first.text
    assert first.json()["outcome"] in ("done", "yielded", "noop")
    replay = api.post("/v1/wake", content=body, headers=headers)
    assert replay.status_code == 409 and replay.json()["error"]["code"] == "FX_WAKE_REPLAYED"


def test_a_wrong_signature_a_changed_body_or_no_signature_is_401(api: httpx.Client, idle_session: str) -> None:
    payload = {"sessionId": idle_session}
    wrong = post_wake(api, payload, secret="not-the-secret")
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "FX_WAKE_SIGNATURE"
    body = json.dumps(payload).encode()
    headers = sign_wake(body, WAKE_SECRET)
    changed = api.post("/v1/wake", content=body + b" ", headers=headers)
    assert changed.status_code == 401 and changed.json()["error"]["code"] == "FX_WAKE_SIGNATURE"
    unsigned = api.post("/v1/wake", content=body)
    assert unsigned.status_code == 401 and unsigned.json()["error"]["code"] == "FX_WAKE_UNSIGNED"


@pytest.mark.parametrize("skew_s", [-(WINDOW_S + 5), WINDOW_S + 5])
def test_a_timestamp_outside_five_minutes_is_refused(api: httpx.Client, idle_session: str, skew_s: float) -> None:
    response = post_wake(api, {"sessionId": idle_session}, now_s=time.time() + skew_s)
    assert response.status_code == 401 and response.json()["error"]["code"] == "FX_WAKE_EXPIRED"


def test_a_wake_for_an_unknown_session_is_refused_and_dropped(api: httpx.Client) -> None:
    response = post_wake(api, {"sessionId": "fxs_01JZZZZZZZZZZZZZZZZZZZZZZZ", "agent": "default"})
    assert response.status_code == 200
    assert response.json()["outcome"] == "refused" and response.json()["error"]["code"] == "FX_UNKNOWN_SESSION"


def test_a_wake_for_an_agent_no_live_worker_runs_is_503_and_may_be_delivered_again(
    api: httpx.Client, redis_url: str, prefix: str
) -> None:
    # A prompt for an agent no process runs, stored with no wake sent.
    store = redis_store(redis_url, prefix=prefix).sync
    sid = new_session_id()
    store.accept(sid, agent="nobody", message_id="waits-for-nobody", input="owned by nobody")
    body = json.dumps({"sessionId": sid, "agent": "nobody"}).encode()
    headers = {"Content-Type": "application/json", **sign_wake(body, WAKE_SECRET)}
    first = api.post("/v1/wake", content=body, headers=headers)
    assert first.status_code == 503 and first.json()["error"]["code"] == "FX_NO_AGENT"
    assert first.headers["retry-after"] == "1"
    # Nothing was claimed: the epoch stands, and the state says which agent it waits for.
    state = store.state(sid)
    assert state.epoch == 0 and state.unserved_since_ms is not None
    # The same signed message delivered again is not a replay: the first was not taken.
    again = api.post("/v1/wake", content=body, headers=headers)
    assert again.status_code == 503 and again.json()["error"]["code"] == "FX_NO_AGENT"
    assert store.state(sid).epoch == 0


def test_a_wake_for_an_agent_a_live_worker_runs_is_passed_on_to_it(
    api: httpx.Client, redis_url: str, prefix: str
) -> None:
    """b runs on the worker, not on web_open: the wake goes on to `fx.b` (§7) and the turn
    runs there; nothing waits for the push queue to deliver it again."""
    store = redis_store(redis_url, prefix=prefix).sync
    sid = new_session_id()
    store.accept(sid, agent="b", message_id="waits-for-b", input="owned by b")
    body = json.dumps({"sessionId": sid, "agent": "b"}).encode()
    headers = {"Content-Type": "application/json", **sign_wake(body, WAKE_SECRET)}
    passed = api.post("/v1/wake", content=body, headers=headers)
    assert passed.status_code == 200, passed.text
    state = wait_until(lambda: (s := store.state(sid)).status == "idle" and s, 15, interval_s=0.05,
                       what="the turn of b run by the worker")
    assert state.turns == 1 and state.epoch == 1, state


def test_a_wake_of_a_session_with_nothing_to_run_is_a_noop_whoever_owns_it(
    api: httpx.Client, web_auth: WebProcess
) -> None:
    # Agent b exists on web_auth and on the worker, not on web_open.
    with httpx.Client(base_url=web_auth.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=15.0) as other:
        sid = other.post("/v1/sessions", json={"input": "owned by b", "agent": "b"}).json()["sessionId"]
        read_turn(other, sid)
        epoch = other.get(f"/v1/sessions/{sid}").json()["epoch"]
    response = post_wake(api, {"sessionId": sid, "agent": "b"})
    assert response.status_code == 200 and response.json()["outcome"] == "noop"
    with httpx.Client(base_url=web_auth.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=15.0) as other:
        assert other.get(f"/v1/sessions/{sid}").json()["epoch"] == epoch


def test_a_wake_body_without_a_session_id_is_400(api: httpx.Client) -> None:
    response = post_wake(api, {"agent": "default"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "FX_INVALID_REQUEST"
