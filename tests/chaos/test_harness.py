"""The chaos harness end to end (`python -m tests.chaos.run`), as a subprocess.

A short seeded schedule passes with every kind of fault applied at least once (also on a
Redis Cluster store, where the nemesis kills primaries), and the same harness fails, naming §11.2 and the seed, when the workers run with the test-only
switch that starts each non-idempotent call twice (the checker is shown to catch a fault).
The checker's rules are also run on small hand-made histories (the rules of parked calls
and their decisions, of delegated turns and of typed turns among them), and the nemesis's poison
messages and model stalls are checked to be what they claim.
"""

from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from fxengine.testing import Reply, delay, text, tool_call
from fxengine.testing.script import Delay, Text, ToolCall
from tests.chaos import poison, wakes
from tests.chaos.checker import CLUSTER_FAULT_KINDS, FAULT_KINDS, Observation, check
from tests.chaos.system import QUEUES
from tests.chaos.workload import Stall
from tests.support.workers import ROOT

RUN_TIMEOUT_S = 240


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = subprocess.run([sys.executable, "-m", "tests.chaos.run", "--out", str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    found = sorted(tmp_path.glob("chaos-*.json"))
    assert found, f"no result file: {proc.stdout[-3000:]} {proc.stderr[-3000:]}"
    return proc, json.loads(found[0].read_text())


@pytest.mark.slow
@pytest.mark.celery
@pytest.mark.redis
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_short_seeded_schedule_applies_every_fault_and_passes(tmp_path: Path) -> None:
    proc, result = _run(tmp_path, "--duration", "25", "--seed", "11", "--sessions", "5", "--workers", "2",
                        "--gap", "1.5", "3", "--no-slow")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert result["passed"] and result["violations"] == []
    figures = result["figures"]
    assert all(figures["faults"][kind] >= 1 for kind in FAULT_KINDS), figures["faults"]
    assert figures["prompts"] > 0 and figures["turns"] >= figures["prompts"]
    assert figures["effect_calls"] > 0 and figures["reader_lines"] == figures["lines"]
    assert figures["worker_exits"] == 0
    assert figures["poison_messages"] == len(poison.KINDS) * len(QUEUES) * figures["faults"]["poison"]
    assert figures["refund_calls_decided"] > 0 and figures["decisions_refused"], figures
    assert figures["delegated_calls"] > 0 and figures["child_sessions"] > 0, figures
    assert figures["typed_outputs"] > 0 and figures["typed_refused_stored"] > 0, figures
    assert "chaos: passed (seed 11)" in proc.stdout


@pytest.mark.slow
@pytest.mark.celery
@pytest.mark.redis
@pytest.mark.cluster
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_short_schedule_on_a_cluster_store_kills_a_primary_and_passes(tmp_path: Path) -> None:
    proc, result = _run(tmp_path, "--cluster", "--duration", "25", "--seed", "13", "--sessions", "5",
                        "--workers", "2", "--gap", "1.5", "3", "--no-slow")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert result["passed"] and result["violations"] == [] and result["settings"]["cluster"]
    figures = result["figures"]
    assert all(figures["faults"][kind] >= 1 for kind in CLUSTER_FAULT_KINDS), figures["faults"]
    assert figures["faults_not_applied"] == 0
    assert figures["primaries_killed"] == figures["faults"]["primary"] and figures["failover_max_s"] > 0
    assert figures["failed_back"] == (figures["primaries_killed"] + 1) // 2  # the first flaps
    assert figures["prompts"] > 0 and figures["reader_lines"] == figures["lines"]
    assert "chaos: passed (seed 13)" in proc.stdout


@pytest.mark.slow
@pytest.mark.celery
@pytest.mark.redis
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_planted_duplicate_effect_fails_the_check_and_prints_the_seed(tmp_path: Path) -> None:
    proc, result = _run(tmp_path, "--duration", "12", "--seed", "5", "--sessions", "3", "--workers", "1",
                        "--no-faults", "--no-slow", "--plant", "duplicate-effects")
    assert proc.returncode == 1
    assert not result["passed"]
    assert result["figures"]["duplicated_effects"] >= 1
    assert any(v.startswith("§11.2 ") for v in result["violations"]), result["violations"]
    assert "--seed 5" in proc.stdout


# ----------------------------------------------------------------------------- the rules alone


def _line(cursor: int, kind: str, epoch: int = 1, **fields: object) -> dict:
    return {"type": kind, "cursor": cursor, "epoch": epoch, **fields}


def _observation(lines: list[dict], **overrides: object) -> Observation:
    base = dict(seed=0, acks=[{"session": "s", "input": "prompt", "messageId": "a"}], streams={"s": lines},
                readers={"s": list(lines)}, runs=[], events=[], keyed_requests=1)
    base.update(overrides)
    return Observation(**base)  # type: ignore[arg-type]


GOOD = [_line(1, "turn_start", messageId="a"), _line(2, "text_delta", delta="x"),
        _line(3, "turn_end", messageId="a", stopReason="end_turn")]


def test_a_clean_history_passes() -> None:
    assert check(_observation(GOOD)).violations == []


def test_each_rule_names_its_invariant() -> None:
    stale = [GOOD[0], _line(2, "text_delta", epoch=2), _line(3, "text_delta", epoch=1),
             _line(4, "turn_end", epoch=2, messageId="a", stopReason="end_turn")]
    cases = {
        "§11.1": _observation(GOOD[:2]),
        "§11.2": _observation(GOOD, runs=[{"tool": "effect", "x": "c", "token": t, "intent": True} for t in "12"]),
        "§11.3": _observation(GOOD, runs=[{"tool": "effect", "x": "c", "token": "1", "intent": False}]),
        "§11.4": _observation(stale, readers={"s": stale}),
        "§11.5": _observation([_line(1, "turn_start", messageId="a"), _line(2, "turn_start", messageId="b"),
                               _line(3, "turn_end", messageId="b"), _line(4, "turn_end", messageId="a")]),
        "§11.6": _observation(GOOD, events=[{"type": "session.deadline", "cutoffs": 4}]),
        "§11.7": _observation(GOOD, readers={"s": [GOOD[0], GOOD[2]]}),
        "§11.8": _observation(GOOD, key_hits=["fx:{s}:meta"]),
    }
    for rule, obs in cases.items():
        violations = check(obs).violations
        assert violations and all(v.startswith(rule) for v in violations), (rule, violations)


def _only(rule: str, obs: Observation) -> list[str]:
    """The violations of `obs`, each asserted to be of `rule` (and at least one)."""
    violations = check(obs).violations
    assert violations and all(v.startswith(rule) for v in violations), (rule, violations)
    return violations


def test_an_input_that_ends_twice_fails_once_per_input() -> None:
    twice = [*GOOD, _line(4, "turn_end", messageId="a", stopReason="cancelled")]
    assert _only("§11.1", _observation(twice)) == ["§11.1 acknowledged prompt a of s ended 2 times"]
    replayed = [*GOOD, _line(4, "turn_end", messageId="a", stopReason="end_turn", repeated=True)]
    assert check(_observation(replayed)).violations == []


def test_a_session_storing_lines_past_its_inputs_bound_fails() -> None:
    # one prompt: at most 17 + 2 lines, no yield, no fault
    chatty = [GOOD[0], *(_line(c, "text_delta", delta="x") for c in range(2, 20)), _line(20, "turn_end", messageId="a")]
    assert "stored 20 lines, at most 19" in _only("bound:", _observation(chatty))[0]
    assert check(_observation(chatty[:18] + [_line(19, "turn_end", messageId="a")])).violations == []


def test_a_session_looping_on_a_cancel_fails_its_epoch_bound() -> None:
    cancel = [{"kind": "cancel", "session": "s", "t": 1.0}]
    # a prompt and a cancel: at most 1 + 1 + 2 claims
    assert check(_observation(GOOD, callers=cancel, epochs={"s": 4})).violations == []
    violations = _only("bound:", _observation(GOOD, callers=cancel, epochs={"s": 300}))
    assert violations == ["bound: s is at epoch 300, at most 4 (1 prompts, 0 steers, 1 cancels, 0 decisions, 0 yields, "
                          "0 faults in its window): claims without progress"]


def test_faults_count_toward_a_session_only_within_its_window() -> None:
    acks = [{"session": "s", "input": "prompt", "messageId": "a", "t": 10.0}]
    inside, after = {"fault": "kill", "t": 12.0}, {"fault": "kill", "t": 40.0}
    follow_up = {"fault": "replacement", "t": 12.5}
    window = dict(acks=acks, ended_at={"s": 20.0}, epochs={"s": 6})
    assert check(_observation(GOOD, faults=[inside, follow_up, after], **window)).violations == []  # 1 + 3 + 2
    # the kill after its last turn_end, and the follow-up of the one inside, count for nothing
    assert _only("bound:", _observation(GOOD, faults=[after, follow_up], **window)) == [
        "bound: s is at epoch 6, at most 3 (1 prompts, 0 steers, 0 cancels, 0 decisions, 0 yields, 0 faults in its window): "
        "claims without progress"]


def test_yields_are_bounded_by_the_time_a_session_ran() -> None:
    yielding = [GOOD[0], *(_line(c, "turn_yield", messageId="a") for c in range(2, 6)), _line(6, "turn_end", messageId="a")]
    acks = [{"session": "s", "input": "prompt", "messageId": "a", "t": 0.0}]
    slow = dict(acks=acks, epochs={"s": 5})
    assert check(_observation(yielding, ended_at={"s": 40.0}, **slow)).violations == []  # 40 s: up to 5 + 1
    assert "yielded 4 times in 10.0 s, at most 2" in _only("bound:", _observation(yielding, ended_at={"s": 10.0},
                                                                                  **slow))[0]


def test_a_turn_that_keeps_starting_calls_fails() -> None:
    starts = [_line(c, "tool_start", messageId="a", id=f"call_{c}") for c in range(2, 10)]
    looping = [GOOD[0], *starts, _line(10, "turn_end", messageId="a", stopReason="cancelled")]
    assert _only("bound:", _observation(looping)) == ["bound: turn a of s started 8 tool calls, at most 6 (0 resumes)"]
    resumed = [GOOD[0], *starts, _line(10, "turn_resume", messageId="a"), _line(11, "turn_end", messageId="a")]
    assert check(_observation(resumed, epochs={"s": 1})).violations == []  # a resume may redo 2


def test_more_than_one_queued_wake_of_a_session_fails() -> None:
    wakes = [{"kind": "wakes", "t": 3.0, "queued": {"s": 3}}, {"kind": "wakes", "t": 4.0, "queued": {"s": 2}},
             {"kind": "wakes_final", "t": 9.0, "queued": {"s": 1}}]
    assert _only("bound:", _observation(GOOD, wakes=wakes)) == ["bound: 3 wakes of s queued at once at 3.0 s, at most 1"]
    assert check(_observation(GOOD, wakes=wakes[2:])).violations == []


def _ghost(*, no_worker: bool, code: str = "FX_NO_AGENT", stop: str = "error") -> Observation:
    lines = [_line(1, "turn_end", messageId="a", stopReason=stop, error={"code": code})]
    callers = [{"kind": "caller", "action": "ghost", "session": "s"},
               {"kind": "ghost", "session": "s", "statuses": {"waiting": 30, "idle": 1},
                "no_worker": {"agent": "ghost", "sinceMs": 1} if no_worker else None}]
    return _observation(lines, callers=callers)


def test_a_session_of_the_agent_no_worker_runs_shows_no_worker_and_ends_fx_no_agent() -> None:
    assert check(_ghost(no_worker=True)).violations == [
        "run: the caller action cancel_early never happened", "run: the caller action storm never happened",
        "run: the caller action cancel_parked never happened"]
    ghost_rules = [v for v in check(_ghost(no_worker=False)).violations if not v.startswith("run:")]
    assert ghost_rules == ["§7 s (agent ghost, no worker runs it) never showed noWorker while it waited "
                           "(states read: {'waiting': 30, 'idle': 1})"]
    ghost_rules = [v for v in check(_ghost(no_worker=True, code="FX_TURN_FAILED")).violations if not v.startswith("run:")]
    assert ghost_rules == ["§7 prompt a of s (agent ghost) ended error FX_TURN_FAILED, not error FX_NO_AGENT"]
    never = _ghost(no_worker=True)
    never.streams["s"] = []
    assert any(v == "§7 prompt a of s (agent ghost) never ended, not error FX_NO_AGENT" for v in check(never).violations)


def _callers(*, before_claim: bool, stop: str = "cancelled", stormed: bool = True) -> Observation:
    lines = [_line(1, "turn_start", messageId="a"), _line(2, "turn_end", messageId="a", stopReason=stop)]
    callers = [{"kind": "caller", "action": "cancel_early", "session": "s", "messageId": "a", "held": True,
                "epoch": 0 if before_claim else 1, "before_claim": before_claim},
               {"kind": "cancel", "session": "s"},
               {"kind": "caller", "action": "storm", "driver": 0, "kinds": ["steer", "cancel"]},
               {"kind": "caller", "action": "ghost", "session": "g"},
               {"kind": "ghost", "session": "g", "no_worker": {"agent": "ghost"}},
               {"kind": "caller", "action": "cancel_parked", "session": "d", "messageId": "a", "status": "paused"}]
    if stormed:
        callers.append({"kind": "storm", "session": "t", "kinds": ["steer", "cancel"]})
    return _observation(lines, callers=callers)


def test_a_cancel_before_any_claim_must_happen_and_end_its_prompt_cancelled() -> None:
    assert check(_callers(before_claim=True)).violations == []
    assert check(_callers(before_claim=True)).figures["cancels_before_claim"] == 1
    assert _only("run:", _callers(before_claim=False)) == ["run: no cancel was stored before a worker claimed its prompt"]
    assert _only("§6", _callers(before_claim=True, stop="end_turn")) == [
        "§6 prompt a of s, cancelled before any worker claimed it, ended end_turn"]
    assert _only("run:", _callers(before_claim=True, stormed=False)) == [
        "run: no driver sent a storm of steers and cancels the callers asked for"]


def test_wakes_are_read_from_kombu_messages_and_poison_is_skipped() -> None:
    body = json.dumps([[{"sessionId": "fxs_1", "agent": "default", "reason": "prompt"}], {}, {}])
    wake = json.dumps(poison.envelope("m", base64.b64encode(body.encode()).decode())).encode()
    raws = [wake, wake, poison.message("garbage", "x", random.Random(1))[0],
            poison.message("wake", "y", random.Random(2))[0]]
    assert wakes.count_queued(raws) == {"fxs_1": 2}


def test_primary_kills_are_counted_only_on_a_cluster_store() -> None:
    faults = [{"fault": "primary", "failover_s": 4.0}, {"fault": "rejoined", "rejoin_s": 2.5},
              {"fault": "failed_back", "failback_s": 5.0},
              {"fault": "primary", "failover_s": 6.0}, {"fault": "rejoined", "rejoin_s": 3.5}]
    standalone = check(_observation(GOOD, faults=faults)).figures
    assert tuple(standalone["faults"]) == FAULT_KINDS and "primaries_killed" not in standalone
    cluster = check(_observation(GOOD, faults=faults, cluster=True))
    assert cluster.violations == []
    assert tuple(cluster.figures["faults"]) == CLUSTER_FAULT_KINDS and cluster.figures["faults"]["primary"] == 2
    assert (cluster.figures["primaries_killed"], cluster.figures["failover_p50_s"], cluster.figures["failover_max_s"],
            cluster.figures["rejoin_max_s"]) == (2, 4.0, 6.0, 3.5)
    assert (cluster.figures["failed_back"], cluster.figures["failback_max_s"]) == (1, 5.0)


def test_a_resent_push_of_one_start_is_not_a_duplicate() -> None:
    runs = [{"tool": "effect", "x": "c", "token": "1", "intent": True}] * 2
    assert check(_observation(GOOD, runs=runs)).violations == []


def test_a_worker_that_exited_unprompted_fails_the_run() -> None:
    exits = [{"pid": 7, "code": 1, "log": "...\nCRITICAL Unrecoverable error: JSONDecodeError\nTraceback\n"},
             {"pid": 8, "code": -9, "log": "ready\n"}]
    violations = check(_observation(GOOD, worker_exits=exits)).violations
    assert violations == ["run: worker pid 7 exited (code 1) with no fault stopping it; "
                          "its log says: CRITICAL Unrecoverable error: JSONDecodeError",
                          "run: worker pid 8 exited (code -9) with no fault stopping it; its log ends: ready"]


def _poisoned(*kinds: str) -> list[dict]:
    messages = [{"queue": "q", "kind": k, "variant": "v", "marker": poison.marker(0, n)}
                for n, k in enumerate(kinds, 1)]
    return [{"fault": "poison", "messages": messages}]


def test_each_undecodable_poison_message_must_be_dead_lettered_and_none_left_queued() -> None:
    faults = _poisoned("garbage", "json", "base64", "wake")
    dead = [f'{{"queue": "q", "raw": "{poison.marker(0, n)}"}}' for n in (1, 2, 3)]
    assert check(_observation(GOOD, faults=faults, dead_letters=dead)).violations == []
    # chaos-poison-0-1 is not chaos-poison-0-12's prefix
    many = _poisoned(*(["garbage"] * 12))
    violations = check(_observation(GOOD, faults=many, dead_letters=[poison.marker(0, 12)])).violations
    assert len(violations) == 11 and all("not in the dead-letter list" in v for v in violations), violations
    violations = check(_observation(GOOD, faults=faults, dead_letters=dead[:2] + ["someone else's"],
                                    queued=[poison.marker(0, 4)])).violations
    assert violations == ["run: poison message chaos-poison-0-3 (base64, v) is not in the dead-letter list",
                          "run: poison message chaos-poison-0-4 (wake, v) is still in q",
                          "run: the dead-letter list holds a message no fault pushed: someone else's"]


def test_each_poison_message_is_what_its_kind_says() -> None:
    rng = random.Random(3)
    for n in range(40):
        kind = poison.KINDS[n % len(poison.KINDS)]
        mark = poison.marker(3, n)
        raw, variant = poison.message(kind, mark, rng)
        assert mark.encode() in raw
        if kind == "garbage":
            with pytest.raises(ValueError):
                json.loads(raw)
            continue
        decoded = json.loads(raw)
        if kind == "json":
            assert not (isinstance(decoded, dict) and {"body", "properties"} <= decoded.keys()), decoded
            continue
        assert decoded["headers"]["task"] == "fxworker.wake" and decoded["properties"]["body_encoding"] == "base64"
        if kind == "base64":
            assert not poison.decodes_as_base64(decoded["body"])
            continue
        args, kwargs, _ = json.loads(base64.b64decode(decoded["body"]))
        assert kwargs == {}
        if variant == "not-a-dict":
            assert args == [mark]
        elif variant == "session-not-a-string":
            assert not isinstance(args[0]["sessionId"], str)
        else:
            assert len(args) == 2


def test_a_stall_goes_silent_before_the_first_chunk_or_after_one() -> None:
    echo = Reply(delay(10), text("echo ", "tag"), chunk_delay_ms=5)
    assert Stall("before", 5000).into(echo).parts == (Delay(10), Delay(5000), Text(("echo ", "tag")))
    stalled = Stall("after", 5000).into(echo)
    assert stalled.parts == (Delay(10), Text(("echo ",)), Delay(5000), Text(("tag",)))
    assert stalled.chunk_delay_ms == 5
    call = tool_call("c", "probe", {})
    stalled = Stall("after", 5000).into(Reply(delay(10), call))
    assert stalled.parts == (Delay(10), Text(("thinking ",)), Delay(5000), call)


@pytest.mark.redis
async def test_a_start_finds_its_intent_in_the_log_at_rest_or_in_the_checkpoint(redis_url: str, key_prefix: str) -> None:
    """A worker that lost its lease may start a call after the session went to rest: the
    intent its start looks up is then in `rest`, not in the log (§11.3 counts on it)."""
    import redis.asyncio as aioredis

    from fxworker.ids import new_session_id
    from fxworker.keys import session_keys
    from fxworker.store import redis_store
    from tests.chaos import tooling

    client = aioredis.Redis.from_url(redis_url)
    store = redis_store(redis_url, prefix=key_prefix)
    session_id = new_session_id()
    keys = session_keys(key_prefix, session_id)
    call = f"{session_id}:m-1:1:call_0de369936c"
    try:
        await client.hset(keys.meta, "agent", "default")
        assert not await tooling._intent_stored(call, store)
        await client.xadd(keys.log, {"d": b"..call_0de369936c..", "e": 1}, id="1-0")
        assert await tooling._intent_stored(call, store)
        await client.delete(keys.log)
        await client.set(keys.rest, b"1:1" + b"19:..call_0de369936c.." + b"1:1")
        assert await tooling._intent_stored(call, store)
        await client.delete(keys.rest)
        await client.hset(keys.ckpt, mapping={"data": b"..call_0de369936c..", "through": 1})
        assert await tooling._intent_stored(call, store)
        await client.delete(keys.ckpt)
        assert not await tooling._intent_stored(call, store)
    finally:
        await store.aclose()
        await client.aclose()


# ----------------------------------------------------------------------------- parked calls

PARKED = [_line(1, "turn_start", messageId="a"), {**_line(2, "approval_request", id="c1", messageId="a"), "kind": "approval"},
          _line(3, "turn_pause", messageId="a"), _line(4, "turn_resume", epoch=2, messageId="a"),
          _line(5, "approval_decision", epoch=2, id="c1", decision="approve", messageId="a"),
          _line(6, "tool_start", epoch=2, id="c1", messageId="a"), _line(7, "tool_end", epoch=2, id="c1", messageId="a"),
          _line(8, "turn_end", epoch=2, messageId="a", stopReason="end_turn")]
REFUND = {"tool": "refund", "x": "s:a:1:c1", "token": "1", "intent": True}


def _decision(how: str, mid: str, status: int | None = 202, code: str | None = None, **fields: object) -> dict:
    return {"session": "s", "call": "c1", "turn": "a", "mode": "race", "type": how, "messageId": mid, "web": "a",
            "status": status, "code": code, "repeated": False, **fields}


def _parked(lines: list[dict] = PARKED, **overrides: object) -> Observation:
    return _observation(lines, **{"readers": {"s": list(lines)}, "epochs": {"s": 2}, **overrides})


def test_a_call_decided_once_and_run_once_passes() -> None:
    race = [_decision("approve", "m1"), _decision("deny", "m2", 409, "FX_DECISION_REPEATED", web="b"),
            _decision("approve", "m1", repeated=True, web="b"),
            _decision("deny", "m3", 409, "FX_DECISION_UNKNOWN_CALL")]
    verdict = check(_parked(runs=[REFUND], decisions=race))
    assert verdict.violations == []
    assert verdict.figures["refund_calls_started"] == 1 and verdict.figures["decisions_accepted"] == 1


def test_each_broken_decision_rule_fails() -> None:
    approve = _decision("approve", "m1")
    cancelled = [*PARKED[:3], _line(4, "turn_end", messageId="a", stopReason="cancelled")]
    cases = {
        "started twice": _parked(runs=[REFUND, {**REFUND, "token": "2"}], decisions=[approve]),
        "no approval": _parked(runs=[REFUND], decisions=[]),
        "denied": _parked(runs=[REFUND], decisions=[_decision("deny", "m1")]),
        "two accepted": _parked(runs=[REFUND], decisions=[approve, _decision("approve", "m2", web="b")]),
        "none accepted": _parked(decisions=[_decision("approve", "m1", 409, "FX_DECISION_UNKNOWN_CALL")]),
        "unknown while open": _parked(PARKED[:3], acks=[], decisions=[_decision("approve", "m1", 409,
                                                                                "FX_DECISION_UNKNOWN_CALL")]),
        "other code": _parked(runs=[REFUND], decisions=[approve, _decision("deny", "m2", 409, "FX_DECISION_INVALID")]),
    }
    for name, obs in cases.items():
        violations = check(obs).violations
        assert violations and any(v.startswith("approval:") for v in violations), (name, violations)
    assert check(_parked(cancelled, decisions=[_decision("approve", "m1", 409, "FX_DECISION_UNKNOWN_CALL")],
                         epochs={"s": 1})).violations == []


# ----------------------------------------------------------------------------- delegated turns

CHILD = "sess_CHILD"


def _delegating(parent_stop: str = "end_turn", *, start: bool = True, end: str | None = "end_turn") -> list[dict]:
    lines = [_line(1, "turn_start", messageId="a"),
             {**_line(2, "approval_request", id="c1", name="delegate", messageId="a"), "kind": "external"},
             _line(3, "turn_pause", messageId="a")]
    if start:
        lines.append(_line(4, "delegate_start", callId="c1", sessionId=CHILD, agent="default",
                           childMessageId="dlg_1", depth=1, messageId="a"))
    if end is not None:
        lines += [_line(len(lines) + 1, "turn_resume", epoch=2, messageId="a"),
                  _line(len(lines) + 2, "delegate_end", epoch=2, callId="c1", sessionId=CHILD, agent="default",
                        stopReason=end, usage={}, messageId="a")]
    if parent_stop:
        lines.append(_line(len(lines) + 1, "turn_end", epoch=2, messageId="a", stopReason=parent_stop))
    return lines


def _child(stop: str | None = "end_turn", *, starts: int = 1) -> list[dict]:
    lines = [_line(n + 1, "turn_start", messageId="dlg_1") for n in range(starts)]
    if stop is not None:
        lines.append(_line(len(lines) + 1, "turn_end", messageId="dlg_1", stopReason=stop))
    return lines


def _delegated(parent: list[dict], child: list[dict] | None = None, **overrides: object) -> Observation:
    return _observation(parent, **{"readers": {"s": list(parent)}, "epochs": {"s": 2},
                                   "children": {CHILD: _child() if child is None else child}, **overrides})


def test_a_delegated_call_answered_once_by_its_child_passes() -> None:
    verdict = check(_delegated(_delegating()))
    assert verdict.violations == []
    assert verdict.figures["delegated_calls"] == 1 and verdict.figures["children_ended"] == {"end_turn": 1}
    cancelled = _delegating("cancelled", end=None)
    assert check(_delegated(cancelled, _child("cancelled"))).violations == []


def test_each_broken_delegation_rule_fails() -> None:
    cases = {
        "no delegate_start": _delegated(_delegating(start=False)),
        "no delegate_end": _delegated(_delegating(end=None)),
        "other stop reason": _delegated(_delegating(end="error")),
        "child ended twice": _delegated(_delegating(), [*_child(), _line(3, "turn_end", messageId="dlg_1",
                                                                         stopReason="end_turn")]),
        "child started twice": _delegated(_delegating(), _child(starts=2)),
        "child never stored": _delegated(_delegating(), []),
        "parent left open": _delegated(_delegating("", end=None), acks=[]),
    }
    for name, obs in cases.items():
        violations = check(obs).violations
        assert violations and any(v.startswith("delegation:") for v in violations), (name, violations)


# ----------------------------------------------------------------------------- typed turns

REFUSAL = 'The arguments did not validate as TypedAnswer: [{"type": "missing", "loc": ["n"]}]\nFix the errors.'


def _final(cursor: int, call: str, args: dict, *, ok: bool = True, turn: str = "a") -> list[dict]:
    return [_line(cursor, "tool_start", id=call, name="final_result", input=args, step=1, messageId=turn),
            _line(cursor + 1, "tool_end", id=call, name="final_result", isError=not ok, step=1, messageId=turn,
                  content="Final result taken." if ok else REFUSAL)]


def _typed_turn(*, output: object = None, stop: str = "end_turn", refused: int = 1, probe: bool = True,
                **end: object) -> list[dict]:
    lines = [_line(1, "turn_start", messageId="a", input="typed:s1g0.0")]
    for k in range(refused):
        lines += _final(len(lines) + 1, f"r{k}", {"tag": "s1g0.0"}, ok=False)
    lines += _final(len(lines) + 1, "v", {"tag": "s1g0.0", "n": 7})
    if probe:
        lines += [_line(len(lines) + 1, "tool_start", id="p", name="probe", input={"name": "t-s1g0.0"}, messageId="a"),
                  _line(len(lines) + 2, "tool_end", id="p", name="probe", isError=False, messageId="a",
                        content="Not run: the final result was given in the same response.")]
    if output is not None:
        end["output"] = output
    lines.append(_line(len(lines) + 1, "turn_end", messageId="a", stopReason=stop, **end))
    return lines


TYPED_ACK = {"session": "s", "input": "prompt", "messageId": "a", "text": "typed:s1g0.0", "agent": "typed",
             "driver": "1g0", "t": 1.0}


def _answer(n: int | None, *, t: float = 1.0, retry: bool = False, tag: str = "s1g0.0", **more: object) -> dict:
    return {"kind": "typed_answer", "t": t, "wall": 1000.0 + t, "session": "s1g0", "tag": tag,
            "input": "typed" if tag.count(".") == 1 else "steer", "valid": n is not None, "n": n, "retry": retry,
            "probe": False, "pid": "1", "stalled": False, **more}


TYPED_ANSWERS = [_answer(None), _answer(7, t=1.5, retry=True)]


def _typed(lines: list[dict], **overrides: object) -> Observation:
    return _observation(lines, **{"acks": [TYPED_ACK], "readers": {"s": list(lines)},
                                  "typed_answers": TYPED_ANSWERS, **overrides})


def test_a_typed_turn_answered_after_one_retry_passes() -> None:
    verdict = check(_typed(_typed_turn(output={"tag": "s1g0.0", "n": 7})))
    assert verdict.violations == []
    f = verdict.figures
    assert f["typed_turns"] == 1 and f["typed_outputs"] == 1 and f["typed_refused_stored"] == 1
    assert f["typed_probes_not_run"] == 1 and f["typed_requests_max"] == 2
    # a steer placed after the valid answer sets it aside: the model answers again, naming the steer
    steered = _typed_turn(output={"tag": "s1g0.0.0", "n": 8}, refused=0, probe=False)
    steered[-1:-1] = [_line(4, "user_message", text="steer:s1g0.0.0", id="a-s0", messageId="a"),
                      *_final(5, "v2", {"tag": "s1g0.0.0", "n": 8})]
    steered[-1]["cursor"] = 7
    answers = [_answer(7), _answer(8, tag="s1g0.0.0", t=2.0)]
    assert check(_typed(steered, typed_answers=answers)).violations == []


def test_each_broken_typed_rule_fails() -> None:
    good = {"tag": "s1g0.0", "n": 7}
    twice = _typed_turn(output=good, probe=False)
    twice[-1:-1] = _final(6, "v2", {"tag": "s1g0.0", "n": 7})
    twice[-1]["cursor"] = 8
    looped = [_answer(None, t=float(k)) if k % 2 else _answer(7, t=float(k)) for k in range(6)]
    cases = {
        "no output": _typed(_typed_turn()),
        "not the model's type": _typed(_typed_turn(output={"tag": "s1g0.0"})),
        "another turn's tag": _typed(_typed_turn(output={"tag": "s1g0.1", "n": 7})),
        "never given": _typed(_typed_turn(output={"tag": "s1g0.0", "n": 99})),
        "not the last stored answer": _typed(_typed_turn(output={"tag": "s1g0.0", "n": 8}),
                                             typed_answers=[*TYPED_ANSWERS, _answer(8, t=1.7)]),
        "two refused stored": _typed(_typed_turn(output=good, refused=2)),
        "asked again after a stored answer": _typed(twice),
        "output invalid, one refusal": _typed(_typed_turn(stop="error", error={"code": "FX_OUTPUT_INVALID"})),
        "probe ran": _typed(_typed_turn(output=good),
                            runs=[{"tool": "probe", "name": "t-s1g0.0", "x": "s:a:2:p", "token": "1", "intent": True}]),
        "requests past the bound": _typed(_typed_turn(output=good), typed_answers=looped),
        "untyped output": _observation([GOOD[0], GOOD[1], {**GOOD[2], "output": good}]),
    }
    for name, obs in cases.items():
        violations = check(obs).violations
        assert violations and any(v.startswith("typed:") for v in violations), (name, violations)
    # FX_OUTPUT_INVALID after two invalid answers is the engine doing its job
    invalid = _typed_turn(stop="error", refused=2, probe=False, error={"code": "FX_OUTPUT_INVALID"})
    assert [v for v in check(_typed(invalid, typed_answers=[_answer(None), _answer(None, t=2.0, retry=True)])).violations
            if v.startswith("typed:")] == []
    # a request asked again after a fault near it is within the bound
    near = [{"fault": "kill", "t": 3.0, "pid": 1}, {"fault": "stall", "t": 4.0}]
    assert check(_typed(_typed_turn(output=good), typed_answers=looped, faults=near)).violations == []


class _Request:
    """A model request as the chaos script reads one: the body's messages and tools, the pid."""

    def __init__(self, *messages: dict, typed: bool = True, pid: str = "42") -> None:
        tools = [{"type": "function", "function": {"name": "final_result", "parameters": {}}}] if typed else []
        self.body = {"messages": list(messages), "tools": tools}
        self.headers = {"x-fx-pid": pid}


def _calls(reply: Reply) -> list[ToolCall]:
    return [p for p in reply.parts if isinstance(p, ToolCall)]


def test_the_script_answers_typed_turns_and_fires_an_armed_kill_after_an_invalid_answer() -> None:
    from tests.chaos.history import History
    from tests.chaos.workload import ModelScript

    history = History()
    script = ModelScript(3, "key", history)
    fired: list[tuple[int, float]] = []
    script.arm_typed_kill(lambda pid, after_s: fired.append((pid, after_s)))
    first_try = _Request({"role": "user", "content": "typed:s1g0.0"})
    answers = [json.loads(_calls(script(first_try))[-1].arguments) for _ in range(20)]
    assert all(a["tag"] == "s1g0.0" for a in answers)
    invalid = [a for a in answers if "n" not in a]
    assert invalid and len(invalid) < len(answers)  # some first tries refused, others valid
    assert len(fired) == 1 and fired[0][0] == 42 and fired[0][1] > 0  # the armed kill, once
    retry = _Request({"role": "user", "content": "typed:s1g0.1"},
                     {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "final_result"}}]},
                     {"role": "tool", "tool_call_id": "c", "content": "The arguments did not validate as TypedAnswer: []"})
    steered = _Request({"role": "user", "content": "typed:s1g0.2"}, {"role": "user", "content": "steer:s1g0.2.0"})
    for request, tag in ((retry, "s1g0.1"), (steered, "s1g0.2.0")):
        for _ in range(10):
            calls = _calls(script(request))
            assert calls[-1].name == "final_result" and json.loads(calls[-1].arguments)["tag"] == tag
            assert isinstance(json.loads(calls[-1].arguments)["n"], int)
            assert all(c.name == "probe" for c in calls[:-1])
    numbers = [a["n"] for a in history.of("typed_answer") if a["valid"]]
    assert len(numbers) == len(set(numbers))  # each valid answer numbered apart
    assert not any(c.name == "final_result" for c in _calls(script(_Request({"role": "user", "content": "probe:s2g0.0"},
                                                                             typed=False))))
    assert script.disarm_typed_kills() == 0
