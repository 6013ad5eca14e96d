"""ChatGPT plans (`provider="codex"`): sign-in helpers and the Codex provider.

    from fxengine.providers import chatgpt

    sign_in = chatgpt.start_sign_in()                  # send the user to sign_in["url"]
    creds = await chatgpt.finish_sign_in(sign_in, pasted_address)

    device = await chatgpt.start_device_sign_in()      # show device["user_code"]
    creds = await chatgpt.complete_device_sign_in(device)   # or poll_device_sign_in(device)

After signing in, OpenAI opens ``http://localhost:1455/auth/callback?...``, a page that
does not load: the user copies its whole address back. The sign-in uses the Codex CLI's
OpenAI client. Every step takes and returns plain data; `config(issuer=...)` points
every endpoint elsewhere (a test server, a proxy).

Turns go to the Codex backend (`CODEX_BASE_URL`) in the Responses API shape, with the
user's access token and ChatGPT account id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import httpx

from . import oauth
from .auth import CredentialSource, CredentialsFn, OnCredentialsFn, RefreshLockFn
from .credentials import Credentials
from .base import WIRE_RESPONSES, ModelEntry, Provider
from .custom import check_base_url

PROVIDER = "codex"
ISSUER = "https://auth.openai.com"
CLIENT_ID = "app_EMoamEEZ73f0CkXaXp7hrann"
REDIRECT_URI = "http://localhost:1455/auth/callback"
SCOPE = "openid profile email offline_access"
CODEX_BASE_URL = "https://chatgpt.com/backend-api/codex"
_AUTH_CLAIM = "https://api.openai.com/auth"


def account_of(tokens: Mapping[str, object]) -> str | None:
    """The ChatGPT account id in a token response (the id or access token's auth claim)."""
    for key in ("id_token", "access_token"):
        auth = oauth.jwt_claims(tokens.get(key)).get(_AUTH_CLAIM)
        account = auth.get("chatgpt_account_id") if isinstance(auth, Mapping) else None
        if isinstance(account, str):
            return account
    return None


def config(*, issuer: str = ISSUER, client_id: str = CLIENT_ID, redirect_uri: str = REDIRECT_URI,
           **overrides: Any) -> oauth.OAuthConfig:
    """The OAuth config of ChatGPT sign-in, every endpoint under `issuer` unless overridden
    (`token_url=`, `authorize_url=`, `device_url=`, ...; see `oauth.OAuthConfig`)."""
    issuer = check_base_url(issuer).rstrip("/")
    base = oauth.OAuthConfig(
        provider=PROVIDER,
        client_id=client_id,
        authorize_url=f"{issuer}/oauth/authorize",
        token_url=f"{issuer}/oauth/token",
        redirect_uri=redirect_uri,
        scope=SCOPE,
        device_url=f"{issuer}/api/accounts/deviceauth/usercode",
        device_token_url=f"{issuer}/api/accounts/deviceauth/token",
        device_redirect_uri=f"{issuer}/deviceauth/callback",
        verification_url=f"{issuer}/codex/device",
        device_style=oauth.DEVICE_OPENAI,
        authorize_params={"id_token_add_organizations": "true", "codex_cli_simplified_flow": "true",
                          "originator": "codex_cli_rs"},
        account_of=account_of,
    )
    return dataclasses.replace(base, **overrides)


DEFAULT = config()


def start_sign_in(*, oauth_config: oauth.OAuthConfig | None = None) -> dict[str, object]:
    """Starts a PKCE sign-in (see `oauth.start_sign_in`); no request is sent."""
    return oauth.start_sign_in(oauth_config or DEFAULT)


async def finish_sign_in(sign_in: Mapping[str, object], pasted_url: str, *, oauth_config: oauth.OAuthConfig | None = None,
                         http_client: httpx.AsyncClient | None = None) -> Credentials:
    """Credentials from the address the user pasted back (see `oauth.finish_sign_in`)."""
    return await oauth.finish_sign_in(oauth_config or DEFAULT, sign_in, pasted_url, http_client=http_client)


async def start_device_sign_in(*, oauth_config: oauth.OAuthConfig | None = None,
                               http_client: httpx.AsyncClient | None = None) -> dict[str, object]:
    """Starts a device-code sign-in, where the account or workspace allows it."""
    return await oauth.start_device_sign_in(oauth_config or DEFAULT, http_client=http_client)


async def poll_device_sign_in(device: Mapping[str, object], *, oauth_config: oauth.OAuthConfig | None = None,
                              http_client: httpx.AsyncClient | None = None) -> Credentials | None:
    """Checks a device sign-in once: credentials, or None while the user has not entered the code."""
    return await oauth.poll_device_sign_in(oauth_config or DEFAULT, device, http_client=http_client)


async def complete_device_sign_in(device: Mapping[str, object], *, oauth_config: oauth.OAuthConfig | None = None,
                                  http_client: httpx.AsyncClient | None = None,
                                  timeout_s: float | None = None) -> Credentials:
    """Waits until the user entered the device code; the credentials."""
    return await oauth.complete_device_sign_in(oauth_config or DEFAULT, device, http_client=http_client,
                                               timeout_s=timeout_s)


async def refresh_credentials(creds: Mapping[str, object], *, oauth_config: oauth.OAuthConfig | None = None,
                              http_client: httpx.AsyncClient | None = None) -> Credentials:
    """New credentials from `creds`' refresh token (the engine does this on its own)."""
    return await oauth.refresh_credentials(oauth_config or DEFAULT, creds, http_client=http_client)


def request_headers(creds: Credentials) -> dict[str, str]:
    """The credential headers of a Codex request."""
    headers = {"authorization": f"Bearer {creds['access_token']}", "originator": "codex_cli_rs",
               "openai-beta": "responses=experimental"}
    account = creds.get("account_id") or account_of(creds)
    if account:
        headers["chatgpt-account-id"] = str(account)
    return headers


def provider(
    *,
    credentials: CredentialsFn,
    on_credentials: OnCredentialsFn | None = None,
    refresh_lock: RefreshLockFn | None = None,
    base_url: str = CODEX_BASE_URL,
    oauth_config: oauth.OAuthConfig | None = None,
    models: Mapping[str, ModelEntry] | None = None,
) -> Provider:
    """The Codex provider: requests to `{base_url}/responses` with the user's credentials,
    refreshed at `oauth_config`'s token endpoint."""
    cfg = oauth_config or DEFAULT

    async def refresh(client: httpx.AsyncClient, creds: Credentials) -> Credentials:
        return await oauth.refresh_credentials(cfg, creds, http_client=client)

    source = CredentialSource(PROVIDER, credentials=credentials, on_credentials=on_credentials,
                              refresh_lock=refresh_lock, refresh=refresh, headers=request_headers)
    return Provider(PROVIDER, check_base_url(base_url), None, models, {}, WIRE_RESPONSES, source)
