"""The chat page in a real headless Chromium against `fx dev`: a turn that parks on a tool call
waiting for a decision shows Approve and Deny (or a result field for a client-side tool), a
click decides it, and the buttons are gone once the call is answered, also after a reload.

The `refund` tool (tests/durable/tooling.py) records each real run in the test Redis, so a
test counts how often it ran."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis

from fxengine.testing import ScriptedModel
from tests.durable.tooling import refunds_key
from tests.web._model import responder
from tests.browser.conftest import ARTIFACTS, skip_without_chromium
from tests.web._server import WebProcess

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.redis]

DENIED = "The user denied this tool call"

skip_without_chromium()


@pytest.fixture(scope="module")
def page_model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


@pytest.fixture(scope="module")
def effects_prefix() -> str:
    return f"fxp{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def dev(page_model: ScriptedModel, redis_url: str, effects_prefix: str) -> Iterator[WebProcess]:
    env = {"FX_TEST_MODEL_URL": page_model.base_url, "FX_TEST_AGENTS": "default",
           "FX_TEST_EFFECTS_URL": redis_url, "FX_PREFIX": effects_prefix}
    web = WebProcess("dev", env=env, args=("--agents", "tests.durable.agents"))
    try:
        yield web.wait_ready()
    finally:
        web.close()


@pytest.fixture(scope="module")
def effects(redis_url: str, effects_prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        client.delete(refunds_key(effects_prefix))
        client.close()


def _refunds(effects: redis.Redis, prefix: str) -> list[str]:
    return list(effects.lrange(refunds_key(prefix), 0, -1))  # type: ignore[arg-type]


def _ask(page: object, prompt: str) -> None:
    page.fill("#prompt", prompt)  # type: ignore[attr-defined]
    page.press("#prompt", "Enter")  # type: ignore[attr-defined]


def _turn(page: object, n: int) -> str:
    """The CSS selector of the page's n-th turn (1-based)."""
    return f"#transcript .turn:nth-of-type({n})"


def _reload(page: object, *, from_the_stream: bool) -> None:
    """Reloads the page: it redraws from its stored copy of the lines, or, with that copy
    dropped, from the start of the session's stream."""
    if from_the_stream:
        page.evaluate("sessionStorage.clear()")  # type: ignore[attr-defined]
    page.reload()  # type: ignore[attr-defined]
    page.wait_for_function("document.getElementById('status').dataset.state === 'live'")  # type: ignore[attr-defined]


def _tool_results(model: ScriptedModel) -> list[str]:
    """The content of every tool message the model was sent last in a request."""
    out = []
    for request in model.requests:
        messages = request.body.get("messages") or []
        if messages and messages[-1].get("role") == "tool":
            out.append(str(messages[-1].get("content")))
    return out


