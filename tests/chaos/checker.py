"""The checker of a chaos run: the invariants of docs/design.md §11 over the recorded history.

Pure functions of an `Observation`: what the workload was told (acknowledgements), what its
readers were sent, what the nemesis did, and what the store holds once the run drained
(every session's stored stream, the tool starts the tools recorded, the workers'
`on_event` diagnostics, where the API key was found). `check()` answers the run's
figures and a list of violations, each naming its invariant:

- §11.1 every acknowledged prompt has a `turn_end` line, and every acknowledged steer
  shows in its session (joined a turn as a `user_message`, or ran as a turn of its own);
  no input has two `turn_end` lines (each ends exactly once);
- §11.2 no call of the non-idempotent tool started twice (two starts of one execution id);
- §11.3 every such start found its intent (the model response naming the call) stored;
- §11.4 no stored line has an epoch below one stored before it (a replaced holder's write);
- §11.5 no turn starts while another is open, each input starts at most one turn, and
  turns run in the order their inputs were acknowledged;
- §11.6 no step was cut off by a deadline more than 3 times in a row;
- §11.7 every reader was sent each stored line exactly once, in order, through the end,
  identical to the stored one; and stored cursors run 1, 2, 3, ... without a gap;
- §11.8 the API key is in no Redis key or value (nor the AOF), and the model was sent it.

Two checks of the run itself, not of §11 (violations named `run:`): no worker process
exited but those a fault killed or stopped (a poison message, an OOM reply or a stalled
model must not take a worker down); and every poison message the nemesis pushed left its
queue, and each the transport cannot decode is in the dead-letter list, which holds nothing
else (a wake with bad arguments decodes: its task refuses it, and it may or may not be
dead-lettered).

Parked calls (`approval:`, docs/design.md §6 "Paused turns"; the decisions are sent by
`tests.chaos.approvals`): each `refund` execution id started at most once; a call started
only if an approval of it was accepted (or sent and never answered: it may be stored); a
call whose accepted decision was a denial never started; at most one decision accepted per
call whatever the senders and web processes (one message id answered 202, every other
refused 409 `FX_DECISION_REPEATED`, or `FX_DECISION_UNKNOWN_CALL` once its turn ended), and
one exactly unless the turn ended first (a cancel: `cancelled`); every turn that took a
decision ended exactly once.

Delegated turns (`delegation:`, docs/design.md §6 "Delegated turns"; `delegate:<tag>`
prompts, `tests.chaos.workload`): the child sessions are found from their parents' stored
lines (`turn_pause` calls of `delegate`, `delegate_start`, `delegate_end`) and read once the
drain ended (`Observation.children`). Per call: one `delegate_start`; one `delegate_end`
unless its parent turn ended `cancelled` or `error`; one child turn (`turn_start` and
`turn_end` of the call's child message id) whose stop reason the `delegate_end` gives; no
parent turn left open once all its children ended; and each child's stream in epoch order,
one turn at a time, cursors without a gap. A child's effects are §11.2's and §11.3's
(their starts are recorded with every other).

Typed turns (`typed:`, docs/design.md §6 "Typed answers"; the sessions of the agent `typed`,
whose every prompt is `typed:<tag>`, `tests.chaos.workload`): every turn of such a session
that ended `end_turn` carries `output`, which validates as `TypedAnswer`, names the tag of
its own input or of a steer placed in it, and is an answer the model gave that tag
(`Observation.typed_answers`, each valid answer numbered apart); where the turn was never
resumed and no steer came after its last valid final-result call, `output` is that call's
arguments. No turn of another agent carries `output`. A turn stores at most one refused
final-result call (the script refuses only a first try, a request that carries no errors,
and a retry carries its errors; one more for each retry the model did refuse), its
result telling the model "The arguments did not validate as TypedAnswer"; it ends `error`
`FX_OUTPUT_INVALID` only if the model gave more than `TYPED_RETRIES` invalid answers for it.
A valid answer that was stored is not asked for again: two stored valid final-result calls
of one turn have a steer placed between them. A probe call in the response of a valid answer
never runs and is answered "not run". The model requests of a `typed:<tag>` turn (those
whose last input is its prompt) number at most 2 (a refused answer and its retry), plus 2
for each fault of the run near them and each request that stalled, plus the takeovers,
fences, transport errors and deadline cut-offs of its session meanwhile, plus its own yields
and resumes.

Bounds on work without progress (`bound:`, `tests.chaos.bounds`, where the constants are
explained): per session, its stored lines, its epoch (claims) and its yields against its
inputs, yields and the faults of its window; per turn, the calls it started; at most one wake of a session queued in the
broker at a time. And the caller actions' rules: a session of the agent no worker runs shows
`noWorker` and its inputs end `FX_NO_AGENT` (§7); each caller kind happened, a cancel reached
a prompt before any claim and that prompt ended `cancelled` (`run:`, §6).

On a cluster store (`Observation.cluster`) the faults counted include `primary`, and the
figures add the primaries killed with their failover and rejoin times; the rules are the same.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.bounds import caller_actions, no_worker, progress, queued_wakes, turn_calls

MAX_CUTOFFS = 3
FAULT_KINDS = ("kill", "stop", "term", "redis", "clients", "poison", "squeeze", "stall", "typed", "replacement")
# On a cluster store the nemesis also kills primaries (`tests.chaos.nemesis`).
CLUSTER_FAULT_KINDS = (*FAULT_KINDS, "primary")
# Poison kinds a worker's transport cannot decode: they must be dead-lettered.
UNDECODABLE = ("garbage", "json", "base64")


@dataclass
class Observation:
    """Everything a run recorded, as the checker reads it."""

    seed: int
    acks: list[dict[str, Any]]
    streams: dict[str, list[dict[str, Any]]]
    readers: dict[str, list[dict[str, Any]]]
    runs: list[dict[str, Any]]
    events: list[dict[str, Any]]
    faults: list[dict[str, Any]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    unacked: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    key_hits: list[str] = field(default_factory=list)
    keyed_requests: int = 0
    reader_connections: int = 0
    worker_exits: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[str] = field(default_factory=list)
    queued: list[str] = field(default_factory=list)
    retried: list[dict[str, Any]] = field(default_factory=list)
    stalls: list[dict[str, Any]] = field(default_factory=list)
    cluster: bool = False  # the store was a Redis Cluster (the `primary` fault is one of the run's)
    epochs: dict[str, int] = field(default_factory=dict)  # session id -> its epoch once drained (meta)
    ended_at: dict[str, float] = field(default_factory=dict)  # session id -> when its reader saw its last turn_end
    callers: list[dict[str, Any]] = field(default_factory=list)  # caller, storm, cancel, ghost operations
    wakes: list[dict[str, Any]] = field(default_factory=list)  # samples of the queued wakes (tests.chaos.wakes)
    drained_t: float | None = None  # when the drain ended
    decisions: list[dict[str, Any]] = field(default_factory=list)  # decisions sent and their answers (approvals.py)
    children: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # child session id -> its stored lines
    typed_answers: list[dict[str, Any]] = field(default_factory=list)  # the model's final-result calls (workload.py)


@dataclass
class Verdict:
    figures: dict[str, Any]
    violations: list[str]

    @property
    def passed(self) -> bool:
        return not self.violations


def check(obs: Observation) -> Verdict:
    violations: list[str] = []
    figures: dict[str, Any] = {}
    for rule in (lost_inputs, duplicated_effects, intents, stale_lines, turn_order, cutoffs, readers, credentials,
                 worker_exits, dead_letters, progress, turn_calls, queued_wakes, no_worker, caller_actions,
                 approvals, delegations, typed_turns):
        figures.update(rule(obs, violations))
    figures.update(counts(obs))
    return Verdict(figures, violations)


# ----------------------------------------------------------------------------- §11.1


def lost_inputs(obs: Observation, violations: list[str]) -> dict[str, Any]:
    lost = 0
    lost_steers = 0
    ended_twice = 0
    for ack in obs.acks:
        lines = obs.streams.get(ack["session"], [])
        mid = ack["messageId"]
        ends = sum(1 for ln in lines if ln["type"] == "turn_end" and ln.get("messageId") == mid and not ln.get("repeated"))
        if ends > 1 and not ack.get("repeated"):
            ended_twice += 1
            violations.append(f"§11.1 acknowledged {ack['input']} {mid} of {ack['session']} ended {ends} times")
        if ack["input"] == "prompt":
            if not any(ln["type"] == "turn_end" and ln.get("messageId") == mid for ln in lines):
                lost += 1
                violations.append(f"§11.1 acknowledged prompt {mid} of {ack['session']} never reached turn_end")
        elif not any(_names_steer(ln, mid) for ln in lines):
            lost_steers += 1
            violations.append(f"§11.1 acknowledged steer {mid} of {ack['session']} never showed in its session")
    return {"lost": lost, "lost_steers": lost_steers, "ended_twice": ended_twice}


def _names_steer(line: dict[str, Any], message_id: str) -> bool:
    if line["type"] == "user_message":
        return message_id in (line.get("id"), line.get("messageId"))
    return line["type"] in ("turn_start", "turn_end") and line.get("messageId") == message_id


# ----------------------------------------------------------------------------- §11.2 / §11.3


def _starts(obs: Observation, tool: str) -> dict[str, set[str]]:
    """Execution id -> the distinct start tokens of `tool` (a resent push repeats its token)."""
    by_call: dict[str, set[str]] = defaultdict(set)
    for run in obs.runs:
        if run.get("tool") == tool:
            by_call[run["x"]].add(run["token"])
    return by_call


def duplicated_effects(obs: Observation, violations: list[str]) -> dict[str, Any]:
    effects = _starts(obs, "effect")
    duplicated = 0
    for execution_id, tokens in sorted(effects.items()):
        if len(tokens) > 1:
            duplicated += len(tokens) - 1
            violations.append(f"§11.2 the non-idempotent call {execution_id} started {len(tokens)} times")
    probes = _starts(obs, "probe")
    return {
        "effect_calls": len(effects),
        "duplicated_effects": duplicated,
        "probe_calls": len(probes),
        "probe_reruns": sum(len(t) - 1 for t in probes.values()),
    }


def intents(obs: Observation, violations: list[str]) -> dict[str, Any]:
    missing = sorted({run["x"] for run in obs.runs if run.get("tool") == "effect" and not run.get("intent")})
    for execution_id in missing:
        violations.append(f"§11.3 the non-idempotent call {execution_id} started before its intent was stored")
    return {"starts_without_intent": len(missing)}


# ----------------------------------------------------------------------------- parked calls

DECISION_REFUSALS = ("FX_DECISION_REPEATED", "FX_DECISION_UNKNOWN_CALL")
NEAR_FAULT_S = 2.0  # a decision sent this soon after a kill, SIGSTOP or SIGTERM of a worker
UNDECIDED_ENDS = ("cancelled", "error")  # how a parked turn may end with none of its calls decided


def _call_of(execution_id: str) -> str:
    return execution_id.rsplit(":", 1)[-1]


def accepted_decisions(obs: Observation) -> dict[str, dict[str, dict[str, Any]]]:
    """Call id -> message id -> the decision answered 202 under it (repeated or not)."""
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for d in obs.decisions:
        if d.get("status") == 202:
            out[d["call"]].setdefault(d["messageId"], d)
    return out


def approvals(obs: Observation, violations: list[str]) -> dict[str, Any]:
    refunds = _starts(obs, "refund")
    for execution_id, tokens in sorted(refunds.items()):
        if len(tokens) > 1:
            violations.append(f"approval: the refund call {execution_id} started {len(tokens)} times")
    ran = Counter(_call_of(x) for x in refunds)
    asked: dict[str, tuple[str, str]] = {}  # call id -> (session, turn)
    for session_id, lines in obs.streams.items():
        for ln in lines:
            if ln["type"] == "approval_request" and ln.get("kind", "approval") == "approval":
                asked.setdefault(ln["id"], (session_id, str(ln.get("messageId"))))
    ends: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for session_id, lines in obs.streams.items():
        for ln in lines:
            if ln["type"] == "turn_end" and not ln.get("repeated"):
                ends[(session_id, str(ln.get("messageId")))].append(ln)
    accepted = accepted_decisions(obs)
    sent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in obs.decisions:
        sent[d["call"]].append(d)
    for call_id in sorted(set(ran) - set(asked)):
        violations.append(f"approval: refund {call_id} started, but no turn asked a decision for it")
    figures: Counter[str] = Counter()
    decided_turns: set[tuple[str, str]] = set()
    for call_id, (session_id, turn) in sorted(asked.items()):
        ds = sent.get(call_id, [])
        ok = accepted.get(call_id, {})
        types = {d["type"] for d in ok.values()}
        unanswered = [d for d in ds if d.get("status") is None]
        ended = ends.get((session_id, turn), [])
        for d in ds:
            status, code = d.get("status"), d.get("code")
            if status not in (202, 409, None) or (status == 409 and code not in DECISION_REFUSALS):
                violations.append(f"approval: {d['type']} {d['messageId']} of {call_id} answered {status} {code}")
            if status == 409 and code == "FX_DECISION_UNKNOWN_CALL" and not ended:
                violations.append(f"approval: {d['type']} {d['messageId']} of {call_id} refused {code}, "
                                  f"but its turn {turn} never ended")
            if status == 409 and code == "FX_DECISION_REPEATED" and not ok and not unanswered:
                violations.append(f"approval: {d['type']} {d['messageId']} of {call_id} refused {code}, "
                                  "but no decision of it was accepted")
        if len(ok) > 1:
            violations.append(f"approval: {len(ok)} decisions of {call_id} accepted: "
                              f"{sorted((d['type'], d['messageId'], d['web']) for d in ok.values())}")
        approved = "approve" in types or any(d["type"] == "approve" for d in unanswered)
        if ran[call_id] and not approved:
            violations.append(f"approval: refund {call_id} started with no approval accepted "
                              f"(accepted: {sorted(types) or 'none'})")
        if ran[call_id] and "deny" in types:
            violations.append(f"approval: refund {call_id} started though its denial was accepted")
        if ds and not ok and not unanswered and not any(e.get("stopReason") in UNDECIDED_ENDS for e in ended):
            violations.append(f"approval: no decision of {call_id} accepted of {len(ds)} sent, and its turn {turn} "
                              f"did not end first ({[e.get('stopReason') for e in ended] or 'no turn_end'})")
        if ok:
            decided_turns.add((session_id, turn))
        figures["refund_calls"] += 1
        figures["refund_calls_decided"] += bool(ok)
        figures["refund_calls_approved"] += "approve" in types
        figures["refund_calls_denied"] += "deny" in types
        figures["refund_calls_started"] += bool(ran[call_id])
        figures[f"mode_{(ds[0] if ds else {}).get('mode', 'none')}"] += 1
    for session_id, turn in sorted(decided_turns):
        n = len(ends.get((session_id, turn), []))
        if n != 1:
            violations.append(f"approval: the parked turn {turn} of {session_id} took a decision and ended {n} times")
    kills = [float(f["t"]) for f in obs.faults if f["fault"] in ("kill", "stop", "term")]
    repeated_ok = sum(1 for d in obs.decisions if d.get("status") == 202 and d.get("repeated"))
    return {
        "refund_calls": figures["refund_calls"], "refund_calls_decided": figures["refund_calls_decided"],
        "refund_calls_approved": figures["refund_calls_approved"], "refund_calls_denied": figures["refund_calls_denied"],
        "refund_calls_started": figures["refund_calls_started"],
        "refund_starts": sum(len(t) for t in refunds.values()),
        "parked_turns_decided": len(decided_turns),
        "parked_turns_ended_undecided": sum(
            1 for (s, t) in {v for v in asked.values()} - decided_turns
            if any(e.get("stopReason") in UNDECIDED_ENDS for e in ends.get((s, t), []))),
        "decisions_sent": len(obs.decisions),
        "decisions_accepted": sum(len(v) for v in accepted.values()),
        "decisions_repeated_202": repeated_ok,
        "decisions_refused": dict(Counter(str(d.get("code")) for d in obs.decisions if d.get("status") == 409)),
        "decisions_unanswered": sum(1 for d in obs.decisions if d.get("status") is None),
        "decision_modes": {k[5:]: v for k, v in figures.items() if k.startswith("mode_")},
        "decisions_near_faults": sum(1 for d in obs.decisions
                                     if any(0 <= float(d.get("sent_t", -99)) - k <= NEAR_FAULT_S for k in kills)),
    }


# ----------------------------------------------------------------------------- delegated turns

OPEN_PARENT_ENDS = ("cancelled", "error")  # a parent turn ended so may leave a delegated call unanswered


@dataclass
class Delegated:
    """One call of the delegating tool, as its parent's stored lines name it."""

    parent: str
    turn: str
    call: str
    child: str | None = None
    child_message_id: str | None = None
    starts: list[dict[str, Any]] = field(default_factory=list)  # its `delegate_start` lines
    ends: list[dict[str, Any]] = field(default_factory=list)  # its `delegate_end` lines
    paused: bool = False  # a stored `turn_pause` names it


