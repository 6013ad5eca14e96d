"""A libfx provider definition pasted as it is: each camelCase key is refused with the key
to use here (`FX_PROVIDER_INVALID`), not with a message about a key it never set."""

from __future__ import annotations

import pytest

from fxengine import FxInputError, create_engine
from fxengine.providers.custom import LIBFX_KEYS, custom_provider

BASE = {"name": "local", "base_url": "http://127.0.0.1:9/v1", "models": {"m": {"context_window": 1000}}}


@pytest.mark.parametrize("key", ["baseUrl", "apiKey", "idleTimeoutMs"])
def test_a_provider_key_in_libfx_spelling_names_the_key_to_use(key: str) -> None:
    spec = {**BASE, key: "x"}
    if key == "baseUrl":
        spec.pop("base_url")
    with pytest.raises(FxInputError) as caught:
        custom_provider(spec)
    assert caught.value.code == "FX_PROVIDER_INVALID"
    assert f"{key!r}: use {LIBFX_KEYS[key]!r}" in caught.value.message


@pytest.mark.parametrize("key", ["contextWindow", "maxOutputTokens", "supportsToolUse", "supportsImages",
                                 "supportsStructuredOutput"])
def test_a_model_key_in_libfx_spelling_names_the_key_to_use(key: str) -> None:
    spec = {**BASE, "models": {"m": {key: 1}}}
    with pytest.raises(FxInputError) as caught:
        custom_provider(spec)
    assert caught.value.code == "FX_PROVIDER_INVALID"
    assert f"model m key {key!r}: use {LIBFX_KEYS[key]!r}" in caught.value.message


async def test_create_engine_says_the_same() -> None:
    with pytest.raises(FxInputError) as caught:
        await create_engine("m", provider={"name": "local", "baseUrl": "http://127.0.0.1:9/v1", "models": {"m": {}}})
    assert "'baseUrl': use 'base_url'" in caught.value.message


def test_the_snake_case_definition_is_taken() -> None:
    assert custom_provider(BASE).base_url == "http://127.0.0.1:9/v1"
