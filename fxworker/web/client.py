"""A small blocking client of the HTTP API, and how the `fx` command prints stream lines.

    client = ApiClient("http://127.0.0.1:8000", token=None)
    transcript = Transcript()
    for line in client.prompt("hello"):        # accepts, then streams the turn's lines
        print(transcript.feed(line), end="")

`prompt()` and `tail()` keep going after a dropped connection: they reconnect to the
session stream with the last cursor they saw (backing off, about 12 s in all before
they give up with `FX_CONNECT`), so no line is shown twice or lost. `prompt()` names its
prompt with a fresh message id when the caller gives none, so it can tell its turn's lines
from those of other turns.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Literal, TypedDict
from urllib.parse import quote

import httpx

from fxengine.codes import Code
from fxengine.errors import FxError
from fxengine.lines import DELTA_TYPES, TURN_STOPS, LineType, line_type

from ..agent import SessionInfo
from ..ids import new_message_id
from ..timeline import TimelinePage
from .ndjson import MEDIA_TYPE

RECONNECTS = 7
RECONNECT_FIRST_S = 0.25
RECONNECT_MAX_S = 4.0
_ENDS: tuple[LineType, ...] = (*TURN_STOPS, "idle")
# A line as the API sends it: a JSON object, of a type `fxengine.lines` declares or a newer one.
ApiLine = dict[str, object]


class SteerAnswer(TypedDict):
    sessionId: str
    messageId: str
    repeated: bool


class DecisionAnswer(TypedDict):
    sessionId: str
    callId: str
    messageId: str
    repeated: bool
    turnId: str | None
    cursor: int


class CancelAnswer(TypedDict):
    sessionId: str
    cancelRequested: bool


class ApiError(FxError):
    """An error answer of the API (its `FX_` code and status), or no answer at all (`FX_CONNECT`)."""

    code = Code.API_ERROR

    def __init__(self, message: str, *, code: str, status: int | None = None) -> None:
        super().__init__(message, code=code)
        self.status = status


class ApiClient:
    """Blocking calls to one fxworker web app."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout_s, read=None))
        self.session_id: str | None = None

    def __repr__(self) -> str:
        return f"<ApiClient {self.base_url} session={self.session_id}>"

    def close(self) -> None:
        self.http.close()

    def _check(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        response.read()
        try:
            error = response.json()["error"]
            code, message = error["code"], error["message"]
        except (ValueError, KeyError, TypeError):
            code, message = Code.HTTP, response.text[:200]
        raise ApiError(message, code=code, status=response.status_code)

    def _request(self, method: str, path: str, *, json: object = None,
                 params: Mapping[str, int] | None = None) -> httpx.Response:
        try:
            response = self.http.request(method, path, json=json, params=params)
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach {self.base_url}: {exc}", code=Code.CONNECT) from exc
        self._check(response)
        return response

    def steer(self, session_id: str, text: str, *, message_id: str | None = None) -> SteerAnswer:
        """Steer the session's running turn (or its next one): the store's acknowledgement."""
        body = {"input": text, "messageId": message_id or new_message_id()}
        result: SteerAnswer = self._request("POST", f"/v1/sessions/{session_id}/steer", json=body).json()
        return result

    def decide(self, session_id: str, call_id: str, decision: Literal["approve", "deny", "result"], *,
               reason: str = "", result: object = None, is_error: bool = False,
               message_id: str | None = None) -> DecisionAnswer:
        """Decide call `call_id` that the session's parked turn waits on: approve it, deny
        it (`reason`), or give an external tool's `result`."""
        body: dict[str, object] = {"type": decision, "messageId": message_id or new_message_id()}
        if decision == "deny":
            body["reason"] = reason
        elif decision == "result":
            body["result"], body["isError"] = result, is_error
        answer: DecisionAnswer = self._request("POST", f"/v1/sessions/{session_id}/calls/{quote(call_id, safe='')}",
                                               json=body).json()
        return answer

    def cancel(self, session_id: str) -> CancelAnswer:
        """Cancel the session's running (or waiting) turn."""
        result: CancelAnswer = self._request("POST", f"/v1/sessions/{session_id}/cancel", json={}).json()
        return result

    def state(self, session_id: str) -> SessionInfo:
        result: SessionInfo = self._request("GET", f"/v1/sessions/{session_id}").json()
        return result

    def timeline(self, session_id: str, *, cursor: int = 0, limit: int | None = None,
                 children: bool = False) -> TimelinePage:
        """A page of what the session went through: the turns after `cursor`, the workers that
        ran them, their tools, and `next` (the cursor of the page after it, or None);
        `children`: each delegated call's child turn nested in it."""
        params = {"cursor": cursor, **({"limit": limit} if limit is not None else {}),
                  **({"children": 1} if children else {})}
        result: TimelinePage = self._request("GET", f"/v1/sessions/{session_id}/timeline", params=params).json()
        return result

    def timeline_pages(self, session_id: str, *, limit: int | None = None) -> Iterator[TimelinePage]:
        """Every page of the session's timeline, from its first turn to what is stored now."""
        cursor: int | None = 0
        while cursor is not None:
            page = self.timeline(session_id, cursor=cursor, limit=limit)
            yield page
            following = page.get("next")
            cursor = following if isinstance(following, int) and following > cursor else None

    def sessions(self, *, limit: int = 20) -> list[SessionInfo]:
        found: list[SessionInfo] = self._request("GET", "/v1/sessions", params={"limit": limit}).json()["sessions"]
        return found

    def stream(self, session_id: str, *, cursor: int = 0, follow: bool = True) -> Iterator[ApiLine]:
        """The session's lines after `cursor`, as dicts.

        Raises `ApiError` with the server's code when the server ends the stream with an
        error of its own (a `session_error` line with no cursor: a turn's has one), e.g.
        `FX_SESSION_INCOMPLETE` for stored lines that are damaged or missing."""
        params = {"cursor": cursor, "follow": 1 if follow else 0}
        try:
            with self.http.stream("GET", f"/v1/sessions/{session_id}/stream", params=params) as response:
                self._check(response)
                for raw in response.iter_lines():
                    if not raw.strip():
                        continue
                    line: ApiLine = json.loads(raw)
                    if line_type(line) == "session_error" and "cursor" not in line:
                        raise ApiError(
                            f"the stream of {session_id} stopped after cursor {cursor}: {line.get('message')}",
                            code=str(line.get("code") or Code.API_ERROR),
                        )
                    cursor = max(cursor, _cursor(line))
                    yield line
        except httpx.HTTPError as exc:
            raise ApiError(f"stream of {session_id} broke: {exc}", code=Code.CONNECT) from exc

    def tail(self, session_id: str, *, cursor: int = 0, follow: bool = True) -> Iterator[ApiLine]:
        """The session's lines after `cursor`; following, until its turns are over.

        Without `follow` it yields what is stored and stops. With it, it stays open for new
        lines and stops after the `turn_end` (or `idle`) line that leaves the session with
        no turn running or waiting: the end of the turn it is following. A session with
        nothing to run is followed until its next turn ends. A dropped connection is
        resumed from the last cursor seen.
        """
        if not follow:
            yield from self.stream(session_id, cursor=cursor, follow=False)
            return
        stored = int(self.state(session_id).get("cursor") or 0)

        def done(line: ApiLine) -> bool:
            nonlocal stored
            # Lines stored before the call are history: only a later end is checked.
            if line_type(line) not in _ENDS or _cursor(line) < stored:
                return False
            state = self._state_retrying(session_id)
            stored = int(state.get("cursor") or 0)
            return state.get("status") == "idle"

        yield from self._follow(session_id, cursor, keep=lambda line: True, done=done)

    def follow_turn(self, session_id: str, turn_id: str | None, *, cursor: int = 0) -> Iterator[ApiLine]:
        """Turn `turn_id`'s lines after `cursor`, until it ends or pauses again."""
        return self._follow(session_id, cursor, keep=lambda line: line.get("messageId") == turn_id,
                            done=lambda line: line_type(line) in TURN_STOPS)

    def _follow(
        self, session_id: str, cursor: int, *, keep: Callable[[ApiLine], bool], done: Callable[[ApiLine], bool]
    ) -> Iterator[ApiLine]:
        """Follows the session from `cursor` until `done(line)`, reconnecting after a drop.

        Yields the lines `keep` accepts. Gives up with `FX_CONNECT` after `RECONNECTS`
        connections in a row that brought no line, waiting 0.25 s, 0.5 s, ... (at most 4 s)
        between them.
        """
        failures = 0
        why = "the stream closed"
        while True:
            try:
                for line in self.stream(session_id, cursor=cursor):
                    failures = 0
                    cursor = max(cursor, _cursor(line))
                    if not keep(line):
                        continue
                    yield line
                    if done(line):
                        return
            except ApiError as exc:
                if exc.code != Code.CONNECT:
                    raise
                why = exc.message
            failures += 1
            if failures >= RECONNECTS:
                raise ApiError(f"lost the stream of {session_id} {failures} times in a row: {why}", code=Code.CONNECT)
            _backoff(failures)

    def _state_retrying(self, session_id: str) -> SessionInfo:
        """`state()`, retried like a dropped stream while the API cannot be reached."""
        for attempt in range(1, RECONNECTS + 1):
            try:
                return self.state(session_id)
            except ApiError as exc:
                if exc.code != Code.CONNECT or attempt == RECONNECTS:
                    raise
                _backoff(attempt)
        raise AssertionError("unreachable")

    def prompt(
        self, text: str, *, session_id: str | None = None, agent: str | None = None, message_id: str | None = None,
        on_accepted: Callable[[str], None] | None = None,
    ) -> Iterator[ApiLine]:
        """Send a prompt (a new session when `session_id` is None) and yield its turn's lines.
        `on_accepted(session_id)` is called once the server stored it, before any line."""
        turn_id = message_id or new_message_id()
        body = {"input": text, "messageId": turn_id}
        if session_id is None:
            path = "/v1/sessions"
            if agent:
                body["agent"] = agent
        else:
            path = f"/v1/sessions/{session_id}/prompts"
        cursor = 0
        try:
            with self.http.stream("POST", path, json=body, headers={"Accept": MEDIA_TYPE}) as response:
                self._check(response)
                self.session_id = response.headers.get("x-fx-session-id") or session_id
                if on_accepted is not None and self.session_id:
                    on_accepted(self.session_id)
                for raw in response.iter_lines():
                    if not raw.strip():
                        continue
                    line: ApiLine = json.loads(raw)
                    cursor = max(cursor, _cursor(line))
                    yield line
                    if line_type(line) in TURN_STOPS:
                        return
        except httpx.HTTPError as exc:
            if self.session_id is None:
                raise ApiError(f"cannot reach {self.base_url}: {exc}", code=Code.CONNECT) from exc
        if self.session_id is None:  # a server that does not name the session: nothing to follow
            raise ApiError("the prompt's stream ended before its turn did", code=Code.CONNECT)
        # The connection dropped before the turn ended: follow the session from the last cursor.
        yield from self._follow(
            self.session_id, cursor,
            keep=lambda line: line.get("messageId") == turn_id,
            done=lambda line: line_type(line) in TURN_STOPS,
        )


def _backoff(failures: int) -> None:
    time.sleep(min(RECONNECT_FIRST_S * 2 ** (failures - 1), RECONNECT_MAX_S))


def _cursor(line: Mapping[str, object]) -> int:
    cursor = line.get("cursor")
    return cursor if isinstance(cursor, int) else 0


def _short(value: object, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Transcript:
    """What `fx prompt` and `fx tail` print for each stream line, honouring `retract` (§4).

    A `turn_resume` line may retract model steps: a request cut off before its response
    was recorded, whose partial output is not part of the conversation and is streamed
    again by the rerun. A terminal cannot take back what it printed, so when a retracted
    step had printed something, `feed()` answers a marker line naming the steps, then the
    turn so far again without them; the rerun streams after it. Everything below the last
    marker is the turn as it stands. A retracted step that printed nothing (a `fx tail`
    that started after it) needs no marker.
    """

    def __init__(self) -> None:
        self._turn: str | None = None
        self._shown: list[tuple[int | None, str]] = []  # (step, text) printed for the current turn
        self._delegated: set[str] = set()  # calls other agents' turns answer (`delegate_start`)

    def __repr__(self) -> str:
        return f"<Transcript turn={self._turn} pieces={len(self._shown)}>"

    def feed(self, line: Mapping[str, object]) -> str:
        """The text to print for `line` ('' for nothing)."""
        message_id = line.get("messageId")
        message_id = message_id if isinstance(message_id, str) else None
        kind = line_type(line)
        if kind == "turn_start" or (message_id is not None and message_id != self._turn):
            self._turn, self._shown = message_id, []
        if kind == "delegate_start" or (kind == "approval_request" and line.get("delegate")):
            self._delegated.add(str(line.get("callId") if kind == "delegate_start" else line.get("id")))
        text = render_line(line)
        if kind == "turn_pause" and self.delegated_only(line):
            text = "\n[waiting for the delegated agents' turns]\n"
        if kind == "turn_resume":
            text += self._retract(line, lead=not text)
        step = line.get("step")
        if text:
            self._shown.append((step if isinstance(step, int) else None, text))
        return text

    def delegated_only(self, line: Mapping[str, object]) -> bool:
        """Whether a `turn_pause` waits on delegated calls only (no person's decision)."""
        calls = line.get("pendingCalls")
        ids = [c.get("id") for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
        return bool(ids) and all(i in self._delegated for i in ids)

    def _retract(self, line: Mapping[str, object], *, lead: bool) -> str:
        retract = line.get("retract")
        steps = {s for s in retract if isinstance(s, int) and not isinstance(s, bool)} if isinstance(retract, list) else set()
        withdrawn = sorted({step for step, text in self._shown if step in steps and text})
        if not withdrawn:
            return ""
        self._shown = [(step, text) for step, text in self._shown if step not in steps]
        named = ", ".join(str(s) for s in withdrawn)
        noun = "step" if len(withdrawn) == 1 else "steps"
        marker = f"[cut off: the output of {noun} {named} above is withdrawn and reruns; the turn so far:]\n"
        return ("\n" if lead else "") + marker + "".join(text for _, text in self._shown)


def render_line(line: Mapping[str, object]) -> str:
    """How one stream line reads in a terminal ('' for lines with nothing to show)."""
    kind = line_type(line)
    if kind in DELTA_TYPES:
        return str(line.get("delta", ""))
    if kind == "turn_start":
        return f"> {_short(line['input'])}\n" if "input" in line else ""
    if kind == "user_message":
        return f"\n> {_short(line.get('text', ''))}\n"
    if kind == "tool_start":
        shown = f"{line.get('inputPreview', '')}…" if line.get("inputTruncated") else line.get("input")
        return f"\n→ {line.get('name')}({_short(shown)})\n"
    if kind == "tool_end":
        mark = "✗" if line.get("isError") else "←"
        return f"{mark} {_short(line.get('content', ''))}\n"
    if kind == "turn_resume":
        return "\n[resumed after an interruption]\n" if line.get("interrupted") else ""
    if kind == "turn_end":
        error = line.get("error")
        detail = f": {error.get('code')} {error.get('message')}" if isinstance(error, dict) else ""
        repeated = " (repeated)" if line.get("repeated") else ""
        answer = ""
        if "output" in line:  # a typed turn's answer
            answer = "\n= " + json.dumps(line["output"], ensure_ascii=False)
        return f"{answer}\n[{line.get('stopReason')}{repeated}{detail}]\n"
    if kind == "approval_request" and line.get("delegate"):
        return ""  # its delegate_start says where it went
    if kind == "approval_request":
        shown = f"{line.get('inputPreview', '')}…" if line.get("inputTruncated") else line.get("input")
        what = "its result from the client" if line.get("kind") == "external" else "approval"
        return f"\n? {line.get('name')}({_short(shown)}) waits for {what}: call {line.get('id')}\n"
    if kind == "turn_pause":
        calls = line.get("pendingCalls")
        ids = [str(c.get("id")) for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
        return f"\n[paused: waiting for a decision on {', '.join(ids)}; fx approve / fx deny SESSION CALL]\n"
    if kind == "delegate_start":
        return f"⇒ {line.get('agent')} in session {line.get('sessionId')} (fx tail {line.get('sessionId')})\n"
    if kind == "delegate_end":
        error = line.get("error")
        detail = f": {error.get('code')}" if isinstance(error, dict) else ""
        return f"⇐ {line.get('agent')} ended {line.get('stopReason')}{detail}\n"
    if kind == "session_error":
        return f"\n[{line.get('code')}: {line.get('message')}]\n"
    if kind == "session_waiting":
        no_worker = line.get("noWorker")
        agent = no_worker.get("agent") if isinstance(no_worker, dict) else None
        return f"[waiting: no worker runs agent {agent!r}; start one with that agent]\n"
    return ""
