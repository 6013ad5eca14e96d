"""The model catalog: list_models, validation codes at agent creation (fetched then, once,
and cached), an offline catalog that fetches nothing, ultrafast's service tier, and a key
quoted back in a 400 masked."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from fxengine import create_engine
from fxengine.errors import FxInputError, FxModelUnsupportedError
from fxengine.providers import gateway_provider, list_models
from fxengine.providers.credentials import gateway_key
from fxworker import Agent
from tests.providers.fakes import FakeGateway

KEY = "vck_live_" + "7f3a9c2e1b5d4f6a8c0e2b4d6f8a0c2e"

CATALOG = {"object": "list", "data": [
    {"id": "openai/gpt-5", "type": "language", "context_window": 400000, "max_tokens": 128000,
     "tags": ["reasoning", "tool-use"], "efforts": ["low", "medium", "high"], "ultrafast": True},
    {"id": "anthropic/claude-haiku-4.5", "type": "language", "tags": ["tool-use", "fast"]},
    {"id": "openai/text-embedding-3", "type": "embedding"},
]}


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    with FakeGateway(CATALOG) as server:
        yield server


def _name() -> str:
    return f"cat-{uuid.uuid4().hex[:8]}"


def test_gateway_key_order() -> None:
    env = {"AI_GATEWAY_API_KEY": "from-env", "VERCEL_OIDC_TOKEN": "from-oidc"}
    assert gateway_key("given", env) == "given"
    assert gateway_key(None, env) == "from-env"
    assert gateway_key(None, {"VERCEL_OIDC_TOKEN": "from-oidc"}) == "from-oidc"


def test_list_models(gateway: FakeGateway) -> None:
    ids = list_models(api_key=KEY, base_url=f"{gateway.url}/v1")
    assert ids == ["anthropic/claude-haiku-4.5", "openai/gpt-5"]  # language models only
    _, path, headers, _ = gateway.requests[0]
    assert path == "/v1/models" and headers["authorization"] == f"Bearer {KEY}"


def test_settings_are_validated_at_agent_creation_against_the_fetched_catalog(gateway: FakeGateway) -> None:
    provider = gateway_provider(api_key=KEY, base_url=f"{gateway.url}/v1")

    with pytest.raises(FxModelUnsupportedError) as info:
        Agent(_name(), model={"id": "openai/gpt-5", "effort": "max"}, provider=provider)
    error = info.value
    assert error.code == "FX_MODEL_UNSUPPORTED_EFFORT"
    assert (error.model, error.capability, error.supported) == ("openai/gpt-5", "effort", ("low", "medium", "high"))
    assert error.to_dict()["supported"] == ["low", "medium", "high"]

    with pytest.raises(FxModelUnsupportedError) as info:
        Agent(_name(), model={"id": "openai/gpt-5", "fast": True}, provider=provider)
    assert (info.value.code, info.value.capability) == ("FX_MODEL_UNSUPPORTED_FAST", "fast")

    with pytest.raises(FxModelUnsupportedError) as info:
        Agent(_name(), model={"id": "anthropic/claude-haiku-4.5", "ultrafast": True}, provider=provider)
    assert (info.value.code, info.value.capability) == ("FX_MODEL_UNSUPPORTED_ULTRAFAST", "ultrafast")

    with pytest.raises(FxInputError) as info:
        Agent(_name(), model={"id": "openai/gpt-5", "fast": True, "ultrafast": True}, provider=provider)
    assert info.value.code == "FX_INVALID_INPUT"

    fetched = len(gateway.requests)
    assert fetched == 3  # one per agent that named a setting; the mutually exclusive pair fetches nothing

    agent = Agent(_name(), model={"id": "openai/gpt-5", "effort": "high"}, provider=provider)
    try:
        session = agent.session(model={"id": "anthropic/claude-haiku-4.5", "fast": True})
        with pytest.raises(FxModelUnsupportedError):
            agent.session(model={"id": "anthropic/claude-haiku-4.5", "effort": "low"})
        assert session.model["fast"] is True
    finally:
        agent.close()
    assert len(gateway.requests) == fetched + 1  # the agent's catalog is cached


def test_a_plain_model_id_fetches_nothing(gateway: FakeGateway) -> None:
    agent = Agent(_name(), model="openai/gpt-5", provider=gateway_provider(api_key=KEY, base_url=f"{gateway.url}/v1"))
    agent.close()
    assert gateway.requests == []


async def test_a_catalog_supplied_offline_makes_no_request(gateway: FakeGateway) -> None:
    provider = gateway_provider(api_key=KEY, base_url=f"{gateway.url}/v1")
    with pytest.raises(FxModelUnsupportedError) as info:
        Agent(_name(), model={"id": "openai/gpt-5", "effort": "max"}, provider=provider, model_catalog=CATALOG)
    assert info.value.code == "FX_MODEL_UNSUPPORTED_EFFORT"
    agent = Agent(_name(), model={"id": "openai/gpt-5", "ultrafast": True}, provider=provider, model_catalog=CATALOG)
    agent.close()
    engine = await create_engine({"id": "openai/gpt-5", "effort": "low"}, provider=provider, model_catalog=CATALOG)
    await engine.close()
    assert gateway.requests == []


async def test_ultrafast_is_the_service_tier_and_a_quoted_key_is_masked(gateway: FakeGateway) -> None:
    provider = gateway_provider(api_key=KEY, base_url=f"{gateway.url}/v1")
    events: list[dict] = []
    engine = await create_engine({"id": "openai/gpt-5", "ultrafast": True}, provider=provider, model_catalog=CATALOG,
                                 on_event=events.append)
    result = await engine.prompt("hi").result()
    await engine.close()

    _, path, _, raw = gateway.requests[0]
    assert path == "/v1/chat/completions" and json.loads(raw)["service_tier"] == "priority"
    assert result.stop_reason == "error" and result.error["code"] == "FX_PROVIDER_REJECTED"
    assert "Incorrect API key provided" in result.error["message"]
    assert KEY not in result.error["message"] and KEY[:12] not in result.error["message"]
    assert KEY not in json.dumps(events)
