"""Grok plans (`provider="grok"`): sign-in helpers and the xAI provider.

    from fxengine.providers import grok

    sign_in = grok.start_sign_in()                   # send the user to sign_in["url"]
    creds = await grok.finish_sign_in(sign_in, pasted_address)

    device = await grok.start_device_sign_in()       # show device["user_code"]
    creds = await grok.complete_device_sign_in(device)

After signing in, xAI opens ``http://127.0.0.1:56121/callback?...``, a page that does not
load: the user copies its whole address back. Sign-in and refresh use the fx CLI's public
xAI client (`CLIENT_ID`) unless `config(client_id=...)` names your own; `config(issuer=...)`
points every endpoint elsewhere (a test server, a proxy). The account is the `sub` of the
id token, else of the user info endpoint; refreshed credentials must belong to the same
account (`FX_PROVIDER_ACCOUNT_MISMATCH` otherwise; nothing is saved). Turns go to xAI's
Chat Completions API (`XAI_BASE_URL`) with the user's access token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import httpx

from ..codes import Code
from ..errors import FxInputError
from . import oauth
from .auth import CredentialSource, CredentialsFn, OnCredentialsFn, RefreshLockFn, bearer_headers
from .credentials import Credentials
from .base import WIRE_CHAT, ModelEntry, Provider
from .custom import check_base_url

PROVIDER = "grok"
ISSUER = "https://auth.x.ai"
# The fx CLI's public OAuth client for xAI (a public client: PKCE, no secret).
CLIENT_ID = "b1a00492-073a-47ea-816f-4c329264a828"
REDIRECT_URI = "http://127.0.0.1:56121/callback"
SCOPE = "openid profile email offline_access grok-cli:access api:access"
XAI_BASE_URL = "https://api.x.ai/v1"


def account_of(tokens: Mapping[str, object]) -> str | None:
    """The xAI account of a token response: the `sub` of its id token (else of its access token)."""
    for key in ("id_token", "access_token"):
        sub = oauth.jwt_claims(tokens.get(key)).get("sub")
        if isinstance(sub, str) and sub:
            return sub
    return None


def config(*, client_id: str = CLIENT_ID, issuer: str = ISSUER, redirect_uri: str = REDIRECT_URI,
           **overrides: Any) -> oauth.OAuthConfig:
    """The OAuth config of Grok sign-in, every endpoint under `issuer` unless overridden
    (`token_url=`, `authorize_url=`, `userinfo_url=`, ...; see `oauth.OAuthConfig`)."""
    if not isinstance(client_id, str) or not client_id:
        raise FxInputError("grok sign-in needs the client_id of your xAI OAuth client", code=Code.PROVIDER_INVALID)
    issuer = check_base_url(issuer).rstrip("/")
    base = oauth.OAuthConfig(
        provider=PROVIDER,
        client_id=client_id,
        authorize_url=f"{issuer}/oauth2/authorize",
        token_url=f"{issuer}/oauth2/token",
        redirect_uri=redirect_uri,
        scope=SCOPE,
        device_url=f"{issuer}/oauth2/device/code",
        verification_url=f"{issuer}/device",
        device_style=oauth.DEVICE_RFC8628,
        account_of=account_of,
        same_account=True,
        userinfo_url=f"{issuer}/oauth2/userinfo",
    )
    return dataclasses.replace(base, **overrides)


DEFAULT = config()


def start_sign_in(*, oauth_config: oauth.OAuthConfig | None = None) -> dict[str, object]:
    """Starts a PKCE sign-in (see `oauth.start_sign_in`); no request is sent."""
    return oauth.start_sign_in(oauth_config or DEFAULT)


async def finish_sign_in(sign_in: Mapping[str, object], pasted_url: str, *, oauth_config: oauth.OAuthConfig | None = None,
                         http_client: httpx.AsyncClient | None = None) -> Credentials:
    """Credentials from the address the user pasted back."""
    return await oauth.finish_sign_in(oauth_config or DEFAULT, sign_in, pasted_url, http_client=http_client)


async def start_device_sign_in(*, oauth_config: oauth.OAuthConfig | None = None,
                               http_client: httpx.AsyncClient | None = None) -> dict[str, object]:
    """Starts a device-code sign-in (RFC 8628)."""
    return await oauth.start_device_sign_in(oauth_config or DEFAULT, http_client=http_client)


async def poll_device_sign_in(device: Mapping[str, object], *, oauth_config: oauth.OAuthConfig | None = None,
                              http_client: httpx.AsyncClient | None = None) -> Credentials | None:
    """Checks a device sign-in once: credentials, or None while it is pending."""
    return await oauth.poll_device_sign_in(oauth_config or DEFAULT, device, http_client=http_client)


async def complete_device_sign_in(device: Mapping[str, object], *, oauth_config: oauth.OAuthConfig | None = None,
                                  http_client: httpx.AsyncClient | None = None,
                                  timeout_s: float | None = None) -> Credentials:
    """Waits until the user entered the device code; the credentials."""
    return await oauth.complete_device_sign_in(oauth_config or DEFAULT, device, http_client=http_client, timeout_s=timeout_s)


async def refresh_credentials(creds: Mapping[str, object], *, oauth_config: oauth.OAuthConfig | None = None,
                              http_client: httpx.AsyncClient | None = None) -> Credentials:
    """New credentials of the same xAI account (`FX_PROVIDER_ACCOUNT_MISMATCH` otherwise)."""
    return await oauth.refresh_credentials(oauth_config or DEFAULT, creds, http_client=http_client)


def provider(
    *,
    credentials: CredentialsFn,
    oauth_config: oauth.OAuthConfig | None = None,
    on_credentials: OnCredentialsFn | None = None,
    refresh_lock: RefreshLockFn | None = None,
    base_url: str = XAI_BASE_URL,
    models: Mapping[str, ModelEntry] | None = None,
) -> Provider:
    """The Grok provider: Chat Completions at `base_url` with the user's credentials,
    refreshed at `oauth_config`'s token endpoint (the default client's unless given)."""
    cfg = oauth_config or DEFAULT

    async def refresh(client: httpx.AsyncClient, creds: Credentials) -> Credentials:
        return await oauth.refresh_credentials(cfg, creds, http_client=client)

    source = CredentialSource(PROVIDER, credentials=credentials, on_credentials=on_credentials,
                              refresh_lock=refresh_lock, refresh=refresh, headers=bearer_headers)
    return Provider(PROVIDER, check_base_url(base_url), None, models, {}, WIRE_CHAT, source)
