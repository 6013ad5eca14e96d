"""The deciders of a chaos run: the people who answer the calls parked turns wait on.

A `refund:<tag>` prompt (`tests.chaos.workload`) makes one or two calls of the tool
`refund` (`approval=True`): its turn parks, with an `approval_request` line per call, then
a `turn_pause` line naming the calls it waits on (stored with the pause itself: from then
on the store takes decisions for them; a `delegate` call's, of kind `external`, is its child
turn's to answer, and the approver leaves it alone). The `Approver` reads the `turn_pause` lines from
the sessions' readers (every stored line reaches one) and answers each call once over HTTP (`POST /v1/sessions/{id}/calls/{call_id}`) after a random
pause (`DELAY_S`, so the answers land at any moment of the nemesis's schedule: during a
kill, a SIGSTOP, a store restart), in one of the `MODES`, drawn from the seed:

- `single`: one approval or denial, through either web process;
- `race`: two decisions for the call at once (approve and approve, or approve and deny),
  one through each web process: one is accepted, the other refused `409
  FX_DECISION_REPEATED` (or `FX_DECISION_UNKNOWN_CALL` once the turn ended);
- `approve_then_deny`: an approval, then a moment later a denial under another message id
  (refused as above);
- `retry`: an approval, then the same message id again through the other web process
  (`202` with `repeated: true`).

Each decision is resent under its message id while the answer is a 5xx or no answer (as
the drivers resend inputs), and recorded once it has one (`decision`: session, call, the
turn it was asked by, mode, type, message id, web, status, code, repeated, attempts; status
None: never answered). The checker (`tests.chaos.checker.approvals`) reads them with the
stored streams and the tool's start records. The approver keeps answering through the
drain (a parked turn ends only once decided) until `stop()`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from tests.chaos.history import History
from tests.chaos.workload import ACK_TIMEOUT_S, SessionDriver, _code

MODES = {"single": 4, "race": 3, "approve_then_deny": 2, "retry": 1}
DELAY_S = (0.0, 3.0)
SECOND_AFTER_S = (0.0, 1.0)  # approve_then_deny: the denial's pause after the approval's answer
POLL_S = 0.2


class Approver:
    """Answers every parked call the sessions' readers saw (see the module doc)."""

    def __init__(self, urls: tuple[str, str], seed: int, history: History,
                 sessions: Callable[[], list[SessionDriver]]) -> None:
        self.urls = urls
        self.seed = seed
        self.history = history
        self.sessions = sessions
        self.rng = random.Random(f"approvals-{seed}")
        self._lock = threading.Lock()
        self._read: dict[str, int] = {}  # session id -> lines of its reader looked at
        self._seen: set[str] = set()
        self._n = 0
        self._done = threading.Event()
        self._threads: list[threading.Thread] = []
        self.thread = threading.Thread(target=self.run, name="chaos-approver", daemon=True)

    def start(self) -> Approver:
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stops looking for parked calls; waits for the decisions under way."""
        self._done.set()
        self.thread.join(timeout_s)
        for t in list(self._threads):
            t.join(timeout_s)

    def run(self) -> None:
        while not self._done.wait(POLL_S):
            for session in self.sessions():
                reader, session_id = session.reader, session.session_id
                if reader is None or session_id is None:
                    continue
                seen = reader.seen
                start, end = self._read.get(session_id, 0), len(seen)
                self._read[session_id] = end
                for line in seen[start:end]:
                    if line.get("type") != "turn_pause":
                        continue
                    for call in line.get("pendingCalls") or []:
                        if call.get("kind") != "approval":
                            continue  # a delegated call: its child's turn answers it, not a person
                        if call.get("id") not in self._seen:
                            self._seen.add(call["id"])
                            self._answer(session_id, {"id": call["id"], "messageId": line.get("messageId")})

    def _answer(self, session_id: str, line: dict[str, Any]) -> None:
        modes, weights = zip(*MODES.items())
        mode = self.rng.choices(modes, weights)[0]
        delay_s = self.rng.uniform(*DELAY_S)
        if mode == "single":
            plan = [(self.rng.choice(("approve", "approve", "deny")), self.rng.randrange(2))]
        elif mode == "race":
            first = self.rng.randrange(2)
            plan = [("approve", first), (self.rng.choice(("approve", "deny")), 1 - first)]
            self.rng.shuffle(plan)
        elif mode == "approve_then_deny":
            plan = [("approve", self.rng.randrange(2)), ("deny", self.rng.randrange(2))]
        else:
            first = self.rng.randrange(2)
            plan = [("approve", first), ("approve", 1 - first)]
        second_s = self.rng.uniform(*SECOND_AFTER_S)
        call = {"session": session_id, "call": line["id"], "turn": line.get("messageId"), "mode": mode}
        self.history.record("parked_call", **call, plan=plan, delay_s=round(delay_s, 3))
        t = threading.Thread(target=self._decide, args=(call, plan, delay_s, second_s),
                             name=f"chaos-decide-{line['id']}", daemon=True)
        with self._lock:
            self._threads.append(t)
        t.start()

    def _message_id(self, call_id: str) -> str:
        with self._lock:
            self._n += 1
            return f"d-{self.seed}-{self._n}-{call_id}"

    def _decide(self, call: dict[str, Any], plan: list[tuple[str, int]], delay_s: float, second_s: float) -> None:
        time.sleep(delay_s)
        mode = call["mode"]
        if mode == "race":
            barrier = threading.Barrier(len(plan))
            ids = [self._message_id(call["call"]) for _ in plan]
            racers = [threading.Thread(target=self._send, args=(call, how, web, mid, barrier), daemon=True)
                      for (how, web), mid in zip(plan, ids)]
            for r in racers:
                r.start()
            for r in racers:
                r.join(ACK_TIMEOUT_S + 15)
            return
        first = self._message_id(call["call"])
        self._send(call, *plan[0], first)
        if mode == "approve_then_deny":
            time.sleep(second_s)
            self._send(call, plan[1][0], plan[1][1], self._message_id(call["call"]))
        elif mode == "retry":
            self._send(call, plan[1][0], plan[1][1], first)

    def _send(self, call: dict[str, Any], how: str, web: int, message_id: str,
              barrier: threading.Barrier | None = None) -> None:
        """One decision, resent under its message id until it has an answer; recorded."""
        body: dict[str, Any] = {"type": how, "messageId": message_id}
        if how == "deny":
            body["reason"] = f"chaos says no ({message_id})"
        path = f"/v1/sessions/{call['session']}/calls/{quote(call['call'], safe='')}"
        rng = random.Random(message_id)
        if barrier is not None:
            try:
                barrier.wait(10.0)
            except threading.BrokenBarrierError:
                pass
        sent_t = round(self.history.now(), 4)
        deadline = time.monotonic() + ACK_TIMEOUT_S
        attempts = 0
        status: int | None = None
        reply: dict[str, Any] = {}
        code: str | None = None
        with httpx.Client(base_url=self.urls[web], timeout=10.0) as http:
            while time.monotonic() < deadline:
                attempts += 1
                try:
                    response = http.post(path, json=body)
                except httpx.HTTPError:
                    time.sleep(rng.uniform(0.2, 0.8))
                    continue
                if response.status_code < 500:
                    status, code = response.status_code, _code(response)
                    if status == 202:
                        reply = response.json()
                    break
                self.history.record("retried", session=call["session"], input="decision", messageId=message_id,
                                    status=response.status_code, code=_code(response))
                time.sleep(rng.uniform(0.2, 0.8))
        self.history.record("decision", **call, type=how, messageId=message_id, web="ab"[web], status=status,
                            code=code, repeated=bool(reply.get("repeated")), turnId=reply.get("turnId"),
                            attempts=attempts, sent_t=sent_t)