def test_approve_and_deny_from_the_page_and_the_buttons_after_a_reload(
    dev: WebProcess, page_model: ScriptedModel, effects: redis.Redis, effects_prefix: str, browser_page: object
) -> None:
    page = browser_page
    page.goto(dev.url + "/")  # type: ignore[attr-defined]
    _ask(page, "refund:25")
    first = _turn(page, 1)
    page.wait_for_selector(f"{first} .tool.waiting button.approve")  # type: ignore[attr-defined]
    page.wait_for_selector(f"{first} .paused")  # type: ignore[attr-defined]
    assert "waiting for a decision" in page.text_content(f"{first} .paused")  # type: ignore[attr-defined]
    assert page.is_visible(f"{first} .tool.waiting button.deny")  # type: ignore[attr-defined]
    assert '"amount":25' in page.text_content(f"{first} .tool.waiting pre")  # type: ignore[attr-defined]
    assert page.is_visible("#stop")  # type: ignore[attr-defined]  # the parked turn is still open: Stop ends it
    assert page.locator(f"{first} .end").count() == 0  # type: ignore[attr-defined]
    assert _refunds(effects, effects_prefix) == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page_waiting_for_approval.png"), full_page=True)  # type: ignore[attr-defined]

    # A reload while parked shows the buttons again, once, from the stored lines or from the stream.
    for from_the_stream in (False, True):
        _reload(page, from_the_stream=from_the_stream)
        page.wait_for_selector(f"{first} .tool.waiting button.approve")  # type: ignore[attr-defined]
        assert page.locator(".tool").count() == 1  # type: ignore[attr-defined]
        assert page.locator("button.approve").count() == 1  # type: ignore[attr-defined]

    page.click(f"{first} button.approve")  # type: ignore[attr-defined]
    page.wait_for_selector(f"{first} .end")  # type: ignore[attr-defined]
    assert page.get_attribute(f"{first} .end", "data-stop") == "end_turn"  # type: ignore[attr-defined]
    assert page.text_content(f"{first} .assistant .text") == "result:refunded 25"  # type: ignore[attr-defined]
    assert page.locator(f"{first} .decide").count() == 0  # type: ignore[attr-defined]
    assert page.locator(f"{first} .paused").count() == 0  # type: ignore[attr-defined]
    assert page.text_content(f"{first} .tool .note").startswith("approved")  # type: ignore[attr-defined]
    assert "refunded 25" in page.text_content(f"{first} .tool .result")  # type: ignore[attr-defined]
    assert len(_refunds(effects, effects_prefix)) == 1
    assert not page.is_visible("#stop")  # type: ignore[attr-defined]

    # A second prompt of the same session, denied.
    _ask(page, "refund:40")
    second = _turn(page, 2)
    page.wait_for_selector(f"{second} .tool.waiting button.deny")  # type: ignore[attr-defined]
    page.click(f"{second} button.deny")  # type: ignore[attr-defined]
    page.wait_for_selector(f"{second} .end")  # type: ignore[attr-defined]
    assert page.text_content(f"{second} .assistant .text").startswith("result:" + DENIED)  # type: ignore[attr-defined]
    assert page.text_content(f"{second} .tool .note").startswith("denied")  # type: ignore[attr-defined]
    assert page.locator(".decide").count() == 0  # type: ignore[attr-defined]
    results = _tool_results(page_model)
    assert results[-1].startswith(DENIED) and results[-2] == "refunded 25", results  # the request after the click
    assert len(_refunds(effects, effects_prefix)) == 1  # the denied refund never ran

    # A reload after the decisions shows no button, from the stored lines or from the stream.
    for from_the_stream in (False, True):
        _reload(page, from_the_stream=from_the_stream)
        page.wait_for_selector(f"{second} .end")  # type: ignore[attr-defined]
        assert page.locator(".tool").count() == 2  # type: ignore[attr-defined]
        assert page.locator(".decide, .paused, .tool.waiting").count() == 0  # type: ignore[attr-defined]
        assert page.text_content(f"{first} .tool .note").startswith("approved")  # type: ignore[attr-defined]
        assert page.text_content(f"{second} .tool .note").startswith("denied")  # type: ignore[attr-defined]
    assert len(_refunds(effects, effects_prefix)) == 1
    page.screenshot(path=str(ARTIFACTS / "page_after_decisions.png"), full_page=True)  # type: ignore[attr-defined]


def test_a_client_side_tool_takes_its_result_from_the_page(dev: WebProcess, browser_page: object) -> None:
    page = browser_page
    page.goto(dev.url + "/")  # type: ignore[attr-defined]
    _ask(page, "pick:*.txt")
    page.wait_for_selector(".tool.waiting input.decide-result")  # type: ignore[attr-defined]
    assert page.is_visible(".tool.waiting button.submit") and page.is_visible(".tool.waiting button.deny")  # type: ignore[attr-defined]
    assert page.locator(".tool.waiting button.approve").count() == 0  # type: ignore[attr-defined]
    page.fill(".tool.waiting input.decide-result", "notes.txt")  # type: ignore[attr-defined]
    page.click(".tool.waiting button.submit")  # type: ignore[attr-defined]
    page.wait_for_selector(".assistant .end")  # type: ignore[attr-defined]
    assert "notes.txt" in page.text_content(".assistant .text")  # type: ignore[attr-defined]
    assert page.locator(".decide, .paused, .tool.waiting").count() == 0  # type: ignore[attr-defined]


