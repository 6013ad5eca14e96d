"""The chat page in a real headless Chromium against `fx dev`: a streamed answer, a reload mid-turn,
and the turn continuing from the stored cursor with no text shown twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fxengine.testing import ScriptedModel
from tests.web._model import responder
from tests.browser.conftest import ARTIFACTS, skip_without_chromium
from tests.web._server import WebProcess

pytestmark = [pytest.mark.browser, pytest.mark.slow]


skip_without_chromium()


@pytest.fixture(scope="module")
def page_model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


@pytest.fixture(scope="module")
def dev(page_model: ScriptedModel) -> Iterator[WebProcess]:
    env = {"FX_TEST_MODEL_URL": page_model.base_url, "FX_TEST_AGENTS": "default"}
    web = WebProcess("dev", env=env, args=("--agents", "tests.durable.agents"))
    try:
        yield web.wait_ready()
    finally:
        web.close()


def assistant_text(page: object) -> str:
    return page.eval_on_selector_all(".assistant .text", "els => els.map(e => e.textContent).join('|')")  # type: ignore[attr-defined]


def test_a_streamed_answer_survives_a_reload_without_duplicated_text(
    dev: WebProcess, page_model: ScriptedModel, browser_page: object
) -> None:
    page = browser_page
    page.goto(dev.url + "/")  # type: ignore[attr-defined]
    page.fill("#prompt", "hold:page1")  # type: ignore[attr-defined]
    page.press("#prompt", "Enter")  # type: ignore[attr-defined]
    page_model.wait_held("page1", timeout_s=15)
    page.wait_for_function("document.querySelector('.assistant .text')?.textContent === 'partial '")  # type: ignore[attr-defined]
    assert "session=fxs_" in page.url  # type: ignore[attr-defined]
    cursor_before = int(page.text_content("#cursor"))  # type: ignore[attr-defined]

    page.reload()  # type: ignore[attr-defined]  # the connection is cut mid-turn
    page.wait_for_selector(".assistant .text")  # type: ignore[attr-defined]
    assert assistant_text(page) == "partial "
    assert int(page.text_content("#cursor")) == cursor_before  # type: ignore[attr-defined]
    page.wait_for_function("document.getElementById('status').dataset.state === 'live'")  # type: ignore[attr-defined]

    page_model.release("page1")
    page.wait_for_selector(".assistant .end")  # type: ignore[attr-defined]
    assert assistant_text(page) == "partial rest"
    assert page.get_attribute(".assistant .end", "data-stop") == "end_turn"  # type: ignore[attr-defined]
    assert page.text_content(".assistant .end") == "done"  # type: ignore[attr-defined]
    assert page.text_content(".user") == "hold:page1"  # type: ignore[attr-defined]
    assert page.locator(".turn").count() == 1  # type: ignore[attr-defined]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page_after_reload.png"), full_page=True)  # type: ignore[attr-defined]


def test_tool_calls_and_results_are_shown_as_they_stream(dev: WebProcess, browser_page: object) -> None:
    page = browser_page
    page.goto(dev.url + "/")  # type: ignore[attr-defined]
    page.fill("#prompt", "tool:lisbon")  # type: ignore[attr-defined]
    page.click("#send")  # type: ignore[attr-defined]
    page.wait_for_selector(".assistant .end")  # type: ignore[attr-defined]
    tool = page.text_content(".tool")  # type: ignore[attr-defined]
    assert "lookup" in tool and "lisbon" in tool and "found:lisbon" in tool
    assert assistant_text(page) == "looked up"


def _start_held(page: object, url: str, model: ScriptedModel, prompt: str, name: str) -> None:
    page.goto(url + "/")  # type: ignore[attr-defined]
    assert page.is_visible("#empty")  # type: ignore[attr-defined]
    page.fill("#prompt", prompt)  # type: ignore[attr-defined]
    page.press("#prompt", "Enter")  # type: ignore[attr-defined]
    model.wait_held(name, timeout_s=15)
    page.wait_for_function("document.querySelector('.assistant .text')?.textContent === 'partial '")  # type: ignore[attr-defined]
    assert not page.is_visible("#empty")  # type: ignore[attr-defined]


def test_stop_cancels_the_running_turn(dev: WebProcess, page_model: ScriptedModel, browser_page: object) -> None:
    page = browser_page
    _start_held(page, dev.url, page_model, "hold:page-stop", "page-stop")
    assert page.is_visible("#stop") and page.text_content("#send") == "Steer"  # type: ignore[attr-defined]
    try:
        page.click("#stop")  # type: ignore[attr-defined]
        page.wait_for_selector(".assistant .end")  # type: ignore[attr-defined]
    finally:
        page_model.release("page-stop")
    assert page.get_attribute(".assistant .end", "data-stop") == "cancelled"  # type: ignore[attr-defined]
    assert page.text_content(".assistant .end") == "stopped"  # type: ignore[attr-defined]
    assert not page.is_visible("#stop") and page.text_content("#send") == "Send"  # type: ignore[attr-defined]


def test_typing_while_a_turn_runs_steers_it(dev: WebProcess, page_model: ScriptedModel, browser_page: object) -> None:
    page = browser_page
    _start_held(page, dev.url, page_model, "hold:page-steer", "page-steer")
    page.fill("#prompt", "in French please")  # type: ignore[attr-defined]
    page.press("#prompt", "Enter")  # type: ignore[attr-defined]
    try:
        # The worker sees the steer within a quarter second and joins it: the held reply is cut
        # short and the turn goes on with the steer (§6).
        page.wait_for_selector(".assistant .user")  # type: ignore[attr-defined]
        page.wait_for_selector(".assistant .end")  # type: ignore[attr-defined]
    finally:
        page_model.release("page-steer")
    assert page.locator(".turn").count() == 1, page.inner_text("#transcript")  # type: ignore[attr-defined]  # a steer, not a second turn
    assert page.text_content(".assistant .user") == "in French please"  # type: ignore[attr-defined]
    assert "echo:in French please" in assistant_text(page)


def test_a_turn_resumed_after_a_killed_worker_is_marked(dev: WebProcess, page_model: ScriptedModel,
                                                        browser_page: object) -> None:
    import os
    import signal

    page = browser_page
    page.set_viewport_size({"width": 390, "height": 844})  # type: ignore[attr-defined]
    page.goto(dev.url + "/")  # type: ignore[attr-defined]
    page.fill("#prompt", "holdonce:page-kill")  # type: ignore[attr-defined]
    page.press("#prompt", "Enter")  # type: ignore[attr-defined]
    page_model.wait_held("page-kill", timeout_s=15)
    assert dev.proc is not None
    os.kill(dev.proc.pid, signal.SIGUSR1)  # fx dev: embedded worker 0 dies mid-turn, a fresh one replaces it
    try:
        page.wait_for_selector(".assistant .resumed", timeout=20_000)  # type: ignore[attr-defined]
        page.wait_for_selector(".assistant .end")  # type: ignore[attr-defined]
    finally:
        page_model.release("page-kill")
    assert "after the kill" in assistant_text(page)
    assert page.text_content(".assistant .end") == "done"  # type: ignore[attr-defined]
    width = page.evaluate("document.documentElement.scrollWidth")  # type: ignore[attr-defined]
    assert width <= 390, f"the page is {width} px wide at 390 px"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page_resumed_390.png"), full_page=True)  # type: ignore[attr-defined]
    # The timeline of the same session: the killed worker's part died, its replacement's ended.
    page.click("#show-timeline")  # type: ignore[attr-defined]
    page.wait_for_selector("#timeline .tl-part")  # type: ignore[attr-defined]
    hows = page.eval_on_selector_all("#timeline .tl-part", "els => els.map(e => e.dataset.how)")  # type: ignore[attr-defined]
    assert hows == ["died", "ended"], page.inner_text("#timeline")  # type: ignore[attr-defined]
    assert "holdonce:page-kill" in page.inner_text("#timeline .tl-turn")  # type: ignore[attr-defined]
    page.screenshot(path=str(ARTIFACTS / "page_timeline_390.png"), full_page=True)  # type: ignore[attr-defined]
    page.click("#show-timeline")  # type: ignore[attr-defined]
    assert not page.is_visible("#timeline")  # type: ignore[attr-defined]


def test_the_timeline_shows_each_turn_with_its_worker_and_tool_call(dev: WebProcess, browser_page: object) -> None:
    page = browser_page
    page.goto(dev.url + "/")  # type: ignore[attr-defined]
    assert not page.is_visible("#show-timeline")  # type: ignore[attr-defined]  # no session yet
    page.fill("#prompt", "tool:porto")  # type: ignore[attr-defined]
    page.click("#send")  # type: ignore[attr-defined]
    page.wait_for_selector(".assistant .end")  # type: ignore[attr-defined]

    page.click("#show-timeline")  # type: ignore[attr-defined]
    page.wait_for_selector("#timeline .tl-tool")  # type: ignore[attr-defined]
    assert page.get_attribute("#show-timeline", "aria-expanded") == "true"  # type: ignore[attr-defined]
    assert page.inner_text("#timeline .tl-turn .tl-head") == "tool:porto — done"  # type: ignore[attr-defined]
    hows = page.eval_on_selector_all("#timeline .tl-part", "els => els.map(e => e.dataset.how)")  # type: ignore[attr-defined]
    assert hows == ["ended"], page.inner_text("#timeline")  # type: ignore[attr-defined]
    tool = page.locator("#timeline .tl-tool")  # type: ignore[attr-defined]
    assert tool.get_attribute("data-outcome") == "ran" and tool.inner_text() == "tool lookup: ran"
    shown_id = tool.get_attribute("data-tool-id")
    assert shown_id and shown_id == page.get_attribute(".assistant .tool", "data-tool-id")  # type: ignore[attr-defined]

    # Open while the next turn runs: its end brings it into the timeline.
    page.fill("#prompt", "and again")  # type: ignore[attr-defined]
    page.click("#send")  # type: ignore[attr-defined]
    page.wait_for_selector("#timeline .tl-turn:nth-of-type(2) .tl-part[data-how='ended']")  # type: ignore[attr-defined]
    heads = page.eval_on_selector_all("#timeline .tl-head", "els => els.map(e => e.textContent)")  # type: ignore[attr-defined]
    assert heads == ["tool:porto — done", "and again — done"]
    page.click("#show-timeline")  # type: ignore[attr-defined]
    assert not page.is_visible("#timeline")  # type: ignore[attr-defined]
    assert page.get_attribute("#show-timeline", "aria-expanded") == "false"  # type: ignore[attr-defined]
