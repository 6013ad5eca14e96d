"""Session and message ids (§2, §10)."""

from __future__ import annotations

import pytest

from fxworker.errors import FxInvalidMessageIdError, FxInvalidSessionIdError
from fxworker.ids import (
    new_holder_id,
    new_message_id,
    new_session_id,
    ulid_time_ms,
    validate_message_id,
    validate_session_id,
)


def test_new_session_ids_are_fxs_ulids_that_sort_by_time() -> None:
    early, late = new_session_id(1_700_000_000_000), new_session_id(1_700_000_000_001)
    assert early.startswith("fxs_") and len(early) == 30
    assert validate_session_id(early) == early
    assert early < late
    assert ulid_time_ms(early) == 1_700_000_000_000
    assert len({new_session_id() for _ in range(1000)}) == 1000
    assert new_holder_id().startswith("wkr_") and new_message_id().startswith("msg_")


@pytest.mark.parametrize("bad", [
    "", "fxs_", "fxs_01ARZ3NDEKTSV4RRFFQ69G5FA", "fxs_01ARZ3NDEKTSV4RRFFQ69G5FAVX", "fxs_01arz3ndektsv4rrffq69g5fav",
    "fxs_81ARZ3NDEKTSV4RRFFQ69G5FAV", "fxs_01ARZ3NDEKTSV4RRFFQ69G5FAI", "fxs_user-42", ".", "..", "x" * 129,
    "a b", "a/b", "a:b", "{tag}", "é", None, 12,
])
def test_anything_else_is_refused_by_redis_stores(bad: object) -> None:
    with pytest.raises(FxInvalidSessionIdError) as caught:
        validate_session_id(bad)
    assert caught.value.code == "FX_INVALID_SESSION_ID"


@pytest.mark.parametrize("own", ["user-42", "ticket.2024-001", "a", "A_b.C-9", "x" * 128, "fxs", "fx_s", "...a"])
def test_an_application_names_its_own_sessions(own: str) -> None:
    """1-128 of A-Z a-z 0-9 . _ -, not only dots, not starting with the reserved `fxs_`."""
    assert validate_session_id(own) == own


def test_a_reserved_prefix_says_why() -> None:
    with pytest.raises(FxInvalidSessionIdError) as caught:
        validate_session_id("fxs_user-42")
    assert "generated" in str(caught.value) and caught.value.code == "FX_INVALID_SESSION_ID"


def test_the_memory_rule() -> None:
    assert validate_session_id("a.b_c-9", memory=True) == "a.b_c-9"
    assert validate_session_id("x" * 128, memory=True)
    for bad in ("", "x" * 129, "a b", "a/b", "a:b", "é"):
        with pytest.raises(FxInvalidSessionIdError):
            validate_session_id(bad, memory=True)


def test_message_ids() -> None:
    for good in ("m", "msg_01ARZ3NDEKTSV4RRFFQ69G5FAV", "a:b.c_d-e", "x" * 128):
        assert validate_message_id(good) == good
    for bad in ("", "x" * 129, "a b", "a/b", "é", None):
        with pytest.raises(FxInvalidMessageIdError):
            validate_message_id(bad)
