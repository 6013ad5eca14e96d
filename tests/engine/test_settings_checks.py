"""`check_model`, `check_instructions` and `check_context`: the settings checks `create_engine`
runs and the durable layer runs at its door, offline and without credentials."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fxengine import FxInputError, create_engine
from fxengine.limits import check_context, check_instructions
from fxengine.providers import check_model, resolve_provider

CATALOG = {"vendor/m": {"efforts": ["low", "high"], "fast": True}}


@pytest.fixture(autouse=True)
def no_gateway_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AI_GATEWAY_API_KEY", raising=False)
    monkeypatch.delenv("VERCEL_OIDC_TOKEN", raising=False)


def code_of(call: Any) -> str:
    with pytest.raises(FxInputError) as refused:
        call()
    return refused.value.code


def test_a_gateway_catalog_is_checked_without_a_key() -> None:
    spec = check_model({"id": "vendor/m", "effort": "high", "fast": True}, None, model_catalog=CATALOG)
    assert spec.to_dict() == {"id": "vendor/m", "effort": "high", "fast": True}
    assert code_of(lambda: check_model({"id": "vendor/m", "effort": "max"}, None, model_catalog=CATALOG)) == "FX_MODEL_UNSUPPORTED_EFFORT"
    assert code_of(lambda: check_model({"id": "vendor/m", "ultrafast": True}, None, model_catalog=CATALOG)) == "FX_MODEL_UNSUPPORTED_ULTRAFAST"
    assert code_of(lambda: check_model("vendor/other", None, model_catalog=CATALOG)) == "FX_MODEL_UNKNOWN"
    # No catalog: the gateway decides, so any well-formed setting passes.
    assert check_model({"id": "vendor/other", "effort": "max"}).effort == "max"


def test_check_model_gives_the_answer_of_a_resolved_provider() -> None:
    custom = {"name": "p", "base_url": "https://example.com/v1", "models": {"m": {"efforts": ["low"]}}}
    resolved = resolve_provider(custom, api_key=None)
    for model in ("m", {"id": "m", "effort": "low"}, {"id": "m", "effort": "high"}, {"id": "x"}, {"id": "m", "fast": True}):
        try:
            from_dict: Any = check_model(model, custom)
        except FxInputError as exc:
            from_dict = exc.code
        try:
            from_provider: Any = check_model(model, resolved)
        except FxInputError as exc:
            from_provider = exc.code
        assert from_dict == from_provider


async def test_create_engine_refuses_a_nan_context_and_a_lone_surrogate() -> None:
    # Before: NaN went through (json.dumps writes it), the surrogate was a UnicodeEncodeError.
    custom = {"name": "p", "base_url": "http://127.0.0.1:9/v1", "models": {"m": {}}}
    with pytest.raises(FxInputError) as refused:
        await create_engine("m", provider=custom, context={"x": math.nan})
    assert refused.value.code == "FX_INVALID_INPUT"
    with pytest.raises(FxInputError) as refused:
        await create_engine("m", provider=custom, instructions="bad \ud800")
    assert refused.value.code == "FX_INVALID_INPUT"


def test_instructions_join_a_list_and_empty_is_none() -> None:
    assert check_instructions(["a", "b"]) == "a\n\nb"
    assert check_instructions(("a",)) == "a"
    assert check_instructions("") is None and check_instructions([]) is None
    assert code_of(lambda: check_instructions(b"bytes")) == "FX_INVALID_INPUT"


def test_context_is_a_plain_json_copy() -> None:
    source = {"a": (1, 2.5, None), "b": {"c": True}}
    copy = check_context(source)
    assert copy == {"a": [1, 2.5, None], "b": {"c": True}} and copy["b"] is not source["b"]
    assert check_context(None) is None
    assert code_of(lambda: check_context(float("-inf"))) == "FX_INVALID_INPUT"
