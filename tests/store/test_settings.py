"""`Settings`: read from the environment once, each default written once (on its field),
and the relations between values checked however the settings were made."""

from __future__ import annotations

import dataclasses

import pytest

from fxworker.errors import FxConfigError
from fxworker.settings import Settings


def test_an_empty_environment_gives_the_field_defaults() -> None:
    assert Settings.from_env({}) == Settings()


def test_every_field_is_read_from_its_variable() -> None:
    changed = Settings.from_env({"FX_LEASE_S": "7", "FX_SWEEP_S": "2", "FX_RESERVE_S": "9", "FX_DELIVERY_TIMEOUT_S": "60",
                                 "FX_ACK": "replica", "FX_PREFIX": "p", "FX_WORKER_CONCURRENCY": "3"})
    assert (changed.lease_s, changed.sweep_s, changed.reserve_s, changed.delivery_timeout_s) == (7, 2, 9, 60)
    assert (changed.ack, changed.prefix, changed.worker_concurrency) == ("replica", "p", 3)


@pytest.mark.parametrize(("env", "said"), [
    ({"FX_RESERVE_S": "300"}, "FX_RESERVE_S (300) must be less than FX_DELIVERY_TIMEOUT_S (300)"),
    ({"FX_RESERVE_S": "5", "FX_DELIVERY_TIMEOUT_S": "4"}, "must be less than FX_DELIVERY_TIMEOUT_S"),
    ({"FX_ACK": "all"}, "FX_ACK must be primary, aof or replica"),
    ({"FX_LEASE_S": "soon"}, "FX_LEASE_S must be a number"),
])
def test_values_that_cannot_work_are_refused_at_construction(env: dict[str, str], said: str) -> None:
    with pytest.raises(FxConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env(env)


def test_the_relations_hold_for_settings_made_in_code_too() -> None:
    with pytest.raises(FxConfigError):
        Settings(reserve_s=30, delivery_timeout_s=20)
    with pytest.raises(FxConfigError):
        dataclasses.replace(Settings(), ack="quorum")
