"""Each sign-in flow end to end against a local issuer, and the refresh helpers."""

from __future__ import annotations

import httpx
import pytest

from fxengine.errors import FxProviderError
from fxengine.providers import chatgpt, grok
from fxengine.providers.oauth import OAuthConfig
from tests.providers.fakes import FakePlan


def _browser_visits(url: str) -> str:
    """What the user's browser lands on after signing in: the redirect's address."""
    response = httpx.get(url, follow_redirects=False, timeout=5.0)
    assert response.status_code == 302, response.text
    return response.headers["location"]


async def test_chatgpt_pkce_sign_in(plan: FakePlan, chatgpt_config: OAuthConfig) -> None:
    sign_in = chatgpt.start_sign_in(oauth_config=chatgpt_config)
    assert sign_in["url"].startswith(f"{plan.url}/oauth/authorize?")
    assert "code_challenge_method=S256" in sign_in["url"]
    assert sign_in["redirect_uri"] == "http://localhost:1455/auth/callback"
    pasted = _browser_visits(sign_in["url"])
    assert pasted.startswith("http://localhost:1455/auth/callback?code=")

    creds = await chatgpt.finish_sign_in(sign_in, pasted, oauth_config=chatgpt_config)

    issued = plan.issued[-1]
    assert creds["access_token"] == issued["access_token"]
    assert creds["refresh_token"] == issued["refresh_token"]
    assert creds["account_id"] == "acct-1"
    assert creds["expires_at"] > 0


async def test_chatgpt_sign_in_refuses_another_sign_ins_address(chatgpt_config: OAuthConfig) -> None:
    first = chatgpt.start_sign_in(oauth_config=chatgpt_config)
    second = chatgpt.start_sign_in(oauth_config=chatgpt_config)
    pasted = _browser_visits(first["url"])
    with pytest.raises(FxProviderError) as info:
        await chatgpt.finish_sign_in(second, pasted, oauth_config=chatgpt_config)
    assert info.value.code == "FX_SIGN_IN_FAILED"
    with pytest.raises(FxProviderError) as info:
        await chatgpt.finish_sign_in(first, "http://localhost:1455/auth/callback?error=access_denied",
                                     oauth_config=chatgpt_config)
    assert info.value.code == "FX_SIGN_IN_FAILED"


async def test_chatgpt_device_sign_in(plan: FakePlan, chatgpt_config: OAuthConfig) -> None:
    device = await chatgpt.start_device_sign_in(oauth_config=chatgpt_config)
    assert device["verification_url"] == f"{plan.url}/codex/device"
    assert await chatgpt.poll_device_sign_in(device, oauth_config=chatgpt_config) is None

    plan.approve_device(device["user_code"])
    creds = await chatgpt.complete_device_sign_in(device, oauth_config=chatgpt_config, timeout_s=10)

    assert creds["access_token"] == plan.issued[-1]["access_token"]
    assert creds["account_id"] == "acct-1"
    assert "/api/accounts/deviceauth/token" in plan.paths()


async def test_grok_device_sign_in(plan: FakePlan, grok_config: OAuthConfig) -> None:
    device = await grok.start_device_sign_in(oauth_config=grok_config)
    assert device["user_code"] and device["verification_url"] == f"{plan.url}/device"
    assert await grok.poll_device_sign_in(device, oauth_config=grok_config) is None

    plan.approve_device(device["user_code"])
    creds = await grok.complete_device_sign_in(device, oauth_config=grok_config, timeout_s=10)

    assert creds["access_token"] == plan.issued[-1]["access_token"]
    assert creds["account_id"] == "acct-1"


async def test_grok_pkce_sign_in(plan: FakePlan) -> None:
    config = grok.config(client_id="test-client", issuer=plan.url, authorize_url=f"{plan.url}/oauth/authorize")
    sign_in = grok.start_sign_in(oauth_config=config)
    pasted = _browser_visits(sign_in["url"])
    assert pasted.startswith("http://127.0.0.1:56121/callback?")
    creds = await grok.finish_sign_in(sign_in, pasted, oauth_config=config)
    assert creds["access_token"] == plan.issued[-1]["access_token"]


async def test_refresh_rotates_and_grok_refuses_another_account(plan: FakePlan, chatgpt_config: OAuthConfig,
                                                                grok_config: OAuthConfig) -> None:
    creds = plan.seed_credentials()
    fresh = await chatgpt.refresh_credentials(creds, oauth_config=chatgpt_config)
    assert fresh["access_token"] != creds["access_token"] and fresh["refresh_token"] != creds["refresh_token"]
    with pytest.raises(FxProviderError) as info:
        await chatgpt.refresh_credentials(creds, oauth_config=chatgpt_config)  # the used refresh token
    assert info.value.code == "FX_PROVIDER_AUTH"
    assert creds["refresh_token"] not in info.value.message  # quoted back by the server, masked

    plan.refresh_account = "acct-2"
    with pytest.raises(FxProviderError) as info:
        await grok.refresh_credentials(fresh, oauth_config=grok_config)
    assert info.value.code == "FX_PROVIDER_ACCOUNT_MISMATCH"


async def test_a_device_code_not_entered_in_time_expires(plan: FakePlan, grok_config: OAuthConfig) -> None:
    device = await grok.start_device_sign_in(oauth_config=grok_config)
    with pytest.raises(FxProviderError) as info:
        await grok.complete_device_sign_in(device, oauth_config=grok_config, timeout_s=0.5)  # under one interval
    assert info.value.code == "FX_SIGN_IN_EXPIRED"
    with pytest.raises(FxProviderError) as info:
        await grok.poll_device_sign_in({**device, "expires_at": 0}, oauth_config=grok_config)
    assert info.value.code == "FX_SIGN_IN_EXPIRED"
