"""The session timeline: built from stored lines alone (`fxworker.timeline`), served at
`GET /v1/sessions/{id}/timeline` under the session's auth, printed by `fx inspect`."""

from __future__ import annotations

import json
from typing import Any

import httpx

from fxengine.loop import AMBIGUOUS_RESULT
from fxworker.timeline import timeline_of
from tests.web._server import WebProcess
from tests.web.conftest import TOKEN, read_turn
from tests.web.test_cli import fx


def _lines(*specs: tuple[int, str, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": kind, "messageId": mid, "epoch": epoch, "cursor": n + 1, **body}
            for n, (epoch, mid, kind, body) in enumerate(specs)]


def test_each_worker_part_of_each_turn_and_each_tool_call_is_told() -> None:
    lines = _lines(
        # m1: its worker died mid-tool; the next took over and ran the idempotent call again.
        (1, "m1", "turn_start", {"input": "weather?"}),
        (1, "m1", "text_delta", {"delta": "Let me ", "step": 1}),
        (1, "m1", "tool_start", {"id": "c1", "name": "lookup", "step": 1}),
        (2, "m1", "turn_resume", {"interrupted": True}),
        (2, "m1", "tool_start", {"id": "c1", "name": "lookup", "step": 1}),
        (2, "m1", "tool_end", {"id": "c1", "name": "lookup", "isError": False, "content": "sunny", "step": 1}),
        (2, "m1", "text_delta", {"delta": "Sunny.", "step": 2}),
        (2, "m1", "turn_end", {"stopReason": "end_turn", "usage": {}}),
        # m2: a call with effects left running by a dead worker is answered, not run again.
        (2, "m2", "turn_start", {"input": "send it"}),
        (2, "m2", "tool_start", {"id": "c2", "name": "send", "step": 1}),
        (3, "m2", "turn_resume", {"interrupted": True}),
        (3, "m2", "tool_end", {"id": "c2", "name": "send", "isError": True, "content": AMBIGUOUS_RESULT, "step": 1}),
        (3, "m2", "turn_end", {"stopReason": "end_turn", "usage": {}}),
        # m3: yielded at the deadline, continued as if nothing happened.
        (3, "m3", "turn_start", {"input": "long one"}),
        (3, "m3", "turn_yield", {}),
        (4, "m3", "turn_resume", {"interrupted": False}),
        (4, "m3", "turn_end", {"stopReason": "end_turn", "usage": {}}),
        # m4: cut off mid-request at the deadline: the step's output is withdrawn.
        (4, "m4", "turn_start", {"input": "stall"}),
        (4, "m4", "text_delta", {"delta": "half", "step": 1}),
        (4, "m4", "turn_yield", {}),
        (5, "m4", "turn_resume", {"interrupted": True, "retract": [1]}),
        (5, "m4", "session_error", {"code": "FX_DEADLINE_CUTOFFS", "message": "cut off 3 times", "id": "m4"}),
        (5, "m4", "turn_end", {"stopReason": "cancelled", "usage": {}, "error": {"code": "FX_DEADLINE_CUTOFFS"}}),
    )
    turns = {t["messageId"]: t for t in timeline_of("s1", lines)["turns"]}
    assert list(turns) == ["m1", "m2", "m3", "m4"]
    how = {mid: [(d["epoch"], d["how"]) for d in t["deliveries"]] for mid, t in turns.items()}
    assert how == {"m1": [(1, "died"), (2, "ended")], "m2": [(2, "died"), (3, "ended")],
                   "m3": [(3, "yielded"), (4, "ended")], "m4": [(4, "cut off"), (5, "ended")]}
    assert [(c["id"], c["outcome"], c["epochs"]) for c in turns["m1"]["tools"]] == [("c1", "rerun", [1, 2])]
    assert [(c["id"], c["outcome"], c["isError"]) for c in turns["m2"]["tools"]] == [("c2", "may have partly run", True)]
    assert [(s["step"], s["epoch"], s["withdrawn"]) for s in turns["m4"]["steps"]] == [(1, 4, True)]
    assert turns["m4"]["stopReason"] == "cancelled" and turns["m4"]["error"]["code"] == "FX_DEADLINE_CUTOFFS"
    assert turns["m1"]["input"] == "weather?" and turns["m3"]["stopReason"] == "end_turn"


def test_the_route_and_fx_inspect_show_a_tool_turn(web_open: WebProcess, api: httpx.Client) -> None:
    created = api.post("/v1/sessions", json={"input": "tool:ana"})
    sid = created.json()["sessionId"]
    assert read_turn(api, sid)[-1]["stopReason"] == "end_turn"
    found = api.get(f"/v1/sessions/{sid}/timeline")
    assert found.status_code == 200, found.text
    (turn,) = found.json()["turns"]
    assert turn["messageId"] == created.json()["messageId"] and turn["input"] == "tool:ana"
    assert [d["how"] for d in turn["deliveries"]] == ["ended"] and turn["stopReason"] == "end_turn"
    assert [(c["name"], c["outcome"], c["isError"]) for c in turn["tools"]] == [("lookup", "ran", False)]

    shown = fx(web_open.url, "inspect", sid)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"{sid}: 1 turn(s)"
    assert "    epoch 1: ended" in shown.stdout or "ended (cursors" in shown.stdout
    assert "tool lookup" in shown.stdout and ": ran" in shown.stdout
    as_json = fx(web_open.url, "inspect", sid, "--json")
    assert json.loads(as_json.stdout) == found.json()
    assert api.get("/v1/sessions/fxs_01J00000000000000000000000/timeline").status_code == 404


def test_the_timeline_takes_the_sessions_auth(web_auth: WebProcess) -> None:
    with httpx.Client(base_url=web_auth.url, timeout=15.0) as client:
        refused = client.get("/v1/sessions/fxs_01J00000000000000000000000/timeline")
        assert refused.status_code == 401
        sid = client.post("/v1/sessions", json={"input": "hi"}, headers={"Authorization": f"Bearer {TOKEN}"}).json()["sessionId"]
        assert client.get(f"/v1/sessions/{sid}/timeline").status_code == 401
        assert client.get(f"/v1/sessions/{sid}/timeline", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
