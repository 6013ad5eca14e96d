"""The session as its users drive it, checked against a model (§6, §7, §11.1, §11.2).

A Hypothesis state machine over the real store (fakeredis running the same Lua) and the
real delivery handler (embedded worker loops, the embedded sweeper). Rules: prompt (text,
a model request a deadline cuts off, a tool that is not idempotent, an idempotent tool
that takes a while, and prompts whose turn parks: `refund:<n>` and `refund:a,b`, calls
of a tool that waits for approval, `pick:<p>`, a call of an external tool), prompt again
with a used message id, steer, `session.cancel()`, `turn.cancel()`, decisions (approve or
deny a refund call, submit a pick's result, approve a pick: FX_DECISION_INVALID) for a
call the model knows waits (its `approval_request` line), a second decision for a call
decided already (its message id again: `repeated`; another: FX_DECISION_REPEATED, or
FX_DECISION_UNKNOWN_CALL once its turn ended), a decision for a call no turn made
(FX_DECISION_UNKNOWN_CALL), a cancel of a parked turn, a worker starting, stopping or being
killed, a wake handled by a worker process whose registry lacks the session's agent, and
time passing past leases and deadlines (real time: the settings below are short).

Invariants, after every step:
- no tool that is not idempotent runs twice for one execution id (§11.2);
- no input ends twice (at most one `turn_end` per message id), and every `turn_end` names
  an input the store accepted;
- the stored lines and the epoch are bounded by the inputs and faults so far (see
  `lines_bound` and `epoch_bound`): no loop that writes or claims without progress;
- a sweep never queues a wake for a session whose wake is still queued or running, and
  no session has more than `SYSTEM_WAKES_IN_FLIGHT` wakes the system sent itself queued or
  running at once (`wake_check`);
- a refund runs at most once per execution id, only once its approval was accepted, never
  after a denial, never for a call of a turn cancelled while parked on it; an external
  tool's body never runs; a first decision for a call the store said waits is accepted
  (FX_DECISION_UNKNOWN_CALL only once its turn ended), and a second one never is;
- a parked session holds no lease once it was let go (unless a fault left a dead holder's),
  and while nothing is sent to it (no prompt, steer, cancel, decision, foreign wake) its
  epoch, its lines and the wakes the system sent for it stay as they were: nothing claims,
  writes to or sweeps a parked session (`parked_sessions_stay_put`).
At quiescence (teardown): a capable worker is started; every session is idle or parked
within `QUIET_S`, every call a parked turn waits on is decided (approve or deny, a pick's
result), and so on until every session is idle; every prompt ended exactly once (§11.1),
a turn cancelled while parked ended `cancelled`, and with no fault and no cancel each
approved refund ran exactly once.

Minimal sequences it found (each one a failure of the invariant named):
- idle within a bound: `prompt(i=1, prompt="send:bob")`, then `kill_worker(index=0,
  replace=False)` before the delivery claims; at quiescence a new worker runs, but the
  session stays `waiting` at epoch 0: the killed loop's delivery is counted as running
  for ever (`liveness.PROCESS_COUNTER`), so the process never looks idle and the lost
  wake is trusted until the broker's bound (3 x FX_DELIVERY_TIMEOUT_S + 60 s).
- idle within a bound: `prompt_that_parks(i=0, prompt="refund:1,2")`, the turn parks;
  `cancel_parked`, and the wake of that cancel is lost (its worker killed or stopped before
  it claims); at quiescence the session stays `waiting` (cancel requested, both calls still
  paused, epoch 1): the release that parked it took it out of the ready set and the cancel
  did not put it back (cancel.lua), so no sweep found it. Now a cancel marks its session
  ready first, as an input does; kept, with the wake dropped by hand, as
  `test_a_cancel_of_a_parked_turn_whose_wake_is_lost_is_swept`.

The default run is seeded and short; `FX_MODEL_EXAMPLES=2000` runs the long version (with
shrinking; `FX_MODEL_SHRINK=1` shrinks a default run's failure too; `FX_MODEL_STEPS` sets
the steps per example, 30 in the long version).
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import fxworker.delivery
import fxworker.runner
from fxengine.testing import ScriptedModel
from fxworker import Agent, Settings, embedded, registry
from fxengine.errors import FxInputError
from fxworker.errors import FxNoAgentError, FxUnknownSessionError
from fxworker.protocol import Outcome
from fxworker.runtime import LoopThread
from fxworker.store import embedded_store
from tests.durable.session_harness import (
    SYSTEM_REASONS,
    Effects,
    ProcessRegistry,
    Wake,
    WakeTracker,
    as_process,
    call_of,
    responder,
    tools,
)
from tests.support.workers import wait_until

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("FX_MODEL_EXAMPLES", "0")) or 20
LONG = EXAMPLES > 100
STEPS = int(os.environ.get("FX_MODEL_STEPS", "0")) or (30 if LONG else 12)

# Short enough that leases lapse and deadlines cut turns off within a step or two: a lease
# renewed every 0.2 s; a delivery yields before a model request 0.7 s in and cuts off what
# still runs at 0.95 s; a sweep every 0.2 s.
LEASE_S = 0.6
DELIVERY_S = 1.2
SETTINGS = Settings(lease_s=LEASE_S, reserve_s=0.5, delivery_timeout_s=DELIVERY_S, sweep_s=0.2,
                    no_agent_retry_s=0.5)
MAIN, FOREIGN = "modelled", "elsewhere"
SESSIONS = 2
MAX_WORKERS = 2
# A session waiting after a wake found no worker of its agent is swept only once its
# backoff is 5 s overdue (sweeper.UNSERVED_SLACK_MS), and a turn cut off three times takes
# three deliveries: idle within this once a capable worker runs.
QUIET_S = 15.0
SYSTEM_WAKES_IN_FLIGHT = 2  # a running delivery and its own requeue
CALL_S = 10.0  # bound on any one blocking call of a rule
PARK_WAIT_S = 1.5  # how long a decision or a cancel of a parked turn waits for a turn to park

PROMPTS = st.sampled_from(["hi", "send:bob", "nap:0.3", "wait:300", "wait:1500"])
# Prompts whose turn parks: one refund call, two in one response, an external pick.
PARKING = st.sampled_from(["refund:5", "refund:1,2", "pick:*.txt"])
PICK = st.integers(0, 7)  # an index into choices known only when the rule runs (taken modulo their number)
# The decision each rule sends for a call of each kind (`approve` of an external call is
# refused FX_DECISION_INVALID); the codes a refused decision carries.
FIRST = {"approval": ["approve", "deny"], "external": ["result", "result", "approve"]}
AGAIN = {"approval": ["approve", "deny"], "external": ["result", "deny"]}
UNKNOWN, REPEATED, INVALID = "FX_DECISION_UNKNOWN_CALL", "FX_DECISION_REPEATED", "FX_DECISION_INVALID"


def wake_check(wake: Wake, others: list[Wake]) -> str | None:
    """What a wake may find already queued or running for its session when it is queued.

    A sender's wake (prompt, steer, cancel) is sent whatever is in flight: duplicates are
    harmless and finish at once (§7). The wakes the system sends itself are bounded: a sweep
    never joins a wake of the session still queued or running, and a delivery's own
    requeue (yield, pending) or a forward joins at most the one delivery that sent it.
    """
    reasons = sorted(w.reason for w in others)
    if wake.reason == "sweep" and others:
        return f"a sweep queued a wake for {wake.session_id} while {len(others)} were queued or running: {reasons}"
    system = [w for w in others if w.reason in SYSTEM_REASONS]
    if wake.reason in SYSTEM_REASONS and len(system) + 1 > SYSTEM_WAKES_IN_FLIGHT:
        return f"{len(system) + 1} system wakes of {wake.session_id} queued or running: {wake.reason}, {reasons}"
    return None


@dataclass(frozen=True)
class Decided:
    """The first decision accepted for a call."""

    session_id: str
    how: str  # approve | deny | result
    message_id: str
    turn: str
    kind: str  # approval | external


class SessionMachine(RuleBasedStateMachine):
    model_url = ""
    tracker: WakeTracker

    def __init__(self) -> None:
        super().__init__()
        self.effects = Effects()
        self.events: list[dict[str, Any]] = []
        prefix = f"fxm{uuid.uuid4().hex[:8]}"
        self.store = embedded_store(prefix=prefix)
        common: dict[str, Any] = dict(
            model="scripted", api_key="test-key", tools=tools(self.effects), settings=SETTINGS,
            provider={"name": "scripted", "base_url": self.model_url,
                      "models": {"scripted": {"context_window": 100_000, "max_output_tokens": 4096,
                                              "supports_tools": True}}},
        )
        self.agent = Agent(MAIN, store=self.store, waker=embedded.InProcessWaker(start_workers=False),
                           on_event=self.events.append, **common)
        # Another worker process on the same store (its own connection) that runs another
        # agent only: its registry is its own, not this process's.
        self.foreign_store = embedded_store(prefix=prefix)
        self.foreign = Agent(FOREIGN, store=self.foreign_store, waker=embedded.InProcessWaker(start_workers=False),
                             **common)
        registry.unregister(FOREIGN)
        self.foreign_loop = LoopThread("fx-model-foreign")
        self.sessions = [self.agent.blocking_session() for _ in range(SESSIONS)]
        self.turns: dict[str, list[Any]] = {s.id: [] for s in self.sessions}  # BlockingTurn per prompt
        self.prompt_texts: dict[str, str] = {}
        self.steers: dict[str, set[str]] = {s.id: set() for s in self.sessions}
        self.inputs: Counter[str] = Counter()  # accepted inputs per session (prompts and steers)
        self.cancels: Counter[str] = Counter()
        self.faults = 0  # kills, stops and foreign deliveries: each may cost a session a claim
        self.n = 0
        self.loops: list[LoopThread] = []  # worker loops stopped or killed: closed after the example
        # Decisions: the first accepted one per call (call id -> Decided); calls an approval
        # was sent for with no answer (it may be stored); parked turns cancelled (turn id ->
        # its session and the calls that waited undecided then); what each session was sent
        # (every prompt, steer, cancel, decision and foreign wake: a parked session that got
        # none of them since it was last seen parked must not have moved).
        self.decided: dict[str, Decided] = {}
        self.unsure: set[str] = set()
        self.cancelled_parked: dict[str, tuple[str, frozenset[str]]] = {}
        self.stimuli: Counter[str] = Counter()
        self.parked_seen: dict[str, tuple[int, int, int, int]] = {}
        self.parking_prompts = 0
        self.decide_rules = 0
        self.tracker.queued.clear()
        self.tracker.violations.clear()
        self.tracker.system_sent.clear()
        embedded.start_embedded_workers(1)

    # ------------------------------------------------------------------ helpers

    def _id(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def _lines(self, session_id: str) -> list[dict[str, Any]]:
        """Every stored line of the session, chunks packed at rest expanded by the reader."""
        out: list[dict[str, Any]] = []
        sync = self.store.sync
        while True:
            page = sync.read_lines(session_id, out[-1]["cursor"] if out else 0)
            if not page:
                return out
            out += page

    def _calls(self, session_id: str) -> dict[str, tuple[str, str]]:
        """Every call a parked turn of the session asked a decision for (its
        `approval_request` line): call id -> (kind, the turn's message id)."""
        return {line["id"]: (line["kind"], line["messageId"])
                for line in self._lines(session_id) if line["type"] == "approval_request"}

    def _end_lines(self, session_id: str) -> dict[str, dict[str, Any]]:
        return {line["messageId"]: line for line in self._lines(session_id) if line["type"] == "turn_end"}

    def _waiting(self) -> list[tuple[int, str, str, str]]:
        """The calls the model knows wait: asked (an `approval_request` line), no decision
        of them accepted, their turn not ended: (session index, call id, kind, turn)."""
        out = []
        for i, session in enumerate(self.sessions):
            if not self.turns[session.id]:
                continue
            ended = set(self._end_lines(session.id))
            for call_id, (kind, turn) in self._calls(session.id).items():
                if call_id not in self.decided and turn not in ended:
                    out.append((i, call_id, kind, turn))
        return out

    def _asking(self) -> bool:
        """A prompt that parks (a refund, a pick) was sent and has not ended."""
        return any(self.prompt_texts[t.message_id].startswith(("refund:", "pick:"))
                   and t.message_id not in self._end_lines(s.id) for s in self.sessions for t in self.turns[s.id])

    def _soon(self, look: Any) -> Any:
        """What `look()` answers once it is truthy, waiting up to `PARK_WAIT_S` (a worker
        parks a turn after its model reply), else its last answer."""
        deadline = time.monotonic() + PARK_WAIT_S
        while not (found := look()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return found

    def _parked(self) -> list[int]:
        return [i for i, s in enumerate(self.sessions)
                if self.turns[s.id] and (state := self._state(s.id)) is not None and state.parked]

    def _decide(self, session: Any, call_id: str, how: str, message_id: str) -> Any:
        if how == "approve":
            return session.approve(call_id, message_id=message_id, by="model")
        if how == "deny":
            return session.deny(call_id, reason=f"no ({message_id})", message_id=message_id, by="model")
        return session.submit_tool_result(call_id, f"picked.txt ({message_id})", message_id=message_id, by="model")

    def _ends(self, session_id: str) -> Counter[str]:
        return Counter(line.get("messageId") for line in self._lines(session_id) if line["type"] == "turn_end")

    def lines_bound(self, session_id: str, epoch: int) -> int:
        """A turn writes turn_start, a few deltas, tool_start/tool_end, a user_message per
        steer it took, session_error and turn_end: 12 an input is generous. Each claim adds
        at most its turn_resume and a turn_yield (2 lines) and re-streams at most one model
        reply's deltas and a tool's start (4)."""
        return 12 * self.inputs[session_id] + 6 * epoch + 4

    def epoch_bound(self, session_id: str) -> int:
        """Claims (each one epoch) are what inputs and faults cause: a turn takes one, and
        a deadline cuts it off at most 3 times in a row before it ends (§11.6), so 5 an
        input covers a yield between tool steps too; each fault (a kill, a stop, a wake of
        the foreign process) and each cancel may cost one claim more."""
        return 5 * self.inputs[session_id] + 2 * (self.faults + self.cancels[session_id]) + 2

    def _state(self, session_id: str) -> Any:
        try:
            return self.store.sync.state(session_id)
        except FxUnknownSessionError:
            return None  # nothing was ever stored for it

    def _stop_workers(self) -> None:
        self.loops += embedded.embedded_workers()
        embedded.stop_embedded_workers()

    def _close_loops(self) -> None:
        """Closes the event loops of the workers this example stopped or killed (and its
        own): `LoopThread.close()` stops a loop without closing it, and a killed one is kept
        for ever, each holding its selector's descriptors. Once the example is over nothing
        of theirs may run again, so their loops are closed here."""
        for loop_thread in [*self.loops, self.foreign_loop]:
            if not loop_thread.loop.is_running() and not loop_thread.loop.is_closed():
                loop_thread.loop.close()

    # ------------------------------------------------------------------ users

    @rule(i=st.integers(0, SESSIONS - 1), prompt=PROMPTS)
    def prompt(self, i: int, prompt: str) -> None:
        session = self.sessions[i]
        message_id = self._id("p")
        self.stimuli[session.id] += 1
        turn = session.prompt(prompt, message_id=message_id)
        assert turn.message_id == message_id and turn.repeated is False
        self.turns[session.id].append(turn)
        self.prompt_texts[message_id] = prompt
        self.inputs[session.id] += 1

    @rule(i=st.integers(0, SESSIONS - 1), prompt=PARKING)
    def prompt_that_parks(self, i: int, prompt: str) -> None:
        self.prompt(i, prompt)
        self.parking_prompts += 1

    @precondition(lambda self: any(self.turns.values()))
    @rule(data=st.data())
    def prompt_again(self, data: st.DataObject) -> None:
        """A sender repeats a prompt with its message id (a retry after a lost answer)."""
        i = data.draw(st.sampled_from([i for i, s in enumerate(self.sessions) if self.turns[s.id]]))
        session = self.sessions[i]
        original = data.draw(st.sampled_from(self.turns[session.id]))
        self.stimuli[session.id] += 1
        again = session.prompt(self.prompt_texts[original.message_id], message_id=original.message_id)
        assert again.repeated is True and again.message_id == original.message_id

    @rule(i=st.integers(0, SESSIONS - 1))
    def steer(self, i: int) -> None:
        session = self.sessions[i]
        message_id = self._id("s")
        self.stimuli[session.id] += 1
        session.steer(f"steer {message_id}", message_id=message_id)
        self.steers[session.id].add(message_id)
        self.inputs[session.id] += 1

    @rule(i=st.integers(0, SESSIONS - 1))
    def cancel_session(self, i: int) -> None:
        session = self.sessions[i]
        self.stimuli[session.id] += 1
        try:
            session.cancel()
        except FxUnknownSessionError:
            assert self.inputs[session.id] == 0  # nothing was ever sent to it
            return
        self.cancels[session.id] += 1

    @precondition(lambda self: any(self.turns.values()))
    @rule(data=st.data())
    def cancel_turn(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from([i for i, s in enumerate(self.sessions) if self.turns[s.id]]))
        session = self.sessions[i]
        self.stimuli[session.id] += 1
        data.draw(st.sampled_from(self.turns[session.id])).cancel()
        self.cancels[session.id] += 1

    # ------------------------------------------------------------------ decisions

    @precondition(lambda self: self.parking_prompts > 0)
    @rule(pick=PICK, choice=PICK)
    def decide(self, pick: int, choice: int) -> None:
        """A decision for a call the model knows waits: approve or deny a refund, the result
        of a pick (or, refused FX_DECISION_INVALID, its approval). With none asked yet, but
        a prompt that asks sent, waits a moment for its request (none: a step that does
        nothing). What it picks is drawn as plain numbers (`PICK`), taken modulo the choices
        there are then: which calls wait depends on the workers' timing, and Hypothesis must
        draw the same way whatever they did."""
        self.decide_rules += 1
        waiting = self._soon(self._waiting) if self._asking() else self._waiting()
        if not waiting:
            return
        i, call_id, kind, turn = waiting[pick % len(waiting)]
        how = FIRST[kind][choice % len(FIRST[kind])]
        session = self.sessions[i]
        before = self._state(session.id)
        paused_before = before is not None and call_id in before.paused_calls
        message_id = self._id("d")
        self.stimuli[session.id] += 1
        self.unsure.add(call_id)
        try:
            accepted = self._decide(session, call_id, how, message_id)
        except FxInputError as refused:
            self.unsure.discard(call_id)
            ended = turn in self._end_lines(session.id)
            after = self._state(session.id)
            if how == "approve" and kind == "external" and refused.code == INVALID:
                return
            assert refused.code == UNKNOWN, (
                f"a first decision ({how}) for {call_id} ({kind}) refused {refused.code}: {refused}")
            assert after is None or call_id not in after.paused_calls, (
                f"{UNKNOWN} for {call_id}, which the store still says its turn {turn} waits on")
            assert ended or not paused_before, (
                f"{UNKNOWN} for {call_id}, which waited a moment before, and its turn {turn} did not end")
            return
        assert how != "approve" or kind != "external", f"an approval of the external call {call_id} was accepted"
        assert accepted.repeated is False and accepted.turn == turn, (
            f"a first decision for {call_id} of {turn}: {accepted}")
        self.decided[call_id] = Decided(session.id, how, message_id, turn, kind)
        self.inputs[session.id] += 1

    @precondition(lambda self: self.decide_rules > 0)
    @rule(pick=PICK, choice=PICK, same=st.booleans())
    def decide_again(self, pick: int, choice: int, same: bool) -> None:
        """A second decision for a call decided already: the first's message id again (a
        retry: `repeated`), or another decision (another sender: FX_DECISION_REPEATED while
        the turn is open, FX_DECISION_UNKNOWN_CALL once it ended)."""
        if not self.decided:
            return
        decided = sorted(self.decided)
        call_id = decided[pick % len(decided)]
        first = self.decided[call_id]
        session = next(s for s in self.sessions if s.id == first.session_id)
        how = first.how if same else AGAIN[first.kind][choice % len(AGAIN[first.kind])]
        message_id = first.message_id if same else self._id("d")
        self.stimuli[session.id] += 1
        try:
            accepted = self._decide(session, call_id, how, message_id)
        except FxInputError as refused:
            ended = first.turn in self._end_lines(session.id)
            assert refused.code in (REPEATED, UNKNOWN), f"a second decision for {call_id}: {refused.code} {refused}"
            assert refused.code == REPEATED or ended, (
                f"{UNKNOWN} for {call_id}, decided already, while its turn {first.turn} is open")
            return
        assert same and accepted.repeated and accepted.message_id == first.message_id, (
            f"a second decision ({how}, {'the same' if same else 'a new'} message id) for {call_id}, "
            f"decided {first.how} already, was accepted: {accepted}")

    @rule(i=st.integers(0, SESSIONS - 1), how=st.sampled_from(["approve", "deny", "result"]))
    def decide_unknown_call(self, i: int, how: str) -> None:
        session = self.sessions[i]
        self.stimuli[session.id] += 1
        try:
            accepted = self._decide(session, f"call_bogus{self._id('')}", how, self._id("d"))
        except FxUnknownSessionError:
            assert self.inputs[session.id] == 0, "a decision found no session that has inputs"
            return
        except FxInputError as refused:
            assert refused.code == UNKNOWN, f"a decision for no call: {refused.code} {refused}"
            return
        raise AssertionError(f"a decision for a call no turn made was accepted: {accepted}")

    @precondition(lambda self: self.parking_prompts > 0)
    @rule(pick=PICK)
    def cancel_parked(self, pick: int) -> None:
        """`session.cancel()` while its turn is parked with no decision: the turn ends
        `cancelled`, and the calls it waited on never run (whatever decisions come after).
        Waits a moment for a turn to park (none: a step that does nothing)."""
        parked = self._soon(self._parked) if self._asking() else self._parked()
        if not parked:
            return
        session = self.sessions[parked[pick % len(parked)]]
        state = self._state(session.id)
        assert state is not None and state.parked and state.open_turn is not None
        self.stimuli[session.id] += 1
        session.cancel()
        self.cancels[session.id] += 1
        self.cancelled_parked.setdefault(state.open_turn, (session.id, frozenset(state.paused_calls)))

    # ------------------------------------------------------------------ workers and time

    @precondition(lambda self: len(embedded.embedded_workers()) < MAX_WORKERS)
    @rule()
    def start_worker(self) -> None:
        embedded.start_embedded_workers(len(embedded.embedded_workers()) + 1)

    @precondition(lambda self: bool(embedded.embedded_workers()))
    @rule()
    def stop_workers(self) -> None:
        """Every worker of this process stops (its loop closes: running deliveries are
        cancelled), and so does the embedded sweeper."""
        self._stop_workers()
        self.faults += 1

    @precondition(lambda self: bool(embedded.embedded_workers()))
    @rule(data=st.data(), replace=st.booleans())
    def kill_worker(self, data: st.DataObject, replace: bool) -> None:
        index = data.draw(st.integers(0, len(embedded.embedded_workers()) - 1))
        self.loops.append(embedded.embedded_workers()[index])
        embedded.kill_embedded_worker(index, replace=replace)
        self.faults += 1

    @rule(i=st.integers(0, SESSIONS - 1))
    def wake_in_a_process_without_the_agent(self, i: int) -> None:
        """A worker process whose registry holds only another agent (on the same store)
        gets a wake of the session: it must not run it (FX_NO_AGENT) nor change its work."""
        session = self.sessions[i]
        payload = {"sessionId": session.id, "agent": MAIN, "reason": "prompt"}
        self.stimuli[session.id] += 1
        loop = self.foreign_loop

        async def deliver() -> Any:
            return await fxworker.delivery.handle_wake(payload, loop_thread=loop, settings=SETTINGS)

        try:
            outcome = loop.run(as_process({FOREIGN: self.foreign}, deliver), timeout_s=CALL_S)
        except FxNoAgentError:
            return  # refused: what a Celery worker would retry later
        except FxUnknownSessionError:
            assert self.inputs[session.id] == 0 and self.cancels[session.id] == 0
            return
        finally:
            self.faults += 1
        # Handed on to a worker of the owner, or dropped: never run here.
        assert outcome not in (Outcome.DONE, Outcome.YIELDED), (
            f"a process without {MAIN!r} ran a delivery of its session: {outcome}")

    @rule(s=st.sampled_from([0.05, LEASE_S + 0.1, DELIVERY_S + 0.1]))
    def time_passes(self, s: float) -> None:
        time.sleep(s)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def no_tool_with_effects_runs_twice(self) -> None:
        assert self.effects.repeated() == {}, f"a tool that is not idempotent ran twice: {self.effects.repeated()}"

    @invariant()
    def no_input_ends_twice(self) -> None:
        for session in self.sessions:
            ends = self._ends(session.id)
            accepted = {t.message_id for t in self.turns[session.id]} | self.steers[session.id]
            assert {m: n for m, n in ends.items() if n > 1} == {}, f"an input ended twice in {session.id}: {ends}"
            assert set(ends) <= accepted, f"turn_end of inputs never sent: {set(ends) - accepted}"

    @invariant()
    def writes_and_claims_are_bounded(self) -> None:
        for session in self.sessions:
            state = self._state(session.id)
            if state is None:
                continue
            assert state.epoch <= self.epoch_bound(session.id), (
                f"{session.id}: epoch {state.epoch} > {self.epoch_bound(session.id)} after {self.inputs[session.id]} "
                f"inputs, {self.faults} faults, {self.cancels[session.id]} cancels: claims without progress")
            lines = state.cursor
            assert lines <= self.lines_bound(session.id, state.epoch), (
                f"{session.id}: {lines} lines > {self.lines_bound(session.id, state.epoch)} at epoch {state.epoch} "
                f"after {self.inputs[session.id]} inputs: writes without progress")

    @invariant()
    def wakes_do_not_pile_up(self) -> None:
        assert self.tracker.violations == [], self.tracker.violations[:3]

    @invariant()
    def refunds_run_once_approved(self) -> None:
        """A refund runs at most once per execution id (above), only for a call whose
        approval was accepted (or sent with no answer), never for a denied call, never for
        a call of a turn cancelled while parked on it; an external tool's body never runs."""
        assert dict(self.effects.external) == {}, f"an external tool's body ran: {dict(self.effects.external)}"
        cancelled = {call: turn for turn, (_, calls) in self.cancelled_parked.items() for call in calls}
        for call_id, n in self.effects.refunded().items():
            first = self.decided.get(call_id)
            assert (first is not None and first.how == "approve") or (first is None and call_id in self.unsure), (
                f"refund {call_id} ran {n} time(s) with no approval accepted: {first}")
            assert call_id not in cancelled, (
                f"refund {call_id} ran {n} time(s) though its turn {cancelled.get(call_id)} was cancelled while parked")

    @invariant()
    def parked_sessions_stay_put(self) -> None:
        """A parked session holds no lease once it was let go (a fault may leave a dead
        holder's), and until a prompt, steer, cancel or decision comes nothing claims it,
        writes to it, or wakes it on the system's behalf (a sweep, a requeue)."""
        for session in self.sessions:
            state = self._state(session.id)
            if state is None or not state.parked:
                self.parked_seen.pop(session.id, None)
                continue
            assert not state.has_work, f"{session.id} parked: {state}"
            assert state.status != "paused" or state.lease_holder is None or self.faults > 0, (
                f"{session.id} parked, its lease still held by {state.lease_holder} with no fault: {state}")
            seen = (self.stimuli[session.id], state.epoch, state.cursor, self.tracker.system_sent[session.id])
            before = self.parked_seen.setdefault(session.id, seen)
            if before[0] == seen[0]:
                assert before[1:] == seen[1:], (
                    f"{session.id} stayed parked with nothing sent to it, yet (epoch, cursor, system wakes) "
                    f"went from {before[1:]} to {seen[1:]}")
            self.parked_seen[session.id] = seen

    # ------------------------------------------------------------------ quiescence

    def teardown(self) -> None:
        try:
            self._quiesce()
        finally:
            self._stop_workers()
            self.foreign_loop.close()
            self._close_loops()
            self.agent.close()
            self.foreign.close()
            self.store.close()
            self.foreign_store.close()

    def _quiesce(self) -> None:
        if not embedded.embedded_workers():
            embedded.start_embedded_workers(1)
        else:
            embedded.start_embedded_sweeper(SETTINGS)  # a kill leaves the workers, a stop took the sweeper

        def busy() -> list[str]:
            out = []
            for session in self.sessions:
                state = self._state(session.id)
                if state is not None and state.status not in ("idle", "paused"):
                    out.append(f"{session.id} {state.status} epoch={state.epoch} cursor={state.cursor} "
                               f"paused={state.paused_calls} decisions={state.decisions}")
            return out

        # Each round waits until every session is idle or parked, then decides every call a
        # parked turn waits on (approve or deny a refund, a pick's result): a turn resumed
        # may park again on its next call, at most once per call asked.
        rounds = 0
        while True:
            try:
                wait_until(lambda: not busy(), QUIET_S, interval_s=0.05, what="every session to be idle or parked")
            except TimeoutError:
                raise AssertionError(f"not idle {QUIET_S}s after a capable worker ran: {busy()}") from None
            self.parked_sessions_stay_put()
            paused = [(session, state) for session in self.sessions
                      if (state := self._state(session.id)) is not None and state.status == "paused"]
            if not paused:
                break
            rounds += 1
            asked = sum(len(self._calls(s.id)) for s in self.sessions)
            assert rounds <= asked, f"parked again after {asked} calls asked were decided: {paused}"
            for session, state in paused:
                asked = self._calls(session.id)
                for call_id in state.paused_calls:
                    kind, turn = asked.get(call_id, ("approval", state.open_turn or ""))
                    how = "result" if kind == "external" else ("approve", "deny")[sum(map(ord, call_id)) % 2]
                    message_id = self._id("d")
                    self.stimuli[session.id] += 1
                    self.unsure.add(call_id)
                    accepted = self._decide(session, call_id, how, message_id)
                    assert not accepted.repeated and accepted.turn == turn == state.open_turn, accepted
                    self.decided[call_id] = Decided(session.id, how, message_id, turn, kind)
                    self.inputs[session.id] += 1
        self.writes_and_claims_are_bounded()
        self.wakes_do_not_pile_up()
        self.no_tool_with_effects_runs_twice()
        self.refunds_run_once_approved()
        for session in self.sessions:
            ends = self._ends(session.id)
            for turn in self.turns[session.id]:
                assert ends[turn.message_id] == 1, (
                    f"prompt {turn.message_id} of {session.id} ended {ends[turn.message_id]} times")
            assert all(ends[m] <= 1 for m in self.steers[session.id])
        ended = {m: line for s in self.sessions for m, line in self._end_lines(s.id).items()}
        for turn, (session_id, calls) in self.cancelled_parked.items():
            assert ended[turn].get("stopReason") == "cancelled", (
                f"{turn} of {session_id}, cancelled while parked on {sorted(calls)}, ended {ended[turn]}")
        # With no fault and no cancel, an approved refund ran once (a fault may leave it
        # "may have partly run", which a call that is not idempotent never reruns).
        refunded = self.effects.refunded()
        for call_id, first in self.decided.items():
            if (first.how == "approve" and first.kind == "approval" and self.faults == 0
                    and self.cancels[first.session_id] == 0):
                assert refunded.get(call_id, 0) == 1, (
                    f"refund {call_id} approved ({first}) ran {refunded.get(call_id, 0)} times")


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


@pytest.fixture
def machine(model: ScriptedModel, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[SessionMachine]]:
    """The machine class, with the embedded waker's deliveries counted and the registry of
    the delivery handler and runner answerable as another process's."""
    tracker = WakeTracker(wake_check)
    monkeypatch.setattr(embedded, "handle_wake", tracker.wrap(embedded.handle_wake))
    process_registry = ProcessRegistry(registry)
    monkeypatch.setattr(fxworker.delivery, "registry", process_registry)
    monkeypatch.setattr(fxworker.runner, "registry", process_registry)
    embedded.stop_embedded_workers()

    class Machine(SessionMachine):
        model_url = model.base_url

    Machine.tracker = tracker
    try:
        yield Machine
    finally:
        embedded.stop_embedded_workers()


@pytest.mark.timeout(max(240, EXAMPLES * 12))
def test_sessions_driven_by_their_users_keep_the_contract(machine: type[SessionMachine]) -> None:
    shrink = LONG or bool(os.environ.get("FX_MODEL_SHRINK"))
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=not LONG,
            phases=[Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if shrink else [])],
            suppress_health_check=list(HealthCheck), database=None,
        ),
    )


