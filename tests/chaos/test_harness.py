"""The chaos harness end to end (`python -m tests.chaos.run`), as a subprocess.

A short seeded schedule passes with every kind of fault applied at least once (also on a
Redis Cluster store, where the nemesis kills primaries), and the same harness fails, naming §11.2 and the seed, when the workers run with the test-only
switch that starts each non-idempotent call twice (the checker is shown to catch a fault).
The checker's rules are also run on small hand-made histories, and the nemesis's poison
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
from fxengine.testing.script import Delay, Text
from tests.chaos import poison
from tests.chaos.checker import CLUSTER_FAULT_KINDS, FAULT_KINDS, Observation, check
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
    assert figures["worker_exits"] == 0 and figures["poison_messages"] == len(poison.KINDS) * figures["faults"]["poison"]
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
