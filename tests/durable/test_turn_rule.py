"""`fxworker.turns.rule`: the one poison and cut-off policy, read from a claim (§6).

The durable tests (test_fault_*) show each rule on real workers; this one pins the table
itself, every branch, so a change of a bound or an order of checks fails here by name.
"""

from __future__ import annotations

import pytest

from fxworker.store.types import Claim, OpenTurn
from fxworker.turns import MAX_CUTOFFS, MAX_DEATHS, RUN, Ruling, rule


def _claim(*, open_turn: bool, deaths: int = 0, cutoffs: int = 0) -> Claim:
    return Claim(
        session_id="fxs_x", holder="w", epoch=2, lease_expires_ms=0, agent="default", checkpoint=None, records=[],
        head=None, pending=[], open_turn=OpenTurn("m1", yielded=False) if open_turn else None, cutoffs=cutoffs,
        deaths=deaths, cancel_requested=False, ui_cursor=0, taken_over=deaths > 0, inbox_cursor=0,
    )


def _code(ruling: Ruling) -> str | None:
    return ruling.error["code"] if ruling.error is not None else None


def test_an_input_is_poison_only_as_the_first_of_a_delivery_with_no_turn_open() -> None:
    poisoned = rule(_claim(open_turn=False, deaths=MAX_DEATHS), first_input=True)
    assert (poisoned.stop_reason, _code(poisoned)) == ("error", "FX_POISON_TURN")
    assert rule(_claim(open_turn=False, deaths=MAX_DEATHS), first_input=False) == RUN
    assert rule(_claim(open_turn=False, deaths=MAX_DEATHS - 1), first_input=True) == RUN
    # The turn that was open ended in this delivery: the inputs behind it are not its poison.
    assert rule(_claim(open_turn=True, deaths=MAX_DEATHS), first_input=True) == RUN


def test_an_open_turn_past_the_bound_ends_without_loading_its_journal() -> None:
    ruling = rule(_claim(open_turn=True, deaths=MAX_DEATHS + 1))
    assert (ruling.stop_reason, _code(ruling), ruling.load) == ("cancelled", "FX_POISON_TURN", False)
    assert ruling.error is not None and "while loading it" in ruling.error["message"]


@pytest.mark.parametrize("in_flight, where", [
    (None, "between steps"),
    ({"kind": "model", "step": 4}, "during model request 4"),
    ({"kind": "tool", "step": 2, "calls": [{"name": "send"}, {"name": "lookup"}]}, "while running lookup, send (step 2)"),
])
def test_an_open_turn_at_the_bound_ends_as_poison_once_loaded_naming_where(in_flight: dict[str, object] | None,
                                                                             where: str) -> None:
    claim = _claim(open_turn=True, deaths=MAX_DEATHS)
    assert rule(claim) == RUN  # before loading: the journal says where its workers died
    ruling = rule(claim, in_flight=in_flight, loaded=True)
    assert (ruling.stop_reason, _code(ruling), ruling.load) == ("cancelled", "FX_POISON_TURN", True)
    assert ruling.error is not None and where in ruling.error["message"]


def test_a_step_cut_off_at_the_bound_is_not_run_again() -> None:
    claim = _claim(open_turn=True, cutoffs=MAX_CUTOFFS)
    for model_step in (None, {"kind": "model", "step": 3}):
        ruling = rule(claim, in_flight=model_step, loaded=True)
        assert (ruling.stop_reason, _code(ruling)) == ("cancelled", "FX_DEADLINE_CUTOFFS")
    tool_step = rule(claim, in_flight={"kind": "tool", "step": 3, "calls": []}, loaded=True)
    assert tool_step == Ruling(no_rerun=True)  # answered as possibly run, the turn goes on
    assert rule(_claim(open_turn=True, cutoffs=MAX_CUTOFFS - 1), in_flight={"kind": "model"}, loaded=True) == RUN


def test_deaths_rule_before_cut_offs() -> None:
    ruling = rule(_claim(open_turn=True, deaths=MAX_DEATHS, cutoffs=MAX_CUTOFFS), in_flight=None, loaded=True)
    assert _code(ruling) == "FX_POISON_TURN"
