"""The chaos harness end to end (`python -m tests.chaos.run`), as a subprocess.

A short seeded schedule passes with every kind of fault applied at least once, and the
same harness fails, naming §11.2 and the seed, when the workers run with the test-only
switch that starts each non-idempotent call twice (the checker is shown to catch a fault).
The checker's rules are also run on small hand-made histories.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.checker import FAULT_KINDS, Observation, check
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
    assert "chaos: passed (seed 11)" in proc.stdout


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


def test_a_resent_push_of_one_start_is_not_a_duplicate() -> None:
    runs = [{"tool": "effect", "x": "c", "token": "1", "intent": True}] * 2
    assert check(_observation(GOOD, runs=runs)).violations == []
