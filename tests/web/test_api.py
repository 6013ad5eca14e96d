"""Every endpoint of §3 over real HTTP: `fx web` processes, a Celery worker, the test Redis."""

from __future__ import annotations

import json

import httpx
import pytest

from fxengine.testing import ScriptedModel
from tests.web._server import WebProcess
from tests.web.conftest import TOKEN, ndjson_lines, read_turn

pytestmark = [pytest.mark.redis, pytest.mark.celery]

NDJSON = {"Accept": "application/x-ndjson"}


def text_of(lines: list[dict]) -> str:
    return "".join(line["delta"] for line in lines if line["type"] == "text_delta")


def test_healthz_pings_redis(api: httpx.Client) -> None:
    response = api.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is True and body["store"] == "redis" and body["pingMs"] >= 0


def test_create_session_answers_202_once_stored_then_the_stream_shows_the_turn(api: httpx.Client) -> None:
    response = api.post("/v1/sessions", json={"input": "hello there", "messageId": "m-create-1"})
    assert response.status_code == 202
    accepted = response.json()
    assert accepted["sessionId"].startswith("fxs_") and len(accepted["sessionId"]) == 30
    assert accepted["messageId"] == "m-create-1" and accepted["repeated"] is False
    assert response.headers["x-fx-session-id"] == accepted["sessionId"]
    lines = read_turn(api, accepted["sessionId"], cursor=accepted["cursor"], message_id="m-create-1")
    assert lines[0]["type"] == "turn_start" and lines[0]["sessionId"] == accepted["sessionId"]
    assert text_of(lines) == "echo:hello there "
    assert lines[-1]["stopReason"] == "end_turn"
    cursors = [line["cursor"] for line in lines]
    assert cursors == sorted(set(cursors)) and cursors[0] > accepted["cursor"]


def test_create_session_with_accept_ndjson_streams_the_turn(api: httpx.Client) -> None:
    with api.stream("POST", "/v1/sessions", json={"input": "stream me"}, headers=NDJSON) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = ndjson_lines(response)
    assert [lines[0]["type"], lines[-1]["type"]] == ["turn_start", "turn_end"]
    assert text_of(lines) == "echo:stream me "
    assert all(line["messageId"] == lines[0]["messageId"] for line in lines)
    assert all(isinstance(line["epoch"], int) for line in lines)


def test_prompt_on_a_session_and_a_repeated_message_id_runs_nothing_new(api: httpx.Client, model: ScriptedModel) -> None:
    sid = api.post("/v1/sessions", json={"input": "first"}).json()["sessionId"]
    read_turn(api, sid)
    second = api.post(f"/v1/sessions/{sid}/prompts", json={"input": "second", "messageId": "again-1"})
    assert second.status_code == 202 and second.json()["repeated"] is False
    read_turn(api, sid, cursor=second.json()["cursor"], message_id="again-1")
    requests_before = len(model.requests)
    with api.stream("POST", f"/v1/sessions/{sid}/prompts", json={"input": "second", "messageId": "again-1"}, headers=NDJSON) as r:
        lines = ndjson_lines(r)
    assert lines[-1]["type"] == "turn_end" and lines[-1]["repeated"] is True
    assert len(model.requests) == requests_before
    state = api.get(f"/v1/sessions/{sid}").json()
    assert state["turns"] == 2 and state["status"] == "idle"


def test_stream_resumes_from_any_cursor_without_a_gap_or_a_repeat(api: httpx.Client) -> None:
    sid = api.post("/v1/sessions", json={"input": "tool:abc"}).json()["sessionId"]
    read_turn(api, sid)
    second = api.post(f"/v1/sessions/{sid}/prompts", json={"input": "two", "messageId": "resume-2"}).json()
    read_turn(api, sid, cursor=second["cursor"], message_id="resume-2")
    whole = ndjson_lines(api.get(f"/v1/sessions/{sid}/stream", params={"cursor": 0, "follow": 0}))
    assert [line["type"] for line in whole].count("turn_end") == 2
    assert {"tool_start", "tool_end", "text_delta"} <= {line["type"] for line in whole}
    for i, line in enumerate(whole):
        rest = ndjson_lines(api.get(f"/v1/sessions/{sid}/stream", params={"cursor": line["cursor"], "follow": "0"}))
        assert rest == whole[i + 1 :]