def test_a_refused_decision_is_shown_and_the_stream_then_answers_the_call(dev: WebProcess, browser_page: object) -> None:
    """Someone else decided first: the page's POST is refused FX_DECISION_REPEATED. The refusal
    is given by a route of this test (a real one races the stream's lines that answer the call);
    the call itself is then approved over HTTP, and the stream's lines take the buttons away."""
    import httpx

    page = browser_page
    page.goto(dev.url + "/")  # type: ignore[attr-defined]
    _ask(page, "refund:7")
    page.wait_for_selector(".tool.waiting button.approve")  # type: ignore[attr-defined]
    refusal = {"error": {"code": "FX_DECISION_REPEATED", "message": "the call is already decided"}}
    posted: list[dict[str, object]] = []

    def refuse(route: object) -> None:
        posted.append(json.loads(route.request.post_data or "{}"))  # type: ignore[attr-defined]
        route.fulfill(status=409, content_type="application/json", body=json.dumps(refusal))  # type: ignore[attr-defined]

    page.route("**/calls/**", refuse)  # type: ignore[attr-defined]
    page.click(".tool.waiting button.deny")  # type: ignore[attr-defined]
    page.wait_for_selector(".decision-status[data-state='repeated']")  # type: ignore[attr-defined]
    assert "someone else" in page.text_content(".decision-status")  # type: ignore[attr-defined]
    assert page.is_disabled("button.approve") and page.is_disabled("button.deny")  # type: ignore[attr-defined]
    assert posted and posted[0]["type"] == "deny" and str(posted[0]["messageId"]).startswith("web_")

    session_id = page.evaluate("new URLSearchParams(location.search).get('session')")  # type: ignore[attr-defined]
    call_id = page.get_attribute(".tool.waiting", "data-tool-id")  # type: ignore[attr-defined]
    answer = httpx.post(f"{dev.url}/v1/sessions/{session_id}/calls/{call_id}", json={"type": "approve"}, timeout=10)
    assert answer.status_code == 202, answer.text
    page.wait_for_selector(".assistant .end")  # type: ignore[attr-defined]
    assert page.locator(".decide, .tool.waiting, .decision-status").count() == 0  # type: ignore[attr-defined]
    assert page.text_content(".tool .note").startswith("approved")  # type: ignore[attr-defined]
    assert page.text_content(".assistant .text") == "result:refunded 7"  # type: ignore[attr-defined]


def test_decision_lines_say_who_decided_and_take_the_buttons_away(dev: WebProcess, browser_page: object) -> None:
    """The page's render() given the lines of a turn that parks on two calls and is decided
    call by call (an approval_decision line each), as the stream would give them."""
    page = browser_page
    page.goto(dev.url + "/")  # type: ignore[attr-defined]
    render = "lines => { for (const line of lines) render(line); }"
    m = "msg_lines"
    refund = {"id": "c1", "name": "refund", "kind": "approval", "input": {"amount": 5}, "step": 1}
    pick = {"id": "c2", "name": "pick_file", "kind": "external", "input": {"pattern": "*"}, "step": 1}
    page.evaluate(render, [  # type: ignore[attr-defined]
        {"type": "turn_start", "messageId": m, "sessionId": "fxs_lines", "input": "two calls"},
        {"type": "approval_request", "messageId": m, **refund},
        {"type": "approval_request", "messageId": m, **pick},
        {"type": "turn_pause", "messageId": m, "pendingCalls": [{**refund, "executionId": "e1"}, {**pick, "executionId": "e2"}]},
    ])
    assert page.text_content(".paused") == "waiting for a decision on 2 calls"  # type: ignore[attr-defined]
    assert page.locator(".decide").count() == 2 and page.is_visible("#stop")  # type: ignore[attr-defined]

    page.evaluate(render, [  # type: ignore[attr-defined]
        {"type": "turn_resume", "messageId": m, "sessionId": "fxs_lines", "interrupted": False},
        {"type": "approval_decision", "messageId": m, "id": "c1", "name": "refund", "decision": "deny", "by": "ana",
         "reason": "too much", "step": 1},
    ])
    assert page.text_content("[data-tool-id='c1'] .note") == "denied by ana: too much"  # type: ignore[attr-defined]
    assert page.locator("[data-tool-id='c1'] .decide").count() == 0  # type: ignore[attr-defined]
    assert page.locator("[data-tool-id='c2'] .decide").count() == 1  # type: ignore[attr-defined]
    assert page.is_visible(".paused")  # type: ignore[attr-defined]  # c2 still waits

    page.evaluate(render, [  # type: ignore[attr-defined]
        {"type": "approval_decision", "messageId": m, "id": "c2", "name": "pick_file", "decision": "result", "step": 1},
        {"type": "tool_end", "messageId": m, "id": "c1", "name": "refund", "isError": True,
         "content": DENIED + ": too much", "step": 1},
        {"type": "tool_end", "messageId": m, "id": "c2", "name": "pick_file", "isError": False, "content": "a.txt", "step": 1},
        {"type": "text_delta", "messageId": m, "delta": "ok", "step": 2},
        {"type": "turn_end", "messageId": m, "stopReason": "end_turn", "usage": {}},
    ])
    assert page.text_content("[data-tool-id='c2'] .note") == "result given"  # type: ignore[attr-defined]
    assert page.text_content("[data-tool-id='c1'] .note") == "denied by ana: too much"  # type: ignore[attr-defined]
    assert page.locator(".decide, .paused, .tool.waiting").count() == 0  # type: ignore[attr-defined]
    assert page.locator(".tool").count() == 2 and not page.is_visible("#stop")  # type: ignore[attr-defined]
