"""The session timeline: built from stored lines alone (`fxworker.timeline`), served at
`GET /v1/sessions/{id}/timeline` under the session's auth, printed by `fx inspect`."""

from __future__ import annotations

import json
from typing import Any

import httpx

from fxengine.loop import AMBIGUOUS_RESULT
from fxengine.testing import ScriptedModel
from fxworker.timeline import INPUT_PREVIEW_CHARS, timeline_of
from tests.web._server import WebProcess
from tests.web.conftest import TOKEN, read_turn
from tests.web.test_cli import UNKNOWN_SESSION, fx


def _lines(*specs: tuple[int, str, str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored lines: (epoch, messageId, type, fields), cursors 1, 2, ..."""
    return [{"type": kind, "messageId": mid, "epoch": epoch, "cursor": n + 1, **body}
            for n, (epoch, mid, kind, body) in enumerate(specs)]


# ------------------------------------------------------------------------------ the reading


def test_a_turn_whose_worker_died_mid_tool_and_the_next_epoch_ended() -> None:
    lines = _lines(
        (1, "m1", "turn_start", {"sessionId": "s1", "input": "weather?"}),
        (1, "m1", "text_delta", {"delta": "Let me ", "step": 1}),
        (1, "m1", "tool_start", {"id": "c1", "name": "lookup", "input": {"q": "lisbon"}, "step": 1}),
        # epoch 1 was killed here; epoch 2 took the session over and ran the idempotent call again
        (2, "m1", "turn_resume", {"sessionId": "s1", "interrupted": True}),
        (2, "m1", "tool_start", {"id": "c1", "name": "lookup", "input": {"q": "lisbon"}, "step": 1}),
        (2, "m1", "tool_end", {"id": "c1", "name": "lookup", "isError": False, "content": "sunny", "step": 1}),
        (2, "m1", "text_delta", {"delta": "Sunny.", "step": 2}),
        (2, "m1", "turn_end", {"stopReason": "end_turn", "usage": {}}),
    )
    assert timeline_of("s1", lines) == {"sessionId": "s1", "turns": [{
        "messageId": "m1", "input": "weather?", "stopReason": "end_turn", "error": None, "steers": 0,
        "deliveries": [{"epoch": 1, "startCursor": 1, "endCursor": 3, "how": "died"},
                       {"epoch": 2, "startCursor": 4, "endCursor": 8, "how": "ended"}],
        "steps": [{"step": 1, "epoch": 1, "textChars": 7, "reasoningChars": 0, "withdrawn": False},
                  {"step": 2, "epoch": 2, "textChars": 6, "reasoningChars": 0, "withdrawn": False}],
        "tools": [{"id": "c1", "name": "lookup", "step": 1, "epochs": [1, 2], "outcome": "rerun", "isError": False}],
    }]}


def test_each_crash_shape_reads_as_its_own_ending() -> None:
    lines = _lines(
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
        # m4: cut off mid-request at the deadline (a yield line, no yield record): the step's
        # output is withdrawn, and the third cut-off in a row ends the turn.
        (4, "m4", "turn_start", {"input": "stall"}),
        (4, "m4", "text_delta", {"delta": "half", "step": 1}),
        (4, "m4", "turn_yield", {}),
        (5, "m4", "turn_resume", {"interrupted": True, "retract": [1]}),
        (5, "m4", "session_error", {"code": "FX_DEADLINE_CUTOFFS", "message": "cut off 3 times", "id": "m4"}),
        (5, "m4", "turn_end", {"stopReason": "cancelled", "usage": {}, "error": {"code": "FX_DEADLINE_CUTOFFS"}}),
        # m5: cancelled while its tool ran: no result was stored.
        (5, "m5", "turn_start", {"input": "x" * 500}),
        (5, "m5", "tool_start", {"id": "c5", "name": "slow", "step": 1}),
        (5, "m5", "user_message", {"text": "faster", "id": "st1"}),
        (5, "m5", "turn_end", {"stopReason": "cancelled", "usage": {}}),
        # m6: a poison turn ended by a later epoch without resuming it (no engine loaded).
        (5, "m6", "turn_start", {"input": "boom"}),
        (7, "m6", "session_error", {"code": "FX_POISON_TURN", "message": "died", "id": "m6"}),
        (7, "m6", "turn_end", {"stopReason": "cancelled", "usage": {}, "error": {"code": "FX_POISON_TURN"}}),
        (7, None, "idle", {"requestId": "r1"}),
    )
    turns = {t["messageId"]: t for t in timeline_of("s1", lines)["turns"]}
    assert list(turns) == ["m2", "m3", "m4", "m5", "m6"]
    how = {mid: [(d["epoch"], d["how"]) for d in t["deliveries"]] for mid, t in turns.items()}
    assert how == {"m2": [(2, "died"), (3, "ended")], "m3": [(3, "yielded"), (4, "ended")],
                   "m4": [(4, "cut off"), (5, "ended")], "m5": [(5, "ended")], "m6": [(5, "died"), (7, "ended")]}
    assert [(c["id"], c["outcome"], c["isError"], c["epochs"]) for c in turns["m2"]["tools"]] == [
        ("c2", "may have partly run", True, [2])]
    assert [(s["step"], s["epoch"], s["withdrawn"]) for s in turns["m4"]["steps"]] == [(1, 4, True)]
    assert turns["m4"]["stopReason"] == "cancelled" and turns["m4"]["error"] == {"code": "FX_DEADLINE_CUTOFFS"}
    assert [(c["id"], c["outcome"], c["isError"]) for c in turns["m5"]["tools"]] == [("c5", "unfinished", None)]
    assert turns["m5"]["steers"] == 1
    assert turns["m5"]["input"] is not None and len(turns["m5"]["input"]) == INPUT_PREVIEW_CHARS
    assert turns["m6"]["error"] == {"code": "FX_POISON_TURN"}


def test_the_last_part_of_an_open_turn_runs_while_its_epoch_holds_the_live_lease() -> None:
    lines = _lines(
        (3, "m1", "turn_start", {"input": "slow"}),
        (3, "m1", "tool_start", {"id": "c1", "name": "lookup", "step": 1}),
    )

    def read(state: dict[str, Any] | None) -> tuple[str, str, str | None]:
        (turn,) = timeline_of("s1", lines, state)["turns"]
        return turn["deliveries"][-1]["how"], turn["tools"][0]["outcome"], turn["stopReason"]

    assert read({"status": "running", "epoch": 3}) == ("running", "running", None)
    assert read(None) == ("running", "running", None)  # no state: nothing says otherwise
    assert read({"status": "waiting", "epoch": 3}) == ("died", "unfinished", None)  # its lease expired
    assert read({"status": "running", "epoch": 4}) == ("died", "unfinished", None)  # a later epoch took it
    assert read({"status": "waiting", "epoch": 2}) == ("running", "running", None)  # a state older than the lines


# ------------------------------------------------------------------------ the route, fx inspect


def test_the_route_tells_a_real_tool_turn(api: httpx.Client) -> None:
    created = api.post("/v1/sessions", json={"input": "tool:ana"})
    assert created.status_code == 202, created.text
    sid, mid = created.json()["sessionId"], created.json()["messageId"]
    lines = read_turn(api, sid)
    assert lines[-1]["stopReason"] == "end_turn"
    (start,) = [x for x in lines if x["type"] == "tool_start"]
    epoch = lines[0]["epoch"]

    found = api.get(f"/v1/sessions/{sid}/timeline")
    assert found.status_code == 200, found.text
    assert found.headers["content-type"] == "application/json"
    body = found.json()
    assert body["sessionId"] == sid
    (turn,) = body["turns"]
    assert (turn["messageId"], turn["input"], turn["stopReason"], turn["error"]) == (mid, "tool:ana", "end_turn", None)
    assert turn["deliveries"] == [{"epoch": epoch, "startCursor": lines[0]["cursor"], "endCursor": lines[-1]["cursor"],
                                   "how": "ended"}]
    assert turn["tools"] == [{"id": start["id"], "name": "lookup", "step": start["step"], "epochs": [epoch],
                              "outcome": "ran", "isError": False}]
    text = "".join(x["delta"] for x in lines if x["type"] == "text_delta")
    assert text == "looked up" and sum(s["textChars"] for s in turn["steps"]) == len(text)
    assert [s["step"] for s in turn["steps"]] == sorted({x["step"] for x in lines if "step" in x})

    unknown = api.get(f"/v1/sessions/{UNKNOWN_SESSION}/timeline")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "FX_UNKNOWN_SESSION"
    invalid = api.get("/v1/sessions/not-a-session/timeline")
    assert invalid.status_code == 400 and invalid.json()["error"]["code"] == "FX_INVALID_SESSION_ID"


def test_a_running_turn_shows_its_part_running(api: httpx.Client, model: ScriptedModel) -> None:
    created = api.post("/v1/sessions", json={"input": "hold:timeline-run"})
    sid = created.json()["sessionId"]
    try:
        model.wait_held("timeline-run", timeout_s=15)
        (turn,) = api.get(f"/v1/sessions/{sid}/timeline").json()["turns"]
        assert turn["stopReason"] is None and [d["how"] for d in turn["deliveries"]] == ["running"]
    finally:
        model.release("timeline-run")
    assert read_turn(api, sid)[-1]["stopReason"] == "end_turn"
    (turn,) = api.get(f"/v1/sessions/{sid}/timeline").json()["turns"]
    assert turn["stopReason"] == "end_turn" and [d["how"] for d in turn["deliveries"]] == ["ended"]


def test_the_timeline_takes_the_sessions_auth(web_auth: WebProcess) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=web_auth.url, timeout=15.0) as client:
        refused = client.get(f"/v1/sessions/{UNKNOWN_SESSION}/timeline")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "FX_UNAUTHORIZED"
        sid = client.post("/v1/sessions", json={"input": "hi"}, headers=bearer).json()["sessionId"]
        assert client.get(f"/v1/sessions/{sid}/timeline").status_code == 401
        wrong = client.get(f"/v1/sessions/{sid}/timeline", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert client.get(f"/v1/sessions/{sid}/timeline", headers=bearer).status_code == 200

    refused_cli = fx(web_auth.url, "inspect", sid)
    assert refused_cli.returncode == 3 and "FX_UNAUTHORIZED" in refused_cli.stderr, refused_cli.stderr
    allowed = fx(web_auth.url, "inspect", sid, FX_API_TOKEN=TOKEN)
    assert allowed.returncode == 0 and allowed.stdout.startswith(f"{sid}: 1 turn(s)\n"), allowed.stderr


def test_fx_inspect_prints_the_timeline(web_open: WebProcess, api: httpx.Client) -> None:
    created = api.post("/v1/sessions", json={"input": "tool:lisbon"}).json()
    sid = created["sessionId"]
    lines = read_turn(api, sid)
    (call,) = [x for x in lines if x["type"] == "tool_start"]
    epoch = lines[0]["epoch"]

    shown = fx(web_open.url, "inspect", sid)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        f"{sid}: 1 turn(s)",
        f'- {created["messageId"]} end_turn: "tool:lisbon" (2 step(s))',
        f"    epoch {epoch}: ended (cursors {lines[0]['cursor']}-{lines[-1]['cursor']})",
        f"    tool lookup {call['id']}: ran (epoch {epoch})",
    ]
    as_json = fx(web_open.url, "inspect", sid, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == api.get(f"/v1/sessions/{sid}/timeline").json()

    unknown = fx(web_open.url, "inspect", UNKNOWN_SESSION)
    assert unknown.returncode == 3 and unknown.stderr.startswith("fx: FX_UNKNOWN_SESSION: ") and unknown.stdout == ""