@pytest.mark.timeout(60)
def test_a_cancel_of_a_parked_turn_whose_wake_is_lost_is_swept(model: ScriptedModel,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The minimal sequence the model found (`prompt_that_parks("refund:1,2")`, then
    `cancel_parked` while the workers were stopped and killed around it, until the
    quiescence found the session `waiting` 15 s): a turn parks, the session is cancelled
    and the wake of that cancel is lost (the worker it was handed to dies before it claims,
    or the broker drops it). A lost wake is what the sweeper is for (§7): within the wake
    trust and a sweep, a worker must claim the session and end the turn `cancelled`."""
    effects = Effects()
    agent = Agent(MAIN, store=embedded_store(prefix=f"fxm{uuid.uuid4().hex[:8]}"),
                  waker=embedded.InProcessWaker(start_workers=False), model="scripted", api_key="test-key",
                  tools=tools(effects), settings=SETTINGS,
                  provider={"name": "scripted", "base_url": model.base_url,
                            "models": {"scripted": {"context_window": 100_000, "max_output_tokens": 4096,
                                                    "supports_tools": True}}})
    embedded.stop_embedded_workers()
    embedded.start_embedded_workers(1)
    try:
        session = agent.blocking_session()
        turn = session.prompt("refund:1,2")
        wait_until(lambda: agent.store.sync.state(session.id).status == "paused", CALL_S, what="the turn to park")
        real = embedded.handle_wake

        async def lost(payload: dict[str, Any], **kwargs: Any) -> None:
            return None  # the wake never reaches a worker

        monkeypatch.setattr(embedded, "handle_wake", lost)
        session.cancel()
        monkeypatch.setattr(embedded, "handle_wake", real)
        state = agent.store.sync.state(session.id)
        assert state.status == "waiting" and state.cancel_requested and state.has_work

        def ended() -> bool:
            return any(line["type"] == "turn_end" and line["messageId"] == turn.message_id
                       for line in agent.store.sync.read_lines(session.id, 0))

        # The sender trusts its wake for SENDER_TRUST_MS (10 s); the sweeper then wakes it.
        wait_until(ended, 10.0 + 8.0, interval_s=0.1, what="the cancelled parked turn to end")
        assert effects.refunded() == {}
    finally:
        embedded.stop_embedded_workers()
        agent.close()
