"""Credentials in a turn: loaded from the callbacks, refreshed before expiry and once after
a 401, the Grok account check, the Codex request shape, tokens masked in errors."""

from __future__ import annotations

import asyncio
import json

from fxengine import create_engine
from fxengine.providers import chatgpt, grok
from fxengine.providers.oauth import OAuthConfig
from fxengine.tools import tool
from tests.providers.conftest import CredentialStore
from tests.providers.fakes import FakePlan


def _grok(plan: FakePlan, config: OAuthConfig, store: CredentialStore):
    return grok.provider(credentials=store.load, on_credentials=store.save, oauth_config=config,
                         base_url=f"{plan.url}/v1")


def _secrets(plan: FakePlan) -> list[str]:
    return [t for tokens in plan.issued for t in (tokens["access_token"], tokens["refresh_token"], tokens["id_token"])]


async def test_refreshes_shortly_before_expiry(plan: FakePlan, grok_config: OAuthConfig) -> None:
    store = CredentialStore(plan.seed_credentials(expires_in_s=30))  # inside the refresh margin
    events: list[dict] = []
    engine = await create_engine("grok-4", provider=_grok(plan, grok_config, store), session_id="s-1",
                                 on_event=events.append)
    result = await engine.prompt("hi").result()
    await engine.close()

    assert result.stop_reason == "end_turn", result.error
    assert plan.refreshes == 1
    assert len(plan.api_calls) == 1  # the first request already carried the new token
    fresh = plan.issued[-1]
    assert plan.api_calls[0]["token"] == fresh["access_token"]
    assert len(store.saved) == 1
    saved, ctx = store.saved[0]
    assert saved["access_token"] == fresh["access_token"] and saved["account_id"] == "acct-1"
    assert ctx == {"provider": "grok", "session_id": "s-1"}
    assert store.loads[0] == {"provider": "grok", "session_id": "s-1"}
    shown = json.dumps(events) + json.dumps(engine.checkpoint().decode("latin-1"))
    assert not [s for s in _secrets(plan) if s in shown]


async def test_a_401_refreshes_once_and_the_turn_goes_on(plan: FakePlan, grok_config: OAuthConfig) -> None:
    creds = plan.seed_credentials()
    plan.revoke(creds["access_token"])
    store = CredentialStore(creds)
    engine = await create_engine("grok-4", provider=_grok(plan, grok_config, store), session_id="s-2")
    result = await engine.prompt("hi").result()
    await engine.close()

    assert result.stop_reason == "end_turn", result.error
    assert plan.refreshes == 1
    assert [c["token"] for c in plan.api_calls] == [creds["access_token"], plan.issued[-1]["access_token"]]
    assert len(store.saved) == 1


async def test_a_second_401_ends_the_turn_with_the_token_masked(plan: FakePlan, grok_config: OAuthConfig) -> None:
    store = CredentialStore(plan.seed_credentials())
    plan.reject_all = True
    engine = await create_engine("grok-4", provider=_grok(plan, grok_config, store), session_id="s-3")
    result = await engine.prompt("hi").result()
    await engine.close()

    assert result.stop_reason == "error"
    assert result.error["code"] == "FX_PROVIDER_AUTH"
    assert plan.refreshes == 1  # once, not again after the second 401
    assert len(plan.api_calls) == 2
    assert "Invalid or expired token" in result.error["message"]  # the server's body, quoting the token
    assert not [s for s in _secrets(plan) if s in result.error["message"]]


async def test_grok_refuses_refreshed_credentials_of_another_account(plan: FakePlan, grok_config: OAuthConfig) -> None:
    store = CredentialStore(plan.seed_credentials(expires_in_s=5))
    plan.refresh_account = "someone-else"
    engine = await create_engine("grok-4", provider=_grok(plan, grok_config, store), session_id="s-4")
    result = await engine.prompt("hi").result()
    await engine.close()

    assert result.stop_reason == "error"
    assert result.error["code"] == "FX_PROVIDER_ACCOUNT_MISMATCH"
    assert store.saved == []  # nothing of the other account is handed back
    assert plan.api_calls == []


