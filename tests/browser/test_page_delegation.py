"""The chat page in a real headless Chromium against `fx dev` running two agents: `triage`,
whose `billing` tool hands the task to agent `billing` (`billing.as_tool()`), and `billing`
(tests/upgrade/delegation_agents.py, both on the scripted model of this module).

While billing's model reply is held, the parent's call box shows where the call went (a
link to the child session) and no decision buttons, and its pause note says it waits for
the agents; so does a reload, from the page's stored lines or from the stream. After the
release the box says how billing's turn ended and the parent ends with billing's answer;
the link opens the child session, which shows the prompt triage sent and billing's answer.

The page starts a session of a named agent with `?agent=<name>` (the server has no agent
called `default`, so a new session must name one)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call, usage
from tests.browser.conftest import ARTIFACTS, skip_without_chromium
from tests.web._server import WebProcess
from tests.durable.conftest import last_message_text, system_text

pytestmark = [pytest.mark.browser, pytest.mark.slow]

skip_without_chromium()

HANDED = "waiting for the agents it handed the work to"


def _task(prompt: str) -> str:
    """What triage's model hands to billing for `prompt`."""
    return "please settle: " + prompt


def _billed(task: str) -> str:
    """Billing's answer to `task` (its `hold:<name>` word taken out)."""
    return "billed " + re.sub(r"\s*hold:\S+", "", task.removeprefix("please settle: "))


def responder(request: Any) -> Reply:
    """The agents are told apart by their instructions (the system message). triage calls
    `billing` with `_task(prompt)` and answers "triage: " + the call's result; billing
    answers `_billed(task)`, holding its reply after the first word until `hold:<name>` in
    the task is released."""
    role, last = last_message_text(request)
    if "triage" in system_text(request):
        if role == "tool":
            return Reply(text("triage: ", last), usage(5, 3))
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "billing", {"input": _task(last)}), usage(7, 2))
    answer = _billed(last)
    held = re.search(r"hold:(\S+)", last)
    if held:
        first, rest = answer.split(" ", 1)
        return Reply(text(first + " "), hold(held.group(1)), text(rest), usage(11, 4))
    return Reply(text(answer), usage(11, 4))


@pytest.fixture(scope="module")
def page_model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


@pytest.fixture(scope="module")
def dev(page_model: ScriptedModel) -> Iterator[WebProcess]:
    web = WebProcess("dev", env={"FX_TEST_MODEL_URL": page_model.base_url},
                     args=("--agents", "tests.upgrade.delegation_agents", "--workers", "2"))
    try:
        yield web.wait_ready()
    finally:
        web.close()


def _ask(page: Any, prompt: str) -> None:
    page.fill("#prompt", prompt)
    page.press("#prompt", "Enter")


def _reload(page: Any, *, from_the_stream: bool) -> None:
    """Reloads the page: it redraws from its stored copy of the lines, or, with that copy
    dropped, from the start of the session's stream."""
    if from_the_stream:
        page.evaluate("sessionStorage.clear()")
    page.reload()
    page.wait_for_function("document.getElementById('status').dataset.state === 'live'")


def _shows_the_handed_call(page: Any, child: str | None = None) -> str:
    """Checks the parked parent as the page shows it: one call box, handed to billing in
    session `child` (any, when None), with no decision control, and the pause note that says
    it waits for the agents. Returns the child's session id."""
    turn = "#transcript .turn:nth-of-type(1)"
    page.wait_for_selector(f"{turn} .tool.waiting .delegate a")
    page.wait_for_selector(f"{turn} .paused")
    assert page.locator(".tool").count() == 1
    assert page.locator(".delegate").count() == 1
    row = page.text_content(f"{turn} .tool .delegate")
    link = page.text_content(f"{turn} .tool .delegate a")
    assert link.startswith("fxs_") and (child is None or link == child), (link, child)
    assert row == f"→ billing (session {link})", row
    assert page.get_attribute(f"{turn} .tool .delegate a", "href") == f"?session={link}"
    assert page.get_attribute(f"{turn} .tool", "data-delegate") == link
    assert page.text_content(f"{turn} .tool .note") == "waiting for agent billing"
    assert page.locator("button.approve, button.deny, button.submit, .decide, input.decide-result").count() == 0
    assert page.text_content(f"{turn} .paused") == HANDED
    assert page.locator(".delegate-end, .end").count() == 0
    assert page.is_visible("#stop")  # the parked turn is still open
    assert page.get_attribute("#prompt", "placeholder").startswith("The answer waits for the agents it handed the work to")
    return link


