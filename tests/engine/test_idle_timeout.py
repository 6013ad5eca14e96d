"""A model stream that goes silent fails its step FX_PROVIDER_TIMEOUT after the idle timeout
(retried once, only before any output), not after the client's 600 s read timeout."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fxengine.errors import FxInputError
from fxengine.providers.custom import custom_provider
from fxengine.testing import Reply, ScriptedModel, hold, text

from .conftest import run, text_of

IDLE_S = 0.5


async def test_a_stream_silent_before_its_first_chunk_times_out_and_is_retried_once(
    model: ScriptedModel, make_engine: Any
) -> None:
    model.script(Reply(hold("silent")), Reply(hold("silent")), Reply(text("never")))
    engine = await make_engine(model_idle_timeout_s=IDLE_S)
    started = time.monotonic()
    _, result = await run(engine.prompt("q"))
    took_s = time.monotonic() - started
    model.release("silent")
    assert result.stop_reason == "error" and result.error["code"] == "FX_PROVIDER_TIMEOUT", result
    assert len(model.requests) == 2
    assert 2 * IDLE_S <= took_s < 2 * IDLE_S + 3, took_s


async def test_a_stall_after_output_escaped_is_not_retried(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("half "), hold("stall"), text("never")), Reply(text("never either")))
    engine = await make_engine(model_idle_timeout_s=IDLE_S)
    events, result = await run(engine.prompt("q"))
    model.release("stall")
    assert text_of(events) == "half "
    assert result.stop_reason == "error" and result.error["code"] == "FX_PROVIDER_TIMEOUT"
    assert len(model.requests) == 1


async def test_the_providers_own_idle_timeout_wins(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(hold("short")), Reply(text("second try")))
    provider = {**model.provider, "idle_timeout_s": IDLE_S}
    engine = await make_engine(provider=provider, model_idle_timeout_s=600)
    events, result = await run(engine.prompt("q"))
    model.release("short")
    assert result.stop_reason == "end_turn" and text_of(events) == "second try"
    assert len(model.requests) == 2


@pytest.mark.parametrize("bad", [0, -1, "5", True])
def test_a_custom_providers_idle_timeout_must_be_a_positive_number(model: ScriptedModel, bad: Any) -> None:
    with pytest.raises(FxInputError) as refused:
        custom_provider({**model.provider, "idle_timeout_s": bad})
    assert refused.value.code == "FX_PROVIDER_INVALID"