async def test_sessions_of_one_process_share_a_refresh(plan: FakePlan, grok_config: OAuthConfig) -> None:
    store = CredentialStore(plan.seed_credentials(expires_in_s=5))
    engines = [await create_engine("grok-4", provider=_grok(plan, grok_config, store), session_id=f"s-{i}")
               for i in range(3)]
    results = await asyncio.gather(*(e.prompt("hi").result() for e in engines))
    for engine in engines:
        await engine.close()

    assert [r.stop_reason for r in results] == ["end_turn"] * 3
    assert plan.refreshes == 1


@tool(idempotent=True)
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


async def test_codex_turn_speaks_the_responses_shape(plan: FakePlan, chatgpt_config: OAuthConfig) -> None:
    store = CredentialStore(plan.seed_credentials())
    provider = chatgpt.provider(credentials=store.load, on_credentials=store.save, oauth_config=chatgpt_config,
                                base_url=f"{plan.url}/backend-api/codex")
    engine = await create_engine({"id": "gpt-5-codex", "effort": "high"}, provider=provider, tools=[lookup],
                                 instructions="Be brief.", session_id="s-5")
    turn = engine.prompt("find x")
    kinds = [event["type"] async for event in turn]
    result = await turn.result()
    await engine.close()

    assert result.stop_reason == "end_turn", result.error
    assert "tool_end" in kinds and "text_delta" in kinds and "reasoning_delta" in kinds
    assert result.usage["inputTokens"] == 22 and result.usage["reasoningTokens"] == 2
    first, second = plan.api_calls
    assert first["headers"]["chatgpt-account-id"] == "acct-1"
    body = first["body"]
    assert body["instructions"] == "Be brief." and body["store"] is False and body["stream"] is True
    assert body["reasoning"] == {"effort": "high", "summary": "auto"}
    assert body["input"] == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "find x"}]}]
    assert body["tools"][0]["name"] == "lookup"
    items = second["body"]["input"]
    assert {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q": "x"}'} in items
    assert {"type": "function_call_output", "call_id": "call_1", "output": "found x"} in items
    assert engine.messages[-1]["content"] == "hello from codex"


async def test_a_custom_provider_takes_its_key_from_credentials_and_does_not_refresh() -> None:
    from fxengine.testing import Reply, ScriptedModel, text

    calls: list[dict] = []

    def load(ctx: dict) -> dict:
        calls.append(ctx)
        return {"api_key": "sk-custom-0123456789abcdef"}

    with ScriptedModel() as model:
        model.script(Reply(text("ok")))
        engine = await create_engine("scripted", provider=model.provider, credentials=load, session_id="s-6")
        result = await engine.prompt("hi").result()
        await engine.close()
        request = model.requests[0]

    assert result.stop_reason == "end_turn", result.error
    assert request.headers["authorization"] == "Bearer sk-custom-0123456789abcdef"
    assert calls == [{"provider": "scripted", "session_id": "s-6"}]


def test_plan_providers_at_the_door() -> None:
    import pytest

    from fxengine.errors import FxInputError, FxProviderError
    from fxworker import Agent

    with pytest.raises(FxProviderError) as info:
        Agent("plan-door-a", model="gpt-5-codex", provider="codex")
    assert info.value.code == "FX_PROVIDER_NO_CREDENTIALS"
    with pytest.raises(FxInputError) as refused:
        Agent("plan-door-b", model="gpt-5-codex", provider="openai-plan")
    assert refused.value.code == "FX_PROVIDER_INVALID"
    agent = Agent("plan-door-c", model="gpt-5-codex", provider="codex", credentials=lambda ctx: None)
    try:
        assert agent.provider.name == "codex" and agent.provider.auth is not None
        assert "credentials" not in repr(agent.provider)
    finally:
        agent.close()
