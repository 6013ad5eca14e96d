"""The session timeline: built from stored lines alone (`fxworker.timeline`), served a page
of turns at a time at `GET /v1/sessions/{id}/timeline?cursor=N&limit=K` under the session's
auth, printed by `fx inspect`; a request holds one page, not the session."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from fxengine.loop import AMBIGUOUS_RESULT
from fxengine.testing import ScriptedModel
from fxworker.ids import new_session_id
from fxworker.keys import session_keys
from fxworker.store import redis_store
from fxworker.timeline import (
    DEFAULT_PAGE_TURNS,
    INPUT_PREVIEW_CHARS,
    MAX_PAGE_TURNS,
    TimelineBuilder,
    read,
    timeline_of,
)
from tests.support.workers import wait_until
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
        "waits": [], "delegations": [],
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
    invalid = api.get("/v1/sessions/fxs_not-a-session/timeline")
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


# ------------------------------------------------------------------------------------- paging

LINES_PER_TURN = 8


def _synthetic_turn(n: int, cursor: int, *, epoch: int = 1) -> list[dict[str, Any]]:
    """One ended turn of `LINES_PER_TURN` lines from `cursor + 1`: a prompt, text, a tool call."""
    mid = f"msg_synth{n:06d}"
    lines: list[dict[str, Any]] = [
        {"type": "turn_start", "input": f"prompt {n}: " + "p" * 150},
        {"type": "text_delta", "delta": "Let me look ", "step": 1},
        {"type": "text_delta", "delta": "that up.", "step": 1},
        {"type": "tool_start", "id": f"call_{n}", "name": "lookup", "input": {"q": n}, "step": 1},
        {"type": "tool_end", "id": f"call_{n}", "name": "lookup", "isError": False, "content": "found", "step": 1},
        {"type": "text_delta", "delta": "Here it is: " + "a" * 60, "step": 2},
        {"type": "text_delta", "delta": "done.", "step": 2},
        {"type": "turn_end", "stopReason": "end_turn", "usage": {"inputTokens": 10, "outputTokens": 20}},
    ]
    return [{**line, "messageId": mid, "epoch": epoch, "cursor": cursor + i + 1} for i, line in enumerate(lines)]


def _store_turns(redis_url: str, prefix: str, session_id: str, turns: int, *, first_cursor: int = 0,
                 first: int = 0) -> int:
    """Writes `turns` synthetic turns to the session's UI stream after `first_cursor`, as the
    store keeps lines (`<cursor>-0`, field `l`), pipelined: thousands of turns in a second.
    Returns the last cursor."""
    r = redis.Redis.from_url(redis_url)
    ui = session_keys(prefix, session_id).ui
    cursor = first_cursor
    try:
        for start in range(0, turns, 500):
            pipe = r.pipeline(transaction=False)
            for n in range(first + start, first + min(start + 500, turns)):
                for line in _synthetic_turn(n, cursor):
                    pipe.xadd(ui, {"l": json.dumps(line, separators=(",", ":"))}, id=f"{line['cursor']}-0")
                cursor += LINES_PER_TURN
            pipe.execute()
    finally:
        r.close()
    return cursor


def _read_page(redis_url: str, prefix: str, session_id: str, **kwargs: Any) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        store = redis_store(redis_url, prefix=prefix)
        try:
            page: dict[str, Any] = dict(await read(store, session_id, state={"status": "idle", "epoch": 1}, **kwargs))
            return page
        finally:
            await store.aclose()

    return asyncio.run(run())


@pytest.mark.redis
def test_a_page_holds_at_most_its_limit_of_whole_turns_and_the_next_cursor_continues(redis_url: str,
                                                                                     key_prefix: str) -> None:
    sid = new_session_id()
    last = _store_turns(redis_url, key_prefix, sid, 7)
    whole = [t for n in range(7) for t in timeline_of(sid, _synthetic_turn(n, n * LINES_PER_TURN))["turns"]]

    pages, after = [], 0
    while True:
        page = _read_page(redis_url, key_prefix, sid, cursor=after, limit=3)
        pages.append(page)
        if page["next"] is None:
            break
        assert page["next"] > after
        after = page["next"]
    assert [len(p["turns"]) for p in pages] == [3, 3, 1]
    # Each page ends just before the first line of the turn after it (cursors of whole turns).
    assert [p["next"] for p in pages] == [3 * LINES_PER_TURN, 6 * LINES_PER_TURN, None]
    assert [t for p in pages for t in p["turns"]] == whole  # the pages together are the whole timeline

    exactly = _read_page(redis_url, key_prefix, sid, limit=7)
    assert len(exactly["turns"]) == 7 and exactly["next"] is None
    assert _read_page(redis_url, key_prefix, sid, cursor=last) == {"sessionId": sid, "turns": [], "next": None}
    # A cursor inside a turn gives that turn from there on.
    (partial, *_) = _read_page(redis_url, key_prefix, sid, cursor=LINES_PER_TURN + 3, limit=1)["turns"]
    assert partial["messageId"] == "msg_synth000001" and partial["input"] is None
    assert partial["deliveries"][0]["startCursor"] == LINES_PER_TURN + 4
    with pytest.raises(ValueError):
        _read_page(redis_url, key_prefix, sid, limit=0)


@pytest.fixture
def many_turns(api: httpx.Client, redis_url: str, prefix: str) -> Iterator[tuple[str, list[dict[str, Any]], int]]:
    """A real session (one tool turn a worker ran) followed by 150 synthetic turns."""
    created = api.post("/v1/sessions", json={"input": "tool:paged"})
    assert created.status_code == 202, created.text
    sid = created.json()["sessionId"]
    lines = read_turn(api, sid)
    wait_until(lambda: api.get(f"/v1/sessions/{sid}").json()["status"] == "idle", 15.0, what="the session at rest")
    last = _store_turns(redis_url, prefix, sid, 150, first_cursor=api.get(f"/v1/sessions/{sid}").json()["cursor"])
    yield sid, lines, last


def test_the_route_pages_turns_by_cursor(api: httpx.Client, many_turns: tuple[str, list[dict[str, Any]], int],
                                         web_open: WebProcess) -> None:
    sid, lines, last = many_turns
    route = f"/v1/sessions/{sid}/timeline"

    first = api.get(route).json()  # the default page
    assert "turns" in first, first
    assert len(first["turns"]) == DEFAULT_PAGE_TURNS and first["next"] is not None
    assert first["turns"][0]["messageId"] == lines[0]["messageId"]
    assert first["turns"][0]["tools"][0]["outcome"] == "ran"
    assert first["turns"][1]["messageId"] == "msg_synth000000"

    seen: list[dict[str, Any]] = []
    after, sizes = 0, []
    while after is not None:
        page = api.get(route, params={"cursor": after, "limit": MAX_PAGE_TURNS})
        assert page.status_code == 200, page.text
        body = page.json()
        assert set(body) == {"sessionId", "turns", "next"}
        sizes.append(len(body["turns"]))
        seen += body["turns"]
        assert body["next"] is None or body["next"] > after
        after = body["next"]
    assert sizes == [MAX_PAGE_TURNS, 151 - MAX_PAGE_TURNS]
    assert len({t["messageId"] for t in seen}) == len(seen) == 151
    assert seen[:DEFAULT_PAGE_TURNS] == first["turns"]
    # The next page starts with the turn after the last one of this page.
    small = api.get(route, params={"limit": 2}).json()
    following = api.get(route, params={"cursor": small["next"], "limit": 1}).json()
    assert [t["messageId"] for t in small["turns"] + following["turns"]] == [t["messageId"] for t in seen[:3]]
    assert api.get(route, params={"cursor": last}).json() == {"sessionId": sid, "turns": [], "next": None}

    # fx inspect reads every page.
    shown = fx(web_open.url, "inspect", sid)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"{sid}: 151 turn(s)\n")
    assert shown.stdout.count("\n- ") == 151 and "msg_synth000149 end_turn" in shown.stdout
    as_json = fx(web_open.url, "inspect", sid, "--json")
    assert json.loads(as_json.stdout) == {"sessionId": sid, "turns": seen, "next": None}


def test_the_route_bounds_its_page_and_refuses_a_bad_cursor(api: httpx.Client,
                                                            many_turns: tuple[str, list[dict[str, Any]], int]) -> None:
    sid, _, _ = many_turns
    route = f"/v1/sessions/{sid}/timeline"
    assert len(api.get(route, params={"limit": 1}).json()["turns"]) == 1
    assert len(api.get(route, params={"limit": MAX_PAGE_TURNS}).json()["turns"]) == MAX_PAGE_TURNS
    for limit in ("0", str(MAX_PAGE_TURNS + 1), "1000000", "-1", "x", "1.5", "٣"):
        refused = api.get(route, params={"limit": limit})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "FX_INVALID_REQUEST", (limit, refused.text)
    for cursor in ("-1", "abc", "1e3", str(2**64), "9" * 5000, "٣"):
        refused = api.get(route, params={"cursor": cursor})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "FX_INVALID_CURSOR", (cursor, refused.text)
    # Refused before the session is looked up: a bad cursor on an unknown session is still 400.
    unknown = api.get(f"/v1/sessions/{UNKNOWN_SESSION}/timeline", params={"cursor": "x"})
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "FX_INVALID_CURSOR"


# ------------------------------------------------------------------------------- memory bound

MEMORY_TURNS = 4000


def _peak_bytes(run: Any) -> tuple[int, Any]:
    """tracemalloc's peak while `run()` runs, over what was allocated before it."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        result = run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base, result


