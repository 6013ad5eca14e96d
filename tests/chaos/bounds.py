"""The checker's bounds on work without progress, and its rules of the caller actions.

A loop that can retry or re-wake without progress is a bug even if nothing is lost: these
rules bound, per session, what the store did against what was asked of it and what the
faults did to it. Each is a pure function of an `Observation` (`tests.chaos.checker`),
answering figures and appending violations.

**What touches a session.** Its inputs: the prompts and steers acknowledged to it, the
cancels acknowledged on it. Its yields (`turn_yield` lines: a delivery's soft stop, a hard
stop's cut-off, a warm shutdown). And the nemesis's faults that began within its window:
from `FAULT_SPAN_S` before its first acknowledgement (a SIGSTOP or a squeeze lasts that
long) to when its reader saw its last `turn_end` (else the end of the drain). A fault of
the window is counted whether or not it hit the session: an upper bound. A poison message
touches no session, and a fault's follow-ups (`cont`, `restored`, `replacement`, ...) are
part of the fault.

**Lines** (`bound: ... lines`): a session stores at most
`17 P + 4 S + 1 C + 3 Y + 6 F + 2` lines (P prompts, S steers, C cancels, Y yields, F faults):

- a prompt of the workload writes at most 17: `turn_start` and `turn_end`, a `tool_start`
  and a `tool_end` for each call (6 at most: `chain:<tag>:6`), two `text_delta` lines of
  its closing reply (the script streams the text in two pieces), and a `session_error`;
- a steer 4: its `user_message`, or a turn of its own (`turn_start`, two `text_delta`,
  `turn_end`);
- a cancel writes no line of its own (it ends a turn the prompt counted): 1 to spare;
- a decision accepted for a parked call 5: the resume's `turn_resume`, its
  `approval_decision`, the approved call's `tool_start` and `tool_end` (a denial: its
  `tool_end`), and the `turn_pause` of a turn that parks again on its other call (the
  prompt counted its `approval_request` lines and first `turn_pause` within its 17);
- a child's answer to a delegated call (`delegate:<tag>`) counts as a decision: its
  `turn_resume`, `delegate_end`, `approval_decision`, `tool_end`, and a `turn_pause` on the
  other call (the prompt counted its `tool_start`, `approval_request`, `delegate_start` lines
  and first `turn_pause`); the delegated calls of a session (its `delegate_start` and
  `delegate_end` call ids) are counted as its decisions, here and in the epochs;
- a yield 3: `turn_yield`, the next delivery's `turn_resume`, a cut-off call's rerun `tool_start`;
- a fault 6: a `turn_resume`, the lines of a step it retracted and redid (a reply's two
  `text_delta`, a call's `tool_start` and `tool_end`), a `session_error`;
- 2 to spare.

**Epochs** (`bound: ... epoch`): a session's epoch (meta `epoch`: every claim bumps it,
whether or not it stores a line) is at most `P + S + C + D + Y + 3 F + 2` (D: decisions
accepted and delegated calls, each answer an input that wakes the parked turn). Each input sends one
wake, and each yield requeues one; a claim that runs nothing is `idle` and bumps nothing
(`claim.lua`), so a claim needs work that an input or a yield brought, and a release that
finds an input waiting wakes the claim that runs it instead of the input's own wake (which
found the lease held). A fault may cost up to 3 claims: a takeover of a dead lease, and
a lease lost to a store restart or a full store, then the claim after it that could not
write. 2 to spare: a renewal late on a loaded machine. A session looping on a cancel or a
wake (hundreds of claims) is far past it.

**Yields** (`bound: ... yields`): a delivery yields at its soft stop, `SOFT_STOP_S` after it
began (`FX_DELIVERY_TIMEOUT_S - FX_RESERVE_S`), or later, and one session's deliveries do not
overlap (one lease): at most `window / SOFT_STOP_S + F + 1` yields, a warm shutdown's early
yield counted with its fault.

**Calls of a turn** (`bound: ... tool calls`): a turn stores at most
`CALLS_PER_TURN + CALLS_PER_RESUME * R` `tool_start` lines (R: its `turn_resume` lines): the
workload's largest prompt makes 6 calls (`chain:<tag>:6`), and a resume reruns, or asks the
model again for, at most the 2 calls of one reply (`both:<tag>`). A turn of the agent `typed`
also counts its final-result calls (the engine answers them itself: a `tool_start` each) and
adds `CALLS_PER_STEER` for each steer placed in it (a `user_message`): a steer placed after a
valid answer sets it aside, and the model answers again. A turn that keeps starting
calls that never end (a cancel the turn did not take) is past it long before its delivery yields.

**Queued wakes** (`bound: ... wakes queued`): the broker holds at most one wake of a session
at a time (`MAX_QUEUED_WAKES`), sampled during the run and after the drain
(`tests.chaos.wakes`): one queued wake is enough to run whatever waits, a second one can
only find the work done (or the lease held) and adds load that grows with the inputs.

**The agent no worker runs** (§7): a session of the agent `ghost` shows `noWorker` in its
state while it waits, and each of its inputs ends `error` `FX_NO_AGENT` (after
`FX_NO_AGENT_GIVE_UP_S`); its queued wakes are bounded as above.

**Caller actions** (`run:` / §6): each kind (`CALLER_KINDS`) was done at least once; at
least one cancel was stored before any worker claimed its prompt (the session's epoch was
still 0 when read after the cancel was acknowledged), and every such prompt ended `cancelled`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.chaos.checker import Observation

# The kinds of caller action (`tests.chaos.callers.KINDS`).
CALLER_KINDS = ("cancel_early", "storm", "ghost", "cancel_parked")
# The faults that can touch a session's deliveries (`tests.chaos.nemesis`).
TOUCHING = frozenset({"kill", "stop", "term", "redis", "clients", "squeeze", "stall", "primary"})
FAULT_SPAN_S = 5.0  # the longest a fault lasts after it is recorded (a squeeze, a SIGSTOP past the lease)
SOFT_STOP_S = 8.0  # FX_DELIVERY_TIMEOUT_S 12 - FX_RESERVE_S 4 (tests.chaos.system)
LINES_PER_PROMPT, LINES_PER_STEER, LINES_PER_CANCEL, LINES_PER_YIELD, LINES_PER_FAULT, LINES_SLACK = 17, 4, 1, 3, 6, 2
LINES_PER_DECISION = 5
EPOCHS_PER_INPUT, EPOCHS_PER_YIELD, EPOCHS_PER_FAULT, EPOCH_SLACK = 1, 1, 3, 2
CALLS_PER_TURN, CALLS_PER_RESUME, CALLS_PER_STEER = 6, 2, 1
MAX_QUEUED_WAKES = 1
NO_AGENT = "FX_NO_AGENT"


def _inputs(obs: Observation) -> dict[str, Counter[str]]:
    """Session id -> how many prompts, steers and cancels it was acknowledged."""
    inputs: dict[str, Counter[str]] = defaultdict(Counter)
    for ack in obs.acks:
        inputs[ack["session"]][ack["input"]] += 1
    for op in obs.callers:
        if op["kind"] == "cancel":
            inputs[op["session"]]["cancel"] += 1
    accepted = {(d["session"], d["messageId"]) for d in obs.decisions if d.get("status") == 202}
    for session_id, _ in accepted:
        inputs[session_id]["decision"] += 1
    for session_id, lines in obs.streams.items():  # a child's answer is a decision of its own
        inputs[session_id]["decision"] += len({ln["callId"] for ln in lines
                                               if ln["type"] in ("delegate_start", "delegate_end")})
    return inputs


def _window(obs: Observation, session_id: str) -> tuple[float, float]:
    """(first acknowledgement, last `turn_end` its reader saw, else the end of the drain)."""
    first = min((float(a.get("t", 0.0)) for a in obs.acks if a["session"] == session_id), default=0.0)
    end = obs.ended_at.get(session_id)
    if end is None:
        end = obs.drained_t if obs.drained_t is not None else first
    return first, max(first, float(end))


def _faults_touching(obs: Observation, session_id: str) -> int:
    first, end = _window(obs, session_id)
    return sum(1 for f in obs.faults if f["fault"] in TOUCHING and first - FAULT_SPAN_S <= float(f.get("t", 0.0)) <= end)


def progress(obs: Observation, violations: list[str]) -> dict[str, Any]:
    """The lines, epoch and yields of each session against its bounds (see the module doc)."""
    inputs = _inputs(obs)
    over = 0
    ratios: list[float] = []
    for session_id, lines in sorted(obs.streams.items()):
        n = inputs.get(session_id, Counter())
        p, s, c, d = n["prompt"], n["steer"], n["cancel"], n["decision"]
        y = sum(1 for ln in lines if ln["type"] == "turn_yield")
        f = _faults_touching(obs, session_id)
        epoch = max(obs.epochs.get(session_id, 0), max((int(ln["epoch"]) for ln in lines), default=0))
        most_lines = (LINES_PER_PROMPT * p + LINES_PER_STEER * s + LINES_PER_CANCEL * c + LINES_PER_DECISION * d
                      + LINES_PER_YIELD * y + LINES_PER_FAULT * f + LINES_SLACK)
        most_epoch = EPOCHS_PER_INPUT * (p + s + c + d) + EPOCHS_PER_YIELD * y + EPOCHS_PER_FAULT * f + EPOCH_SLACK
        first, end = _window(obs, session_id)
        most_yields = int((end - first) // SOFT_STOP_S) + f + 1
        said = f"({p} prompts, {s} steers, {c} cancels, {d} decisions, {y} yields, {f} faults in its window)"
        if len(lines) > most_lines:
            violations.append(f"bound: {session_id} stored {len(lines)} lines, at most {most_lines} {said}")
        if epoch > most_epoch:
            violations.append(f"bound: {session_id} is at epoch {epoch}, at most {most_epoch} {said}: "
                              "claims without progress")
        if y > most_yields:
            violations.append(f"bound: {session_id} yielded {y} times in {end - first:.1f} s, at most {most_yields} "
                              f"{said}")
        over += (len(lines) > most_lines) + (epoch > most_epoch) + (y > most_yields)
        ratios.append(epoch / most_epoch)
    return {"bounds_exceeded": over, "epoch_of_bound_max": round(max(ratios, default=0.0), 3),
            "epochs": sum(obs.epochs.values())}


def turn_calls(obs: Observation, violations: list[str]) -> dict[str, Any]:
    """The `tool_start` lines of each turn against its bound (see the module doc)."""
    from tests.chaos.tooling import TYPED_AGENT

    typed = {a["session"] for a in obs.acks if a.get("agent") == TYPED_AGENT}
    most = 0
    for session_id, lines in sorted(obs.streams.items()):
        starts: Counter[str] = Counter()
        resumes: Counter[str] = Counter()
        steers: Counter[str] = Counter()
        for line in lines:
            turn = str(line.get("messageId"))
            if line["type"] == "tool_start":
                starts[turn] += 1
            elif line["type"] == "turn_resume":
                resumes[turn] += 1
            elif line["type"] == "user_message" and session_id in typed:
                steers[turn] += 1
        for turn, n in sorted(starts.items()):
            most = max(most, n)
            bound = CALLS_PER_TURN + CALLS_PER_RESUME * resumes[turn] + CALLS_PER_STEER * steers[turn]
            if n > bound:
                steered = f", {steers[turn]} steers placed in a typed turn" if session_id in typed else ""
                violations.append(f"bound: turn {turn} of {session_id} started {n} tool calls, at most {bound} "
                                  f"({resumes[turn]} resumes{steered})")
    return {"most_tool_starts_in_a_turn": most}


def queued_wakes(obs: Observation, violations: list[str]) -> dict[str, Any]:
    """At most `MAX_QUEUED_WAKES` wakes of one session in the broker at once."""
    worst: dict[str, tuple[int, float, str]] = {}
    final: dict[str, int] = {}
    for op in obs.wakes:
        where = "after the drain" if op["kind"] == "wakes_final" else f"at {op.get('t', 0.0):.1f} s"
        for session_id, n in op.get("queued", {}).items():
            if op["kind"] == "wakes_final":
                final[session_id] = n
            if n > worst.get(session_id, (0, 0.0, ""))[0]:
                worst[session_id] = (n, float(op.get("t", 0.0)), where)
    ghosts = _ghosts(obs)
    crowded = 0
    for session_id, (n, _, where) in sorted(worst.items()):
        if n > MAX_QUEUED_WAKES:
            crowded += 1
            whose = " (its agent no worker runs)" if session_id in ghosts else ""
            violations.append(f"bound: {n} wakes of {session_id}{whose} queued at once {where}, "
                              f"at most {MAX_QUEUED_WAKES}")
    return {"wakes_queued_max": max((w[0] for w in worst.values()), default=0), "sessions_over_wake_bound": crowded,
            "wakes_left_queued": sum(final.values())}


def _ghosts(obs: Observation) -> set[str]:
    return {op["session"] for op in obs.callers if op["kind"] == "caller" and op.get("action") == "ghost"}


def no_worker(obs: Observation, violations: list[str]) -> dict[str, Any]:
    """§7: a session of the agent no worker runs shows `noWorker` and its inputs end FX_NO_AGENT."""
    ghosts = _ghosts(obs)
    seen = {op["session"]: op for op in obs.callers if op["kind"] == "ghost"}
    shown = ended = 0
    for session_id in sorted(ghosts):
        watched = seen.get(session_id)
        if watched is not None and watched.get("no_worker"):
            shown += 1
        else:
            statuses = (watched or {}).get("statuses")
            violations.append(f"§7 {session_id} (agent ghost, no worker runs it) never showed noWorker while it "
                              f"waited (states read: {statuses})")
        lines = obs.streams.get(session_id, [])
        for ack in (a for a in obs.acks if a["session"] == session_id):
            end = next((ln for ln in lines if ln["type"] == "turn_end" and ln.get("messageId") == ack["messageId"]),
                       None)
            code = ((end or {}).get("error") or {}).get("code")
            if end is not None and end.get("stopReason") == "error" and code == NO_AGENT:
                ended += 1
                continue
            how = "never ended" if end is None else f"ended {end.get('stopReason')} {code or ''}".rstrip()
            violations.append(f"§7 {ack['input']} {ack['messageId']} of {session_id} (agent ghost) {how}, "
                              f"not error {NO_AGENT}")
    return {"ghost_sessions": len(ghosts), "ghost_no_worker_shown": shown, "ghost_inputs_ended_no_agent": ended}


def caller_actions(obs: Observation, violations: list[str]) -> dict[str, Any]:
    """Each caller kind happened; a cancel came before a claim, and such a prompt ended `cancelled`."""
    if not any(op["kind"] == "caller" for op in obs.callers):
        return {"caller_actions": {}}  # a run without callers (`--no-callers`)
    actions = Counter(op["action"] for op in obs.callers if op["kind"] == "caller")
    for kind in CALLER_KINDS:
        if not actions[kind]:
            violations.append(f"run: the caller action {kind} never happened")
    storms = [op for op in obs.callers if op["kind"] == "storm"]
    if actions["storm"] and not storms:
        violations.append("run: no driver sent a storm of steers and cancels the callers asked for")
    early = [op for op in obs.callers if op["kind"] == "caller" and op.get("action") == "cancel_early"]
    before = [op for op in early if op.get("before_claim")]
    if early and not before:
        violations.append("run: no cancel was stored before a worker claimed its prompt")
    for op in before:
        lines = obs.streams.get(op["session"], [])
        end = next((ln for ln in lines if ln["type"] == "turn_end" and ln.get("messageId") == op["messageId"]), None)
        if end is not None and end.get("stopReason") != "cancelled":
            violations.append(f"§6 prompt {op['messageId']} of {op['session']}, cancelled before any worker "
                              f"claimed it, ended {end.get('stopReason')}")
    return {"caller_actions": dict(actions), "cancels_before_claim": len(before),
            "cancels_before_claim_held": sum(1 for op in before if op.get("held")),
            "cancels_early_raced": sum(1 for op in early if not op.get("held")),
            "storms": len(storms), "storm_inputs": sum(len(op.get("kinds", [])) for op in storms),
            "cancels": sum(1 for op in obs.callers if op["kind"] == "cancel"),
            "caller_failures": sum(1 for op in obs.callers if op["kind"] == "caller_failed")}