def test_stream_follows_new_lines_while_the_turn_runs(api: httpx.Client, model: ScriptedModel) -> None:
    sid = api.post("/v1/sessions", json={"input": "hold:follow1"}).json()["sessionId"]
    seen: list[dict] = []
    with api.stream("GET", f"/v1/sessions/{sid}/stream") as response:
        for raw in response.iter_lines():
            if not raw.strip():
                continue
            seen.append(json.loads(raw))
            if seen[-1].get("delta") == "partial ":
                model.release("follow1")
            if seen[-1]["type"] == "turn_end":
                break
    assert text_of(seen) == "partial rest"


def test_steer_joins_the_running_turn(api: httpx.Client, model: ScriptedModel) -> None:
    sid = api.post("/v1/sessions", json={"input": "hold:steer1"}).json()["sessionId"]
    model.wait_held("steer1", timeout_s=15)
    response = api.post(f"/v1/sessions/{sid}/steer", json={"input": "also this", "messageId": "steer-a"})
    assert response.status_code == 202
    assert response.json() == {"sessionId": sid, "messageId": "steer-a", "repeated": False}
    # The model stays held: while it streams, the steer itself cuts the reply short (§6).
    # Releasing it first would race the worker's inbox read and end the turn without it.
    try:
        lines = read_turn(api, sid)
    finally:
        model.release("steer1")
    joined = [line for line in lines if line["type"] == "user_message"]
    assert joined and joined[0]["text"] == "also this" and joined[0]["id"] == "steer-a"


def test_cancel_ends_the_running_turn_cancelled(api: httpx.Client, model: ScriptedModel) -> None:
    sid = api.post("/v1/sessions", json={"input": "hold:cancel1"}).json()["sessionId"]
    model.wait_held("cancel1", timeout_s=15)
    response = api.post(f"/v1/sessions/{sid}/cancel")
    assert response.status_code == 202 and response.json()["sessionId"] == sid
    lines = read_turn(api, sid)
    model.release("cancel1")
    assert lines[-1]["stopReason"] == "cancelled"


def test_state_and_listing(api: httpx.Client) -> None:
    sid = api.post("/v1/sessions", json={"input": "state please", "agent": "a"}).json()["sessionId"]
    read_turn(api, sid)
    state = api.get(f"/v1/sessions/{sid}")
    assert state.status_code == 200
    body = state.json()
    assert body["sessionId"] == sid and body["agent"] == "a" and body["status"] == "idle"
    assert body["turns"] == 1 and body["cursor"] > 0 and body["epoch"] >= 1
    listing = api.get("/v1/sessions", params={"limit": 50})
    assert listing.status_code == 200, listing.text
    listed = listing.json()["sessions"]
    assert sid in [item["sessionId"] for item in listed]


def test_metrics_counts_accepted_inputs(api: httpx.Client) -> None:
    api.post("/v1/sessions", json={"input": "count me"})
    response = api.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    for name in ("fx_inputs_accepted_total", "fx_decisions_accepted", "fx_wake_send_failures_total",
                 "fx_store_latency_seconds"):
        assert name in response.text
    # What only a process that runs turns counts is not listed by a web process.
    for name in ("fx_turns_running", "fx_turn_yields_total", "fx_session_takeovers_total", "fx_deadline_cutoffs_total",
                 "fx_no_agent_refusals_total", "fx_turns_ended_total"):
        assert name not in response.text, name


def test_the_page_and_its_script_are_served(api: httpx.Client) -> None:
    page = api.get("/")
    assert page.status_code == 200 and "<script src=\"static/app.js\">" in page.text
    script = api.get("/static/app.js")
    assert script.status_code == 200 and "/stream?cursor=" in script.text


# ------------------------------------------------------------------------------------- auth


