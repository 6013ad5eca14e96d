"""The load of the rolling-upgrade test: conversations sent through one web process and read
through another, and what came of each turn.

A `Conversation` is one session; each round it sends one prompt (now and then two back to
back, the second through the other web, so one waits while the first runs) and follows its
stream until each prompt's `turn_end`. Prompts cycle through the fault responder's kinds
(`tests.chaos.faults.responder`): `echo:`, `effect:` (the non-idempotent tool, each start
recorded per execution id by `tests.chaos.tooling`) and `probe:`.

The `Ledger` keeps every prompt (`Turn`: phase, web it went through, acknowledgement or
refusal, the `turn_end` read: None if none came in time) and every stream problem (a
non-200 reply, an error line the web sent, a cursor gap, a lost connection). `sweep` reads each
session's whole stream, and from its middle, through every web still up, and compares.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.upgrade.processes import TreeWeb

KINDS = ("echo", "effect", "probe", "echo", "effect")
SEND_TIMEOUT_S = 15.0
TURN_TIMEOUT_S = 30.0


@dataclass
class Turn:
    """One prompt and what came of it."""

    message_id: str
    prompt: str
    phase: str
    sent_via: str
    read_via: str
    session_id: str | None = None
    acked: bool = False
    refused: tuple[int, str | None, str] | None = None  # status, FX_ code, body
    cursor: int = 0  # the stream cursor at acceptance
    end: dict[str, Any] | None = None  # its turn_end line, as read
    acked_at: float = 0.0  # time.monotonic() of the acknowledgement
    took_s: float | None = None  # from the acknowledgement to its turn_end read

    @property
    def error(self) -> tuple[str | None, str] | None:
        """(code, message) of a turn that ended `error`."""
        if self.end is None or self.end.get("stopReason") != "error":
            return None
        error = self.end.get("error") or {}
        return error.get("code"), str(error.get("message", ""))[:300]


@dataclass
class Ledger:
    turns: dict[str, Turn] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)  # "phase: what, where"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, turn: Turn) -> Turn:
        with self.lock:
            self.turns[turn.message_id] = turn
        return turn

    def broke(self, phase: str, what: str) -> None:
        with self.lock:
            self.broken.append(f"{phase}: {what}")

    def of(self, phase: str) -> list[Turn]:
        return [t for t in self.turns.values() if t.phase == phase]


def _code(response: httpx.Response) -> str | None:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


class Conversation:
    """One session, driven through the webs it is given each round."""

    def __init__(self, index: int, ledger: Ledger) -> None:
        self.index = index
        self.ledger = ledger
        self.session_id: str | None = None
        self.sent = 0

    def __repr__(self) -> str:
        return f"<Conversation {self.index} session={self.session_id} sent={self.sent}>"

    def next_prompt(self) -> str:
        kind = KINDS[(self.index + self.sent) % len(KINDS)]
        self.sent += 1
        return f"{kind}:c{self.index}t{self.sent}"

    def send(self, phase: str, web: TreeWeb, read_via: TreeWeb) -> Turn:
        """One prompt through `web`, resent on a lost connection or a 5xx until answered."""
        turn = self.ledger.add(Turn(f"msg_up{uuid.uuid4().hex}", self.next_prompt(), phase, web.label, read_via.label))
        path = "/v1/sessions" if self.session_id is None else f"/v1/sessions/{self.session_id}/prompts"
        deadline = time.monotonic() + SEND_TIMEOUT_S
        while True:
            try:
                response = httpx.post(web.url + path, json={"input": turn.prompt, "messageId": turn.message_id},
                                      timeout=10.0)
            except httpx.HTTPError as exc:
                response, failure = None, f"{type(exc).__name__}: {exc}"
            if response is not None and response.status_code in (200, 202):
                reply = response.json()
                self.session_id = self.session_id or reply["sessionId"]
                turn.session_id, turn.acked, turn.cursor = reply["sessionId"], True, int(reply.get("cursor") or 0)
                turn.acked_at = time.monotonic()
                return turn
            if response is not None:
                failure = f"{response.status_code} {response.text[:300]}"
                if response.status_code < 500 or time.monotonic() > deadline:
                    turn.refused = (response.status_code, _code(response), response.text[:300])
                    turn.session_id = self.session_id
                    return turn
            if time.monotonic() > deadline:
                turn.refused = (0, None, failure)
                return turn
            time.sleep(0.2)

    def round(self, phase: str, webs: list[TreeWeb], *, pair: bool = False,
              turn_timeout_s: float = TURN_TIMEOUT_S) -> None:
        """One prompt (two with `pair`) sent through `webs` in turn, read through the next one."""
        first = (self.index + self.sent) % len(webs)
        order = [webs[(first + k) % len(webs)] for k in range(len(webs))]
        reader = order[1 % len(order)]
        turns = [self.send(phase, order[k % len(order)], reader) for k in range(2 if pair else 1)]
        acked = [t for t in turns if t.acked]
        if acked:
            follow(self.ledger, phase, reader, acked, timeout_s=turn_timeout_s)


def follow(ledger: Ledger, phase: str, web: TreeWeb, turns: list[Turn], *, timeout_s: float) -> None:
    """Follows the turns' session through `web` from the first one's acceptance cursor until
    each turn's `turn_end` or `timeout_s`, reconnecting from the last cursor seen when a
    connection ends; records each `turn_end` and anything that breaks the stream."""
    session_id = turns[0].session_id
    waiting = {t.message_id: t for t in turns}
    cursor = min(t.cursor for t in turns)
    deadline = time.monotonic() + timeout_s
    where = f"session {session_id} via {web.label}"
    breaks = 0
    while waiting and time.monotonic() < deadline:
        try:
            with httpx.stream("GET", f"{web.url}/v1/sessions/{session_id}/stream",
                              params={"cursor": cursor, "follow": 1},
                              timeout=httpx.Timeout(10.0, read=max(0.5, deadline - time.monotonic()))) as r:
                if r.status_code != 200:
                    ledger.broke(phase, f"{where} from cursor {cursor}: HTTP {r.status_code} {r.read()[:300]!r}")
                    return
                for raw in r.iter_lines():
                    if not raw.strip():
                        continue
                    line = json.loads(raw)
                    if "cursor" not in line:
                        ledger.broke(phase, f"{where} after cursor {cursor}: the web sent {raw[:400]}")
                        return
                    if int(line["cursor"]) != cursor + 1:
                        ledger.broke(phase, f"{where}: cursor {line['cursor']} after {cursor}")
                        return
                    cursor = int(line["cursor"])
                    if line.get("type") == "session_error":
                        ledger.broke(phase, f"{where}: stored session_error {raw[:400]}")
                    if line.get("type") == "turn_end" and line.get("messageId") in waiting:
                        ended = waiting.pop(line["messageId"])
                        ended.end, ended.took_s = line, time.monotonic() - ended.acked_at
                        if not waiting:
                            return
        except httpx.ReadTimeout:
            break
        except httpx.HTTPError as exc:
            # Recorded once; the reader resumes from its cursor as `fx tail` does, so the
            # turn's end is still seen if the web can serve it at all.
            breaks += 1
            if breaks == 1:
                ledger.broke(phase, f"{where} after cursor {cursor}: {type(exc).__name__}: {exc}")
            time.sleep(0.2)
    # A turn with no `turn_end` by now keeps `end` None: the test decides what that means
    # (a stream that broke, or a prompt the previous release leaves waiting).


def run_round(phase: str, conversations: list[Conversation], webs: list[TreeWeb], *, pairs_every: int = 4,
              turn_timeout_s: float = TURN_TIMEOUT_S) -> None:
    """Every conversation's round at once; every `pairs_every`-th sends a pair."""
    salt = len(phase)
    with ThreadPoolExecutor(max_workers=len(conversations)) as pool:
        done = [pool.submit(c.round, phase, webs, pair=bool(pairs_every) and (c.index + salt) % pairs_every == 0,
                            turn_timeout_s=turn_timeout_s)
                for c in conversations]
        for future in done:
            future.result()