def delegated_calls(session_id: str, lines: Iterable[dict[str, Any]]) -> dict[str, Delegated]:
    """Call id -> the delegated call of a session's turns: from its `turn_pause` lines (the
    child's ids derive from the call's execution id, as `fxworker.delegation` derives them)
    and its `delegate_start` / `delegate_end` lines."""
    from fxworker.delegation import child_message_id, child_session_id
    from tests.chaos.tooling import DELEGATE_TOOL, delegate

    tool = delegate()
    calls: dict[str, Delegated] = {}

    def of(line: dict[str, Any], call_id: str) -> Delegated:
        return calls.setdefault(call_id, Delegated(session_id, str(line.get("messageId")), call_id))

    for line in lines:
        kind = line["type"]
        if kind == "turn_pause":
            for pending in line.get("pendingCalls") or []:
                if pending.get("name") != DELEGATE_TOOL or pending.get("kind") != "external":
                    continue
                d = of(line, pending["id"])
                d.paused = True
                d.child = d.child or child_session_id(session_id, tool, pending["executionId"])
                d.child_message_id = d.child_message_id or child_message_id(pending["executionId"])
        elif kind == "delegate_start":
            d = of(line, line["callId"])
            d.starts.append(line)
            d.child = d.child or line.get("sessionId")
            d.child_message_id = d.child_message_id or line.get("childMessageId")
        elif kind == "delegate_end":
            d = of(line, line["callId"])
            d.ends.append(line)
            d.child = d.child or line.get("sessionId")
    return calls