def test_a_call_handed_to_another_agent_and_its_session(
    dev: WebProcess, page_model: ScriptedModel, browser_page: Any
) -> None:
    page = browser_page
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    name = f"h{uuid.uuid4().hex[:6]}"
    prompt = f"invoice 42 hold:{name}"
    task, answer = _task(prompt), _billed(_task(prompt))
    page.goto(dev.url + "/?agent=triage")
    _ask(page, prompt)
    released = False
    try:
        turn = "#transcript .turn:nth-of-type(1)"
        page.wait_for_selector(f"{turn} .user")
        assert page.text_content(f"{turn} .user") == prompt
        parent = page.evaluate("new URLSearchParams(location.search).get('session')")
        child = _shows_the_handed_call(page)
        assert child != parent
        assert json.loads(page.text_content(f"{turn} .tool pre")) == {"input": task}
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "page_waiting_for_an_agent.png"), full_page=True)

        # A reload while the parent waits redraws the same, from the stored lines or the stream.
        for from_the_stream in (False, True):
            _reload(page, from_the_stream=from_the_stream)
            assert _shows_the_handed_call(page, child) == child

        page_model.release(name)
        released = True
        page.wait_for_selector(f"{turn} .tool .delegate-end")
        page.wait_for_selector(f"{turn} .end")
        assert page.text_content(f"{turn} .tool .delegate-end") == "← billing: done"
        assert page.get_attribute(f"{turn} .tool .delegate-end", "data-stop") == "end_turn"
        assert page.get_attribute(f"{turn} .end", "data-stop") == "end_turn"
        assert page.text_content(f"{turn} .end") == "done"
        assert page.text_content(f"{turn} .assistant .text") == "triage: " + answer
        assert page.text_content(f"{turn} .tool .result") == "← " + answer
        assert page.text_content(f"{turn} .tool .note") == "answered by agent billing"  # the child's reply
        assert page.locator(".paused, .tool.waiting, .decide, button.approve, button.deny").count() == 0
        assert page.text_content(f"{turn} .tool .delegate a") == child  # the link stays
        assert not page.is_visible("#stop")
        page.screenshot(path=str(ARTIFACTS / "page_after_the_agent_answered.png"), full_page=True)

        # The link opens the child session in the page: the prompt triage sent, billing's answer.
        page.click(f"{turn} .tool .delegate a")
        page.wait_for_function("sid => new URLSearchParams(location.search).get('session') === sid", arg=child)
        page.wait_for_function("document.getElementById('status').dataset.state === 'live'")
        page.wait_for_selector("#transcript .turn:nth-of-type(1) .end")
        assert page.text_content("#session-label") == child
        assert page.locator("#transcript .turn").count() == 1
        assert page.text_content("#transcript .turn .user") == task
        assert page.text_content("#transcript .turn .assistant .text") == answer
        assert page.get_attribute("#transcript .turn .end", "data-stop") == "end_turn"
        assert page.locator(".tool, .delegate, .paused").count() == 0
        page.screenshot(path=str(ARTIFACTS / "page_child_session.png"), full_page=True)
        assert errors == []
    finally:
        if not released:
            page_model.release(name)


def test_a_new_session_without_an_agent_is_refused_by_a_server_of_several(dev: WebProcess, browser_page: Any) -> None:
    """Without `?agent=`, the server (no agent called `default`) refuses the session and the
    page says so, naming the agents it serves."""
    page = browser_page
    page.goto(dev.url + "/")
    _ask(page, "hello")
    page.wait_for_selector("#transcript .error")
    assert page.text_content("#transcript .error") == (
        "FX_UNKNOWN_AGENT: name the agent: this server serves billing, triage")
    assert page.locator("#transcript .turn").count() == 0