def read_all(web: TreeWeb, session_id: str, cursor: int = 0) -> tuple[list[dict[str, Any]], str | None]:
    """Every stored line after `cursor` through `web` (`follow=0`), and what broke, if anything."""
    lines: list[dict[str, Any]] = []
    try:
        with httpx.stream("GET", f"{web.url}/v1/sessions/{session_id}/stream",
                          params={"cursor": cursor, "follow": 0}, timeout=20.0) as r:
            if r.status_code != 200:
                return lines, f"HTTP {r.status_code} {r.read()[:300]!r}"
            for raw in r.iter_lines():
                if not raw.strip():
                    continue
                line = json.loads(raw)
                if "cursor" not in line:
                    return lines, f"the web sent {raw[:400]}"
                expected = (int(lines[-1]["cursor"]) if lines else cursor) + 1
                if int(line["cursor"]) != expected:
                    return lines, f"cursor {line['cursor']} where {expected} was due"
                lines.append(line)
    except httpx.HTTPError as exc:
        return lines, f"{type(exc).__name__}: {exc}"
    return lines, None


def sweep(ledger: Ledger, phase: str, conversations: list[Conversation], webs: list[TreeWeb]) -> dict[str, list[dict[str, Any]]]:
    """Reads each session whole, and from the middle, through every web; records a break or
    a disagreement. Returns the lines of each session as the first web read them."""
    found: dict[str, list[dict[str, Any]]] = {}
    for c in conversations:
        if c.session_id is None:
            continue
        whole: dict[str, list[dict[str, Any]]] = {}
        for web in webs:
            lines, broken = read_all(web, c.session_id)
            if broken:
                ledger.broke(phase, f"session {c.session_id} read whole via {web.label}: {broken}")
            whole[web.label] = lines
            middle = len(lines) // 2
            rest, broken = read_all(web, c.session_id, middle)
            if broken:
                ledger.broke(phase, f"session {c.session_id} read from cursor {middle} via {web.label}: {broken}")
            elif rest != lines[middle:]:
                ledger.broke(phase, f"session {c.session_id} via {web.label}: from cursor {middle}, "
                                    f"{len(rest)} lines that are not the whole read's {len(lines) - middle}")
        first, *others = webs
        for web in others:
            if whole[web.label] != whole[first.label]:
                ledger.broke(phase, f"session {c.session_id}: {first.label} read {len(whole[first.label])} lines, "
                                    f"{web.label} {len(whole[web.label])}, not the same")
        found[c.session_id] = whole[first.label]
    return found