def test_auth_on_refuses_a_missing_or_wrong_token_and_takes_the_right_one(web_auth: WebProcess) -> None:
    with httpx.Client(base_url=web_auth.url, timeout=15.0) as client:
        missing = client.post("/v1/sessions", json={"input": "x"})
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "FX_UNAUTHORIZED"
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = client.get("/v1/sessions", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert client.get("/metrics").status_code == 401
        assert client.get("/healthz").status_code == 200 and client.get("/").status_code == 200
        ok = client.post("/v1/sessions", json={"input": "with token", "agent": "b"}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 202
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        lines = read_turn(client, ok.json()["sessionId"])
        assert text_of(lines) == "echo:with token "


# ----------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("GET", "/v1/sessions/fxs_01JZZZZZZZZZZZZZZZZZZZZZZZ", None, 404, "FX_UNKNOWN_SESSION"),
        ("POST", "/v1/sessions/fxs_01JZZZZZZZZZZZZZZZZZZZZZZZ/prompts", {"input": "x"}, 404, "FX_UNKNOWN_SESSION"),
        ("GET", "/v1/sessions/fxs_not-a-session/stream", None, 400, "FX_INVALID_SESSION_ID"),
        ("GET", "/v1/sessions/not-a-session/stream", None, 404, "FX_UNKNOWN_SESSION"),
        ("POST", "/v1/sessions", {"input": "x", "messageId": "bad id!"}, 400, "FX_INVALID_MESSAGE_ID"),
        ("POST", "/v1/sessions", {"input": ""}, 400, None),
        ("POST", "/v1/sessions", {"input": "x", "agent": "nobody"}, 404, "FX_UNKNOWN_AGENT"),
        ("POST", "/v1/sessions", {"input": "x", "surprise": 1}, 400, "FX_INVALID_REQUEST"),
        ("POST", "/v1/sessions", {"messageId": "m"}, 400, "FX_INVALID_REQUEST"),
        ("POST", "/v1/sessions", "[1, 2]", 400, "FX_INVALID_REQUEST"),
        ("POST", "/v1/sessions", "{not json", 400, "FX_INVALID_REQUEST"),
        ("GET", "/v1/nothing-here", None, 404, "FX_NOT_FOUND"),
        ("DELETE", "/v1/sessions", None, 405, "FX_METHOD_NOT_ALLOWED"),
    ],
)
def test_errors_are_json_with_a_code_and_a_status(
    api: httpx.Client, method: str, path: str, body: object, status: int, code: str | None
) -> None:
    content = body if isinstance(body, str) else (json.dumps(body) if body is not None else None)
    response = api.request(method, path, content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"].startswith("FX_") and error["message"]
    if code is not None:
        assert error["code"] == code


@pytest.mark.parametrize("cursor", ["-1", "abc", "1.5", "٣"])
def test_a_cursor_that_is_not_a_non_negative_integer_is_refused(api: httpx.Client, cursor: str) -> None:
    sid = api.post("/v1/sessions", json={"input": "cursor check"}).json()["sessionId"]
    response = api.get(f"/v1/sessions/{sid}/stream", params={"cursor": cursor})
    assert response.status_code == 400 and response.json()["error"]["code"] == "FX_INVALID_CURSOR"


def test_a_steer_reusing_a_prompt_id_is_409(api: httpx.Client) -> None:
    sid = api.post("/v1/sessions", json={"input": "first", "messageId": "owned-id"}).json()["sessionId"]
    response = api.post(f"/v1/sessions/{sid}/steer", json={"input": "x", "messageId": "owned-id"})
    assert response.status_code == 409 and response.json()["error"]["code"] == "FX_MESSAGE_ID_IN_USE"


def test_a_body_over_the_cap_is_refused_413_before_it_is_parsed(api: httpx.Client) -> None:
    # Not JSON at all: a parser would answer 400; the cap answers first.
    oversized = b"x" * (8 * 1024 * 1024 + 1)
    response = api.post("/v1/sessions", content=oversized, headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "FX_LIMIT_BODY"

    def chunks():  # no Content-Length: the reader counts as bytes arrive
        for _ in range(9):
            yield b"y" * (1024 * 1024)

    streamed = api.post("/v1/sessions", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "FX_LIMIT_BODY"
    assert "Content-Length" not in streamed.request.headers


def test_a_prompt_under_the_cap_but_over_the_text_limit_is_refused_400(api: httpx.Client) -> None:
    response = api.post("/v1/sessions", json={"input": "z" * (1024 * 1024 + 10)})
    assert response.status_code == 400 and response.json()["error"]["code"].startswith("FX_LIMIT")