def children_of(streams: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """Child session id -> its turn's message id, of every delegated call `streams` name."""
    return {d.child: d.child_message_id or "" for session_id, lines in streams.items()
            for d in delegated_calls(session_id, lines).values() if d.child}


def delegations(obs: Observation, violations: list[str]) -> dict[str, Any]:
    """Delegated turns (`delegation:`): for each call of `delegate` a parent turn made, one
    `delegate_start`, and one `delegate_end` unless the parent turn ended `cancelled` or
    `error` (or never ended, which is a violation when all its children ended); its child
    session holds one turn for the call's child message id (a `turn_start`, unless it was
    refused unstarted, and one `turn_end`), whose stop reason the `delegate_end` gives;
    the child's stored lines keep their epochs in order and one turn at a time. A child's
    non-idempotent effects are §11.2's (their starts are recorded with the others)."""
    streams = {**obs.streams, **obs.children}
    figures: Counter[str] = Counter()
    child_ends: Counter[str] = Counter()
    answers: Counter[str] = Counter()
    parents: Counter[str] = Counter()
    open_turns: dict[tuple[str, str], list[Delegated]] = defaultdict(list)
    for session_id, lines in sorted(streams.items()):
        ends: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for ln in lines:
            if ln["type"] == "turn_end" and not ln.get("repeated"):
                ends[str(ln.get("messageId"))].append(ln)
        calls = delegated_calls(session_id, lines)
        for turn in sorted({d.turn for d in calls.values()}):
            parents[ends[turn][0].get("stopReason") if ends.get(turn) else "open"] += 1
        for call_id, d in sorted(calls.items()):
            figures["calls"] += 1
            where = f"call {call_id} of turn {d.turn} of {session_id} (child {d.child})"
            parent_end = ends.get(d.turn, [])
            parent_stop = parent_end[0].get("stopReason") if parent_end else None
            if len(d.starts) != 1:
                violations.append(f"delegation: {where} has {len(d.starts)} delegate_start lines, not 1"
                                  f"{' (its turn_pause is stored)' if d.paused else ''}")
            if len(d.ends) > 1 or (not d.ends and parent_end and parent_stop not in OPEN_PARENT_ENDS):
                violations.append(f"delegation: {where} has {len(d.ends)} delegate_end lines, not 1 "
                                  f"(its turn ended {parent_stop})")
            if not parent_end:
                open_turns[(session_id, d.turn)].append(d)
            for start in d.starts:
                if start.get("agent") != "default" or start.get("sessionId") != d.child:
                    violations.append(f"delegation: {where}: delegate_start names agent {start.get('agent')} "
                                      f"session {start.get('sessionId')}")
            if d.child is None:
                continue
            child_lines = obs.children.get(d.child)
            if not child_lines:
                violations.append(f"delegation: {where}: the child session stores no line")
                continue
            mid = d.child_message_id
            starts = [ln for ln in child_lines if ln["type"] == "turn_start" and ln.get("messageId") == mid]
            cends = [ln for ln in child_lines
                     if ln["type"] == "turn_end" and ln.get("messageId") == mid and not ln.get("repeated")]
            child_stop = cends[0].get("stopReason") if cends else None
            if len(cends) != 1:
                violations.append(f"delegation: {where}: the child's turn {mid} ended {len(cends)} times")
            if len(starts) > 1 or (not starts and child_stop != "error"):
                violations.append(f"delegation: {where}: the child's turn {mid} has {len(starts)} turn_start "
                                  f"lines (it ended {child_stop})")
            for end in d.ends:
                answers[str(end.get("stopReason"))] += 1
                if end.get("sessionId") != d.child:
                    violations.append(f"delegation: {where}: delegate_end names session {end.get('sessionId')}")
                if cends and end.get("stopReason") != child_stop:
                    violations.append(f"delegation: {where}: delegate_end says {end.get('stopReason')}, "
                                      f"the child's turn_end {child_stop}")
            child_ends[str(child_stop) if cends else "open"] += 1
    for (session_id, turn), calls_ in sorted(open_turns.items()):
        ended = [d for d in calls_ if d.child and any(
            ln["type"] == "turn_end" and ln.get("messageId") == d.child_message_id
            for ln in obs.children.get(d.child, []))]
        if len(ended) == len(calls_):
            violations.append(f"delegation: turn {turn} of {session_id} is still open after the drain though "
                              f"its {len(calls_)} children ended ({[d.child for d in calls_]})")
    for child, lines in sorted(obs.children.items()):
        head = 0
        for line in lines:
            if line["epoch"] < head:
                violations.append(f"delegation: child {child} stores a line of epoch {line['epoch']} after "
                                  f"epoch {head}: cursor {line['cursor']} {line['type']}")
            head = max(head, line["epoch"])
        if [ln["cursor"] for ln in lines] != list(range(1, len(lines) + 1)):
            violations.append(f"delegation: child {child}: stored cursors are not 1..{len(lines)} in order")
        violations.extend(f"delegation: child {child}: {p}" for p in _turns(lines)[1])
    child_runs = [r for r in obs.runs if str(r.get("x", "")).split(":", 1)[0] in obs.children]
    cancelled: Counter[str] = Counter()  # the `cancel_parked` callers' turns and their children, by how they ended
    for op in obs.callers:
        if op["kind"] != "caller" or op.get("action") != "cancel_parked":
            continue
        lines = obs.streams.get(op["session"], [])
        end = next((ln for ln in lines if ln["type"] == "turn_end" and ln.get("messageId") == op["messageId"]), None)
        cancelled[f"{op.get('status')} -> {end.get('stopReason') if end else 'open'}"] += 1
        for d in delegated_calls(op["session"], lines).values():
            child_end = next((ln for ln in obs.children.get(d.child or "", [])
                              if ln["type"] == "turn_end" and ln.get("messageId") == d.child_message_id), None)
            cancelled[f"child {child_end.get('stopReason') if child_end else 'open'}"] += 1
    return {
        "cancels_of_delegating_turns": dict(cancelled),
        "delegated_calls": figures["calls"],
        "delegate_starts": sum(1 for lines in streams.values() for ln in lines if ln["type"] == "delegate_start"),
        "delegate_answers": dict(answers),
        "delegating_turns": dict(parents),
        "child_sessions": len(obs.children),
        "children_ended": dict(child_ends),
        "child_effect_calls": len({r["x"] for r in child_runs if r.get("tool") == "effect"}),
        "child_probe_calls": len({r["x"] for r in child_runs if r.get("tool") == "probe"}),
    }


# ----------------------------------------------------------------------------- typed turns

OUTPUT_INVALID = "FX_OUTPUT_INVALID"
# Worker diagnostics that may cost a typed turn a model request it asks again.
TYPED_EXCUSES = ("session.takeover", "session.fenced", "transport.error", "transport.retry", "session.deadline",
                 "journal.error")
TYPED_REQUESTS = 2  # a refused answer and its retry


def _tag_of(text: object) -> str:
    return str(text or "").partition(":")[2].partition(":")[0]


def typed_turns(obs: Observation, violations: list[str]) -> dict[str, Any]:
    """Typed turns (`typed:`, see the module doc)."""
    from fxengine.output import FINAL_RESULT_TOOL
    from tests.chaos.bounds import FAULT_SPAN_S, TOUCHING
    from tests.chaos.tooling import TYPED_AGENT, TYPED_RETRIES, TypedAnswer
    from tests.chaos.workload import TYPED_RETRY_PREFIX

    typed_sessions = {a["session"] for a in obs.acks if a.get("agent") == TYPED_AGENT}
    texts = {(a["session"], a["messageId"]): a.get("text") for a in obs.acks}
    valid_sent: dict[str, set[int]] = defaultdict(set)
    invalid_sent: Counter[str] = Counter()
    invalid_retries: Counter[str] = Counter()  # invalid answers to requests that carried the errors (none, scripted)
    for answer in obs.typed_answers:
        if answer.get("valid"):
            valid_sent[answer["tag"]].add(int(answer["n"]))
        else:
            invalid_sent[answer["tag"]] += 1
            invalid_retries[answer["tag"]] += bool(answer.get("retry"))
    probes_run = sorted({r["x"] for r in obs.runs if r.get("tool") == "probe" and str(r.get("name", "")).startswith("t-")})
    for execution_id in probes_run:
        violations.append(f"typed: the probe call {execution_id}, given in the response of a valid final result, ran")
    figures: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    for session_id, lines in sorted(obs.streams.items()):
        typed = session_id in typed_sessions
        by_turn: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for line in lines:
            by_turn[str(line.get("messageId"))].append(line)
        for turn, turn_lines in sorted(by_turn.items()):
            ends = [ln for ln in turn_lines if ln["type"] == "turn_end" and not ln.get("repeated")]
            if not typed:
                if any("output" in ln for ln in ends):
                    violations.append(f"typed: turn {turn} of {session_id} (agent not typed) ended with an output")
                continue
            where = f"turn {turn} of {session_id}"
            start = next((ln for ln in turn_lines if ln["type"] == "turn_start"), None)
            own = _tag_of(texts.get((session_id, turn)) or (start or {}).get("input"))
            steered = [ln for ln in turn_lines if ln["type"] == "user_message"]
            tags = {own} | {_tag_of(ln.get("text")) for ln in steered}
            calls = {ln["id"]: ln for ln in turn_lines if ln["type"] == "tool_start"}
            finals = [(ln, calls.get(ln["id"])) for ln in turn_lines
                      if ln["type"] == "tool_end" and ln.get("name") == FINAL_RESULT_TOOL]
            refused = [end for end, _ in finals if end.get("isError")]
            taken = [(end, call) for end, call in finals if not end.get("isError")]
            figures["refused_stored"] += len(refused)
            most_refused = 1 + sum(invalid_retries[t] for t in tags)
            if len(refused) > most_refused:
                violations.append(f"typed: {where} stores {len(refused)} refused final results, at most "
                                  f"{most_refused} (a retry went without the errors it was given)")
            for end in refused:
                if not str(end.get("content", "")).startswith(f"{TYPED_RETRY_PREFIX} as TypedAnswer:"):
                    violations.append(f"typed: {where}: a refused final result was answered "
                                      f"{str(end.get('content'))[:120]!r}")
            for (first, _), (second, _) in zip(taken, taken[1:]):
                if not any(first["cursor"] < ln["cursor"] < second["cursor"] for ln in steered):
                    violations.append(f"typed: {where} asked for a valid answer again with no steer placed after the "
                                      f"stored one (final results at cursors {first['cursor']} and {second['cursor']})")
            for ln in turn_lines:
                call = calls.get(ln.get("id")) if ln["type"] == "tool_end" and ln.get("name") == "probe" else None
                if call is not None and str((call.get("input") or {}).get("name", "")).startswith("t-"):
                    figures["probes_not_run"] += 1
                    if not str(ln.get("content", "")).startswith("Not run"):
                        violations.append(f"typed: {where}: the probe given with a valid final result was answered "
                                          f"{str(ln.get('content'))[:120]!r}, not 'Not run'")
            if not ends:
                continue
            end = ends[0]
            stop = str(end.get("stopReason"))
            code = (end.get("error") or {}).get("code")
            ended[stop if stop != "error" else f"error {code}"] += 1
            figures["turns"] += 1
            figures["steered"] += bool(steered)
            if stop == "end_turn":
                if "output" not in end:
                    violations.append(f"typed: {where} ended end_turn without an output")
                    continue
                output = end["output"]
                try:
                    answer = TypedAnswer.model_validate(output)
                except ValueError as exc:
                    violations.append(f"typed: {where}: its output {output!r} does not validate as TypedAnswer: "
                                      f"{str(exc)[:200]}")
                    continue
                figures["outputs"] += 1
                if answer.tag not in tags:
                    violations.append(f"typed: {where}: its output names tag {answer.tag}, not its own "
                                      f"({sorted(tags)})")
                elif answer.n not in valid_sent.get(answer.tag, set()):
                    violations.append(f"typed: {where}: its output {output} is no answer the model gave tag {answer.tag}")
                resumed = any(ln["type"] == "turn_resume" for ln in turn_lines)
                if taken and not resumed:
                    last, call = taken[-1]
                    if not any(ln["cursor"] > last["cursor"] for ln in steered) and (call or {}).get("input") != output:
                        violations.append(f"typed: {where}: its output {output} is not its last valid final result "
                                          f"{(call or {}).get('input')}")
            elif code == OUTPUT_INVALID:
                given = sum(invalid_sent[t] for t in tags)
                if given <= TYPED_RETRIES:
                    violations.append(f"typed: {where} ended {OUTPUT_INVALID}, but the model gave it {given} invalid "
                                      f"answer(s), at most {TYPED_RETRIES} refused answers are sent back")
    if figures["turns"] and not figures["outputs"]:
        violations.append(f"run: none of the {figures['turns']} typed turns ended end_turn with an output "
                          f"({dict(ended)})")
    figures.update(_typed_requests(obs, violations, typed_sessions, TOUCHING, FAULT_SPAN_S, TYPED_EXCUSES))
    return {
        "typed_sessions": len(typed_sessions),
        "typed_turns": figures["turns"],
        "typed_ended": dict(ended),
        "typed_outputs": figures["outputs"],
        "typed_steered_turns": figures["steered"],
        "typed_answers_valid": sum(1 for a in obs.typed_answers if a.get("valid")),
        "typed_answers_invalid": sum(1 for a in obs.typed_answers if not a.get("valid")),
        "typed_retries_asked": sum(1 for a in obs.typed_answers if a.get("retry")),
        "typed_refused_stored": figures["refused_stored"],
        "typed_probes_not_run": figures["probes_not_run"],
        "typed_requests_max": figures["requests_max"],
        "typed_kills": sum(1 for f in obs.faults if f["fault"] == "kill" and f.get("typed")),
    }


def _typed_requests(obs: Observation, violations: list[str], typed_sessions: set[str], touching: frozenset[str],
                    span_s: float, excuses: tuple[str, ...]) -> Counter[str]:
    """The model requests of each `typed:<tag>` turn against their bound (see the module doc)."""
    figures: Counter[str] = Counter()
    session_of = {f"s{a['driver']}": a["session"] for a in obs.acks
                  if a.get("driver") is not None and a["session"] in typed_sessions}
    turn_of = {_tag_of(a.get("text")): (a["session"], a["messageId"]) for a in obs.acks
               if a["session"] in typed_sessions and a["input"] == "prompt"}
    asked: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for answer in obs.typed_answers:
        if answer.get("input") == "typed":
            asked[answer["tag"]].append(answer)
    for tag, answers in sorted(asked.items()):
        figures["requests_max"] = max(figures["requests_max"], len(answers))
        if len(answers) <= TYPED_REQUESTS:
            continue
        t0, t1 = min(float(a["t"]) for a in answers), max(float(a["t"]) for a in answers)
        w0, w1 = min(float(a["wall"]) for a in answers), max(float(a["wall"]) for a in answers)
        faults = sum(1 for f in obs.faults if f["fault"] in touching and t0 - span_s <= float(f.get("t", 0.0)) <= t1)
        stalled = sum(1 for a in answers if a.get("stalled"))
        session_id, turn = turn_of.get(tag, (session_of.get(tag.split(".")[0]), None))
        events = sum(1 for e in obs.events if e.get("type") in excuses and e.get("sessionId") == session_id
                     and w0 - span_s <= float(e.get("timestamp") or 0.0) <= w1 + 1.0)
        moved = sum(1 for ln in obs.streams.get(session_id or "", [])
                    if ln["type"] in ("turn_yield", "turn_resume") and ln.get("messageId") == turn)
        bound = TYPED_REQUESTS + 2 * (faults + stalled) + events + moved
        if len(answers) > bound:
            violations.append(f"typed: turn {turn} of {session_id} ({tag}) made {len(answers)} model requests, at "
                              f"most {bound} ({faults} faults near, {stalled} stalled, {events} takeovers, fences, "
                              f"transport errors or cut-offs, {moved} yields and resumes)")
    return figures


# ----------------------------------------------------------------------------- §11.4


def stale_lines(obs: Observation, violations: list[str]) -> dict[str, Any]:
    stale = 0
    for session_id, lines in obs.streams.items():
        head = 0
        for line in lines:
            if line["epoch"] < head:
                stale += 1
                violations.append(f"§11.4 {session_id} stores a line of epoch {line['epoch']} after epoch {head}: "
                                  f"cursor {line['cursor']} {line['type']}")
            head = max(head, line["epoch"])
    return {"stale_lines": stale}


# ----------------------------------------------------------------------------- §11.5


def turn_order(obs: Observation, violations: list[str]) -> dict[str, Any]:
    acked: dict[str, list[str]] = defaultdict(list)
    for ack in obs.acks:
        acked[ack["session"]].append(ack["messageId"])
    overlaps = 0
    for session_id, lines in obs.streams.items():
        started, problems = _turns(lines)
        overlaps += len(problems)
        violations.extend(f"§11.5 {session_id}: {p}" for p in problems)
        if not _is_subsequence(started, acked.get(session_id, [])):
            violations.append(f"§11.5 {session_id}: turns ran in the order {started}, "
                              f"not the acceptance order {acked.get(session_id, [])}")
    return {"overlapping_turns": overlaps}


def _turns(lines: Iterable[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(the inputs in the order their turns began or ended unopened, what broke one-at-a-time)."""
    order: list[str] = []
    problems: list[str] = []
    open_turn: str | None = None
    for line in lines:
        mid = line.get("messageId")
        if line["type"] == "turn_start":
            if open_turn is not None:
                problems.append(f"turn {mid} started at cursor {line['cursor']} while {open_turn} was open")
            if mid in order:
                problems.append(f"input {mid} started a second turn at cursor {line['cursor']}")
            order.append(mid)
            open_turn = mid
        elif line["type"] == "turn_end" and not line.get("repeated"):
            if open_turn not in (None, mid):
                problems.append(f"turn_end of {mid} at cursor {line['cursor']} while {open_turn} was open")
            if open_turn is None and mid not in order:
                order.append(mid)  # an input ended without a turn (a poison input)
            open_turn = None
    return order, problems


def _is_subsequence(items: list[str], of: list[str]) -> bool:
    rest: Iterator[str] = iter(of)
    return all(any(x == y for y in rest) for x in items)


# ----------------------------------------------------------------------------- §11.6


def cutoffs(obs: Observation, violations: list[str]) -> dict[str, Any]:
    deadlines = [e for e in obs.events if e.get("type") == "session.deadline"]
    for e in deadlines:
        if int(e.get("cutoffs") or 0) > MAX_CUTOFFS:
            violations.append(f"§11.6 {e.get('sessionId')} was cut off {e['cutoffs']} times in a row")
    ended = sum(1 for lines in obs.streams.values() for ln in lines
                if ln["type"] == "turn_end" and (ln.get("error") or {}).get("code") == "FX_DEADLINE_CUTOFFS")
    return {"cutoffs": len(deadlines), "max_cutoffs_in_a_row": max((int(e.get("cutoffs") or 0) for e in deadlines),
                                                                    default=0),
            "turns_ended_by_cutoffs": ended}


# ----------------------------------------------------------------------------- §11.7


def readers(obs: Observation, violations: list[str]) -> dict[str, Any]:
    checked = 0
    for session_id, lines in obs.streams.items():
        cursors = [ln["cursor"] for ln in lines]
        if cursors != list(range(1, len(lines) + 1)):
            violations.append(f"§11.7 {session_id}: stored cursors are not 1..{len(lines)} in order")
    for session_id, seen in obs.readers.items():
        stored = obs.streams.get(session_id, [])
        problem = _reader_problem(seen, stored)
        if problem:
            violations.append(f"§11.7 the reader of {session_id} {problem}")
        checked += len(seen)
    return {"reader_lines": checked, "reader_connections": obs.reader_connections}


def _reader_problem(seen: list[dict[str, Any]], stored: list[dict[str, Any]]) -> str | None:
    for i, line in enumerate(seen):
        if line.get("cursor") != i + 1:
            return f"was sent cursor {line.get('cursor')} where {i + 1} was next (a line lost, repeated or reordered)"
        if i >= len(stored) or line != stored[i]:
            return f"was sent a line at cursor {i + 1} the store does not hold: {line}"
    if len(seen) != len(stored):
        return f"ended at cursor {len(seen)} of {len(stored)} stored"
    return None


# ----------------------------------------------------------------------------- §11.8


def credentials(obs: Observation, violations: list[str]) -> dict[str, Any]:
    for where in obs.key_hits:
        violations.append(f"§11.8 the API key is stored in Redis: {where}")
    if obs.keyed_requests == 0:
        violations.append("§11.8 no model request carried the API key: the scan proves nothing")
    return {"key_found": len(obs.key_hits), "keyed_model_requests": obs.keyed_requests}


# ----------------------------------------------------------------------------- the run itself


def worker_exits(obs: Observation, violations: list[str]) -> dict[str, Any]:
    for e in obs.worker_exits:
        lines = [ln for ln in str(e.get("log") or "").splitlines() if ln.strip()]
        critical = [ln for ln in lines if "CRITICAL" in ln]
        why = f"its log says: {critical[-1][:300]}" if critical else f"its log ends: {lines[-1][:300] if lines else ''}"
        violations.append(f"run: worker pid {e['pid']} exited (code {e.get('code')}) with no fault stopping it; {why}")
    return {"worker_exits": len(obs.worker_exits)}


def poisoned(obs: Observation) -> list[dict[str, Any]]:
    """The poison messages the nemesis pushed (`queue`, `kind`, `variant`, `marker`)."""
    return [m for f in obs.faults if f["fault"] == "poison" for m in f.get("messages", [])]


def dead_letters(obs: Observation, violations: list[str]) -> dict[str, Any]:
    pushed = poisoned(obs)
    marks = [m["marker"] for m in pushed]
    dead = 0
    for m in pushed:
        # A marker ends in its number: followed by a digit it is another marker's prefix.
        found = any(_holds(entry, m["marker"]) for entry in obs.dead_letters)
        dead += found
        if any(_holds(entry, m["marker"]) for entry in obs.queued):
            violations.append(f"run: poison message {m['marker']} ({m['kind']}, {m['variant']}) "
                              f"is still in {m['queue']}")
        elif not found and m["kind"] in UNDECODABLE:
            violations.append(f"run: poison message {m['marker']} ({m['kind']}, {m['variant']}) "
                              "is not in the dead-letter list")
    others = [e for e in obs.dead_letters if not any(_holds(e, mark) for mark in marks)]
    for entry in others[:10]:
        violations.append(f"run: the dead-letter list holds a message no fault pushed: {entry[:300]}")
    return {"poison_messages": len(pushed), "poison_dead_lettered": dead, "dead_letters": len(obs.dead_letters)}


def _holds(entry: str, mark: str) -> bool:
    at = entry.find(mark)
    while at >= 0:
        end = at + len(mark)
        if end >= len(entry) or not entry[end].isdigit():
            return True
        at = entry.find(mark, at + 1)
    return False


# ----------------------------------------------------------------------------- figures


def fault_kinds(cluster: bool) -> tuple[str, ...]:
    """The fault kinds a run on this store counts (and, with every kind scheduled, applies)."""
    return CLUSTER_FAULT_KINDS if cluster else FAULT_KINDS


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def counts(obs: Observation) -> dict[str, Any]:
    lines = [ln for stream in obs.streams.values() for ln in stream]
    ends = [ln for ln in lines if ln["type"] == "turn_end" and not ln.get("repeated")]
    events = Counter(e.get("type") for e in obs.events)
    faults = Counter(f["fault"] for f in obs.faults)
    figures: dict[str, Any] = {
        "sessions": len(obs.streams),
        "prompts": sum(1 for a in obs.acks if a["input"] == "prompt"),
        "steers": sum(1 for a in obs.acks if a["input"] == "steer"),
        "unacknowledged": len(obs.unacked),
        "refused": len(obs.refused),
        "turns": len(ends),
        "stop_reasons": dict(Counter(ln.get("stopReason") for ln in ends)),
        "lines": len(lines),
        "yields": sum(1 for ln in lines if ln["type"] == "turn_yield"),
        "resumes": sum(1 for ln in lines if ln["type"] == "turn_resume"),
        "takeovers": events["session.takeover"],
        "fenced": events["session.fenced"],
        "tool_reruns": events["tool.rerun"],
        "faults": {kind: faults[kind] for kind in fault_kinds(obs.cluster)},
        "oom_replies": sum(int(f.get("oom_replies") or 0) for f in obs.faults if f["fault"] == "restored"),
        "retried": dict(Counter(f"{r.get('status')} {r.get('code') or '-'}" for r in obs.retried)),
        "stalled_requests": len(obs.stalls),
        "model_timeouts": sum(1 for e in obs.events
                              if e.get("type") == "transport.error" and e.get("error") == "FX_PROVIDER_TIMEOUT"),
        "model_timeouts_retried": sum(1 for e in obs.events
                                      if e.get("type") == "transport.retry" and e.get("error") == "FX_PROVIDER_TIMEOUT"),
        "provider_timeouts": sum(1 for ln in ends
                                 if (ln.get("error") or {}).get("code") == "FX_PROVIDER_TIMEOUT"),
    }
    taken = [(e.get("sessionId"), int(e.get("epoch") or 0)) for e in obs.events if e.get("type") == "session.takeover"]
    for fault in ("kill", "stop"):
        times = [r["seconds"] for r in obs.recoveries if r["fault"] == fault and _took_over(r, taken)]
        figures[f"recover_{fault}_n"] = len(times)
        figures[f"recover_{fault}_p50_s"] = percentile(times, 50)
        figures[f"recover_{fault}_p99_s"] = percentile(times, 99)
        figures[f"recover_{fault}_max_s"] = max(times, default=None)
        figures[f"recover_{fault}_unresolved"] = sum(1 for r in obs.recoveries
                                                     if r["fault"] == fault and r["seconds"] is None)
    if obs.cluster:
        figures.update(failovers(obs))
    return figures


def failovers(obs: Observation) -> dict[str, Any]:
    """Primaries killed, the seconds until a replica served their slots, and until the
    restarted node was an online replica again (replica-acknowledged writes accepted); the
    failovers forced back to a rejoined node (a flap) and the longest of them."""
    failover = [float(f["failover_s"]) for f in obs.faults if f["fault"] == "primary"]
    rejoin = [float(f["rejoin_s"]) for f in obs.faults if f["fault"] == "rejoined"]
    failback = [float(f["failback_s"]) for f in obs.faults if f["fault"] == "failed_back"]
    return {"primaries_killed": len(failover), "failover_p50_s": percentile(failover, 50),
            "failover_max_s": max(failover, default=None), "rejoin_p50_s": percentile(rejoin, 50),
            "rejoin_max_s": max(rejoin, default=None), "failed_back": len(failback),
            "failback_max_s": max(failback, default=None)}


def _took_over(recovery: dict[str, Any], taken: list[tuple[Any, int]]) -> bool:
    """True when the recovery's newer epoch came from a takeover of the session's dead lease
    (not from a live holder's release and a new claim)."""
    if recovery["seconds"] is None:
        return False
    low, high = recovery["epoch"], recovery.get("new_epoch") or 0
    return any(s == recovery["session"] and low < e <= high for s, e in taken)