def _response_bytes(redis_url: str, prefix: str, session_id: str, *, whole: bool) -> int:
    """What one timeline request builds: the page (or, `whole`, every turn read a page of
    lines at a time, as the unpaged route did) rendered as the route's JSON body."""
    async def run() -> int:
        store = redis_store(redis_url, prefix=prefix)
        try:
            state = {"status": "idle", "epoch": 1}
            if whole:
                builder = TimelineBuilder(session_id)
                cursor = 0
                while lines := await store.read_lines(session_id, cursor):
                    for line in lines:
                        builder.add(line)
                    cursor = int(lines[-1]["cursor"])
                body: Any = builder.result(state)
            else:
                body = await read(store, session_id, state=state)
            return len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
        finally:
            await store.aclose()

    return asyncio.run(run())


@pytest.mark.redis
def test_one_request_holds_a_page_whatever_the_sessions_length(redis_url: str, key_prefix: str) -> None:
    short, long = new_session_id(), new_session_id()
    _store_turns(redis_url, key_prefix, short, MEMORY_TURNS // 10)
    _store_turns(redis_url, key_prefix, long, MEMORY_TURNS)
    _response_bytes(redis_url, key_prefix, short, whole=False)  # warm: imports, scripts, first connection

    paged_short, _ = _peak_bytes(lambda: _response_bytes(redis_url, key_prefix, short, whole=False))
    paged, paged_body = _peak_bytes(lambda: _response_bytes(redis_url, key_prefix, long, whole=False))
    paged_again = max(_peak_bytes(lambda: _response_bytes(redis_url, key_prefix, long, whole=False))[0]
                      for _ in range(5))
    whole, whole_body = _peak_bytes(lambda: _response_bytes(redis_url, key_prefix, long, whole=True))
    print(f"\ntimeline of {MEMORY_TURNS} turns: one paged request peaks at {paged / 1024:.0f} KiB "
          f"({paged_body} B body), {paged_short / 1024:.0f} KiB on {MEMORY_TURNS // 10} turns; "
          f"unpaged {whole / 1024:.0f} KiB ({whole_body} B body): x{whole / paged:.1f}")
    assert whole_body > 100 * paged_body
    assert paged * 10 < whole, (paged, whole)
    # Ten times the turns, the same page: the peak does not grow with the session.
    assert paged < 1.5 * paged_short + 64 * 1024, (paged, paged_short)
    assert paged_again < 1.5 * paged + 64 * 1024, (paged_again, paged)
