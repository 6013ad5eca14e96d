from __future__ import annotations

import asyncio
import json
from typing import Any

from fxengine.testing import Reply, ScriptedModel, cut, http_error, text
from tests.support.redis_server import free_port

from .conftest import Diagnostics, run, text_of


async def test_a_5xx_before_output_is_retried_once(model: ScriptedModel, make_engine: Any,
                                                    diagnostics: Diagnostics) -> None:
    model.script(http_error(503, "overloaded"), Reply(text("fine")))
    engine = await make_engine()
    events, result = await run(engine.prompt("q"))
    assert result.stop_reason == "end_turn" and text_of(events) == "fine"
    assert len(model.requests) == 2
    retry = diagnostics.of("transport.retry")
    assert len(retry) == 1 and retry[0]["attempt"] == 1 and retry[0]["nextAttempt"] == 2
    assert retry[0]["error"] == "FX_PROVIDER_UNAVAILABLE"
    assert [e["status"] for e in diagnostics.of("transport.response")] == [503, 200]


async def test_a_429_waits_its_retry_after(model: ScriptedModel, make_engine: Any, diagnostics: Diagnostics) -> None:
    model.script(http_error(429, "slow down", retry_after_s=0.3), Reply(text("ok")))
    engine = await make_engine()
    _, result = await run(engine.prompt("q"))
    assert result.stop_reason == "end_turn"
    assert diagnostics.of("transport.retry")[0]["delayMs"] == 300
    first, second = model.requests
    assert second.at_ms - first.at_ms >= 290


async def test_at_most_one_retry(model: ScriptedModel, make_engine: Any, diagnostics: Diagnostics) -> None:
    model.script(http_error(500), http_error(500), Reply(text("never")))
    engine = await make_engine()
    _, result = await run(engine.prompt("q"))
    assert result.stop_reason == "error" and result.error is not None
    assert result.error["code"] == "FX_PROVIDER_UNAVAILABLE"
    assert len(model.requests) == 2
    assert len(diagnostics.of("transport.retry")) == 1 and len(diagnostics.of("transport.error")) == 2


async def test_a_stream_cut_before_output_is_retried(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(cut()), Reply(text("whole")))
    engine = await make_engine()
    events, result = await run(engine.prompt("q"))
    assert result.stop_reason == "end_turn" and text_of(events) == "whole"
    assert len(model.requests) == 2


async def test_no_retry_after_output_escaped(model: ScriptedModel, make_engine: Any,
                                             diagnostics: Diagnostics) -> None:
    model.script(Reply(text("half an "), cut()), Reply(text("never")))
    engine = await make_engine()
    events, result = await run(engine.prompt("q"))
    assert text_of(events) == "half an "
    assert result.stop_reason == "error" and result.error is not None
    assert result.error["code"] == "FX_PROVIDER_STREAM_CUT"
    assert len(model.requests) == 1 and not diagnostics.of("transport.retry")


async def test_a_connect_error_is_retried_then_reported(make_engine: Any, diagnostics: Diagnostics) -> None:
    dead = {"name": "dead", "base_url": f"http://127.0.0.1:{free_port()}/v1",
            "models": {"m": {"context_window": 1000, "max_output_tokens": 100}}}
    engine = await make_engine(provider=dead, model_id="m")
    _, result = await run(engine.prompt("q"))
    assert result.stop_reason == "error" and result.error is not None
    assert result.error["code"] == "FX_PROVIDER_UNREACHABLE"
    assert [e["attempt"] for e in diagnostics.of("transport.error")] == [1, 2]


async def test_cancel_prevents_the_retry(model: ScriptedModel, make_engine: Any, diagnostics: Diagnostics) -> None:
    model.script(http_error(500, retry_after_s=5), Reply(text("never")))
    engine = await make_engine()
    turn = engine.prompt("q")
    while not diagnostics.of("transport.retry"):
        await asyncio.sleep(0.005)
    turn.cancel()
    result = await asyncio.wait_for(turn.result(), 2)
    assert result.stop_reason == "cancelled"
    assert len(model.requests) == 1


async def test_a_key_quoted_back_is_masked_everywhere(model: ScriptedModel, make_engine: Any,
                                                      diagnostics: Diagnostics) -> None:
    key = "sk-live-0123456789abcdefSECRET"
    model.script(http_error(401, f"Incorrect API key provided: {key}. Also {key[:10]}****CRET."))
    provider = {**model.provider, "api_key": key}
    engine = await make_engine(provider=provider)
    _, result = await run(engine.prompt("q"))
    assert model.requests[0].headers["authorization"] == f"Bearer {key}"
    assert result.error is not None and result.error["code"] == "FX_PROVIDER_AUTH"
    assert "Incorrect API key" in result.error["message"]
    assert key not in json.dumps(result.error) and key[:10] not in json.dumps(result.error)
    assert key[:10] not in json.dumps(diagnostics)
    assert key not in repr(engine) and key not in engine.checkpoint().decode("latin-1")
