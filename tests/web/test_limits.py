"""The steer limits of §6 and the tool-input preview of §4, over real HTTP with a real worker.

Steers queue while a tool runs (they join the turn after it), so a turn parked in the
`slow` tool holds every steer sent meanwhile: the 65th, or the one past 1 MiB queued, is
refused with 429 `FX_LIMIT_QUEUE` and `Retry-After: 1`; a single steer over 64 KiB of text
(UTF-8 bytes, not its JSON) is 400 `FX_LIMIT_STEER_SIZE`. A `tool_start` whose
input is over 64 KiB of JSON carries `inputPreview` + `inputTruncated: true` instead.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fxengine.testing import Reply, ScriptedModel, text, tool_call
from tests.web._model import responder
from tests.web.conftest import read_turn

pytestmark = [pytest.mark.redis, pytest.mark.celery]

KIB = 1024
PARKED_S = 60  # the slow tool's sleep: far longer than any test here; cancel ends it


def limits_responder(request: Any) -> Reply:
    """`slow` parks the turn in the slow tool; `big:<n>` calls lookup with a q of n chars."""
    messages = request.body.get("messages") or []
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last.get("content"), str) else ""
    if last.get("role") == "user" and content == "slow":
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "slow", {"seconds": PARKED_S}))
    if last.get("role") == "user" and content.startswith("big:"):
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "lookup", {"q": "x" * int(content[4:])}))
    if last.get("role") == "tool":
        return Reply(text("done"))
    return responder(request)


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    """Overrides the web tests' model for this module (its workers and web process use it)."""
    with ScriptedModel() as m:
        m.responder = limits_responder
        yield m


def parked_session(api: httpx.Client) -> str:
    """A session whose turn sits in the slow tool (its `tool_start` is stored)."""
    sid = api.post("/v1/sessions", json={"input": "slow"}).json()["sessionId"]
    with api.stream("GET", f"/v1/sessions/{sid}/stream") as response:
        for raw in response.iter_lines():
            if raw.strip() and json.loads(raw)["type"] == "tool_start":
                return sid
    raise AssertionError("the stream ended before the slow tool started")


def steer(api: httpx.Client, sid: str, body: str, message_id: str) -> httpx.Response:
    return api.post(f"/v1/sessions/{sid}/steer", json={"input": body, "messageId": message_id})


def cancel_and_finish(api: httpx.Client, sid: str) -> list[dict[str, Any]]:
    assert api.post(f"/v1/sessions/{sid}/cancel").status_code == 202
    return read_turn(api, sid)


def test_a_65th_queued_steer_is_refused_429(api: httpx.Client) -> None:
    sid = parked_session(api)
    try:
        for i in range(64):
            response = steer(api, sid, f"steer {i}", f"q-{i}")
            assert response.status_code == 202, (i, response.text)
        refused = steer(api, sid, "one too many", "q-64")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "FX_LIMIT_QUEUE"
        assert refused.headers["retry-after"] == "1"
        # A resend of an accepted steer is answered from the store, full queue or not.
        again = steer(api, sid, "steer 0", "q-0")
        assert again.status_code == 202 and again.json()["repeated"] is True
    finally:
        lines = cancel_and_finish(api, sid)
    assert lines[-1]["stopReason"] == "cancelled"


def test_steers_past_1_mib_queued_are_refused_429(api: httpx.Client) -> None:
    sid = parked_session(api)
    body = "y" * (60 * KIB)  # 17 fit in 1 MiB, the 18th does not
    try:
        for i in range(17):
            response = steer(api, sid, body, f"b-{i}")
            assert response.status_code == 202, (i, response.text)
        refused = steer(api, sid, body, "b-17")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "FX_LIMIT_QUEUE"
        assert refused.headers["retry-after"] == "1"
        # The count is not the limit here: a small steer still fits.
        assert steer(api, sid, "small", "b-small").status_code == 202
    finally:
        cancel_and_finish(api, sid)


@pytest.mark.parametrize("body", ["z" * (64 * KIB + 1), "é" * (32 * KIB + 1)], ids=["ascii", "two-byte"])
def test_a_steer_over_64_kib_is_refused_400_and_its_id_stays_free(api: httpx.Client, body: str) -> None:
    sid = api.post("/v1/sessions", json={"input": "hi"}).json()["sessionId"]
    read_turn(api, sid)
    response = steer(api, sid, body, "too-big")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "FX_LIMIT_STEER_SIZE"
    assert "retry-after" not in response.headers
    fine = steer(api, sid, "a small one", "too-big")
    assert fine.status_code == 202 and fine.json()["repeated"] is False


@pytest.mark.parametrize("body", ["w" * (64 * KIB), '"' * (40 * KIB)], ids=["exactly-64-kib", "40-kib-of-quotes"])
def test_a_steer_within_64_kib_of_text_is_accepted(api: httpx.Client, body: str) -> None:
    sid = parked_session(api)
    try:
        response = steer(api, sid, body, "within")
        assert response.status_code == 202, response.text
    finally:
        cancel_and_finish(api, sid)


def _tool_start(api: httpx.Client, q_chars: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    sid = api.post("/v1/sessions", json={"input": f"big:{q_chars}"}).json()["sessionId"]
    lines = read_turn(api, sid)
    starts = [line for line in lines if line["type"] == "tool_start"]
    assert len(starts) == 1, lines
    return starts[0], lines


def test_a_tool_input_over_64_kib_of_json_streams_as_a_preview(api: httpx.Client, model: ScriptedModel) -> None:
    # {"q":"<n x>"} is n + 8 bytes of compact JSON: n = 65528 is exactly 64 KiB.
    at_limit, _ = _tool_start(api, 64 * KIB - 8)
    assert at_limit["input"] == {"q": "x" * (64 * KIB - 8)} and "inputTruncated" not in at_limit
    over, lines = _tool_start(api, 64 * KIB - 7)
    assert over["inputTruncated"] is True and "input" not in over
    assert over["name"] == "lookup" and over["id"].startswith("call_")
    preview = over["inputPreview"]
    whole = json.dumps({"q": "x" * (64 * KIB - 7)}, separators=(",", ":"))
    assert len(whole) == 64 * KIB + 1 and preview == whole[: 64 * KIB]
    # Only the line is cut: the tool got the whole input and the turn went on.
    ends = [line for line in lines if line["type"] == "tool_end"]
    assert ends and ends[0]["isError"] is False and ends[0]["id"] == over["id"]
    assert lines[-1]["stopReason"] == "end_turn"
    sent = [m for r in model.requests for m in r.body.get("messages") or [] if m.get("role") == "tool"]
    assert any(m.get("tool_call_id") == over["id"] and m["content"] == "found:" + "x" * (64 * KIB - 7) for m in sent)
