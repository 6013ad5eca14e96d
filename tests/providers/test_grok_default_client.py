"""Grok by name: sign-in and refresh with the default xAI client (the fx CLI's public one),
against a local fake of xAI's issuer and API; the account comes from the user info
endpoint when the tokens are opaque, and a refresh of another account is refused."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from fxengine import create_engine
from fxengine.errors import FxProviderError
from fxengine.providers import grok
from tests.providers.conftest import CredentialStore
from tests.providers.fakes import FakePlan


@pytest.fixture
def xai(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePlan]:
    """The fake issuer as xAI's: the default config with every endpoint under the fake, as
    a provider given by name uses it; tokens opaque (no id token)."""
    with FakePlan() as plan:
        plan.opaque = True
        monkeypatch.setattr(grok, "DEFAULT", grok.config(issuer=plan.url))
        yield plan


def _token_forms(plan: FakePlan) -> list[dict[str, str]]:
    return [{k: v[0] for k, v in parse_qs(raw.decode()).items()}
            for _, path, _, raw in plan.requests if path == "/oauth2/token"]


def test_the_default_client_is_xais_public_one() -> None:
    assert grok.DEFAULT.client_id == grok.CLIENT_ID == "b1a00492-073a-47ea-816f-4c329264a828"
    assert (grok.DEFAULT.authorize_url, grok.DEFAULT.token_url, grok.DEFAULT.userinfo_url) == (
        "https://auth.x.ai/oauth2/authorize", "https://auth.x.ai/oauth2/token", "https://auth.x.ai/oauth2/userinfo")
    assert grok.DEFAULT.scope == "openid profile email offline_access grok-cli:access api:access"
    assert grok.config(client_id="mine").client_id == "mine"


async def test_sign_in_with_the_default_client_and_the_account_check(xai: FakePlan) -> None:
    sign_in = grok.start_sign_in()
    query = parse_qs(urlsplit(sign_in["url"]).query)
    assert sign_in["url"].startswith(f"{xai.url}/oauth2/authorize?")
    assert query["client_id"] == [grok.CLIENT_ID] and "grok-cli:access" in query["scope"][0]
    pasted = httpx.get(sign_in["url"], follow_redirects=False, timeout=5.0).headers["location"]
    assert pasted.startswith("http://127.0.0.1:56121/callback?code=")

    creds = await grok.finish_sign_in(sign_in, pasted)

    assert _token_forms(xai)[-1]["client_id"] == grok.CLIENT_ID
    assert creds["access_token"] == xai.issued[-1]["access_token"] and "id_token" not in creds
    assert creds["account_id"] == "acct-1"  # from /oauth2/userinfo: the tokens are opaque
    assert "/oauth2/userinfo" in xai.paths()


async def test_by_name_it_refreshes_before_expiry_and_after_a_401(xai: FakePlan) -> None:
    store = CredentialStore(xai.seed_credentials(expires_in_s=30))  # inside the refresh margin
    # As `provider="grok"` builds it (`resolve_provider`): no oauth_config, only the API moved.
    provider = grok.provider(credentials=store.load, on_credentials=store.save, base_url=f"{xai.url}/v1")
    engine = await create_engine("grok-4", provider=provider, session_id="s-1")
    try:
        assert (await engine.prompt("hi").result()).stop_reason == "end_turn"
        assert xai.refreshes == 1 and _token_forms(xai)[-1]["client_id"] == grok.CLIENT_ID
        assert store.saved[-1][0]["account_id"] == "acct-1"

        xai.revoke(store.creds["access_token"])  # the next request gets a 401
        result = await engine.prompt("again").result()
        assert result.stop_reason == "end_turn", result.error
        assert xai.refreshes == 2 and len(store.saved) == 2
        assert xai.api_calls[-1]["token"] == store.creds["access_token"] == xai.issued[-1]["access_token"]
    finally:
        await engine.close()


async def test_a_refresh_the_user_info_names_for_another_account_is_refused(xai: FakePlan) -> None:
    creds = xai.seed_credentials()
    xai.refresh_account = "acct-2"
    with pytest.raises(FxProviderError) as info:
        await grok.refresh_credentials(creds)
    assert info.value.code == "FX_PROVIDER_ACCOUNT_MISMATCH"
