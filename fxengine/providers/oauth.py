"""OAuth sign-in and refresh for plan providers: PKCE, device code, refresh token.

`fxengine.providers.chatgpt` and `fxengine.providers.grok` are thin faces over these
functions with their provider's `OAuthConfig`. Every step takes and returns plain data
(dicts of strings and numbers), so one request can start a sign-in and a later request,
in another process, finish it. Every endpoint is in the config, so tests (and private
deployments) point them at their own servers.

Credentials, as every step returns them:

    {"access_token", "refresh_token", "id_token"?, "expires_at"? (epoch ms), "account_id"?}

A failed step raises `FxProviderError` with `FX_SIGN_IN_FAILED` (refused, denied,
mismatched state, malformed answer), `FX_SIGN_IN_EXPIRED` (a device code that timed
out) or `FX_PROVIDER_UNREACHABLE`; a refused refresh is `FX_PROVIDER_AUTH`. Tokens a
server quotes back in an error are masked.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx

from ..codes import Code
from ..errors import FxProviderError
from .credentials import Credentials, mask_secrets

DEVICE_RFC8628 = "rfc8628"
DEVICE_OPENAI = "openai"
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
HTTP_TIMEOUT = httpx.Timeout(15.0)
DEVICE_TIMEOUT_S = 15 * 60.0

AccountOf = Callable[[Mapping[str, object]], "str | None"]


def _no_account(tokens: Mapping[str, object]) -> str | None:
    return None


@dataclass(frozen=True)
class OAuthConfig:
    """One provider's OAuth client and endpoints.

    Attributes:
        provider: the provider name the credentials are for (`codex`, `grok`).
        client_id: the OAuth client.
        authorize_url, token_url: the authorization-code endpoints.
        redirect_uri: where the browser lands after sign-in (the user pastes that address).
        scope: the scopes asked for.
        device_url: where a device sign-in starts; `device_token_url` where it is polled
            (RFC 8628 polls `token_url`); `verification_url` the page the user opens.
        device_style: `rfc8628`, or `openai` (the Codex device flow: poll for an
            authorization code, then exchange it with `device_redirect_uri`).
        authorize_params: extra query parameters of the authorization URL.
        account_of: the account id in a token response (None when it names none).
        same_account: refuse refreshed credentials of another account.
        userinfo_url: the OpenID Connect user info endpoint, asked for the account (its
            `sub`) when a token response names none: after a sign-in and a refresh.
    """

    provider: str
    client_id: str
    authorize_url: str
    token_url: str
    redirect_uri: str
    scope: str
    device_url: str
    verification_url: str
    device_style: str = DEVICE_RFC8628
    device_token_url: str | None = None
    device_redirect_uri: str | None = None
    authorize_params: Mapping[str, str] = field(default_factory=dict)
    account_of: AccountOf = _no_account
    same_account: bool = False
    userinfo_url: str | None = None


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt_claims(token: object) -> dict[str, object]:
    """The payload of a JWT, unverified (it came straight from the token endpoint over
    TLS); {} for anything that is not one."""
    if not isinstance(token, str) or token.count(".") != 2:
        return {}
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, TypeError):
        return {}
    return claims if isinstance(claims, dict) else {}


def _client(http_client: httpx.AsyncClient | None) -> tuple[httpx.AsyncClient, bool]:
    if http_client is not None:
        return http_client, False
    return httpx.AsyncClient(timeout=HTTP_TIMEOUT), True


async def _request(
    config: OAuthConfig, method: str, url: str, *, what: str, form: Mapping[str, str] | None = None,
    json_body: Mapping[str, object] | None = None, headers: Mapping[str, str] | None = None,
    http_client: httpx.AsyncClient | None, hide: list[str],
) -> tuple[int, object, str]:
    """One request to `config`'s `what` (an OAuth endpoint): (status, parsed JSON or None,
    error text masked of `hide`); `FX_PROVIDER_UNREACHABLE` when it cannot be reached."""
    client, own = _client(http_client)
    try:
        response = await client.request(method, url, data=form, json=json_body,
                                        headers={"accept": "application/json", **(headers or {})})
        raw = response.text
    except httpx.HTTPError as exc:
        raise FxProviderError(f"cannot reach {config.provider}'s {what} ({type(exc).__name__})",
                              code=Code.PROVIDER_UNREACHABLE) from None
    finally:
        if own:
            await client.aclose()
    try:
        body: object = json.loads(raw) if raw else None
    except ValueError:
        body = None
    return response.status_code, body, mask_secrets(raw[:500], hide)


async def _post(
    config: OAuthConfig, url: str, *, form: Mapping[str, str] | None = None,
    json_body: Mapping[str, object] | None = None, http_client: httpx.AsyncClient | None, hide: list[str],
) -> tuple[int, object, str]:
    """POSTs to an OAuth endpoint of the sign-in server (see `_request`)."""
    return await _request(config, "POST", url, what="sign-in server", form=form, json_body=json_body,
                          http_client=http_client, hide=hide)


async def _with_account(config: OAuthConfig, creds: Credentials, http_client: httpx.AsyncClient | None,
                        code: str) -> Credentials:
    """`creds` with their `account_id` from the user info endpoint when the tokens named none.

    Raises:
        FxProviderError: `code` when the endpoint refuses the new access token or names no
            account; `FX_PROVIDER_UNREACHABLE` when it cannot be reached.
    """
    if "account_id" in creds or config.userinfo_url is None:
        return creds
    token = str(creds["access_token"])  # a string: `credentials_from` took only one
    status, body, text = await _request(config, "GET", config.userinfo_url, what="user info endpoint",
                                        headers={"authorization": f"Bearer {token}"}, http_client=http_client,
                                        hide=[token])
    sub = body.get("sub") if status == 200 and isinstance(body, Mapping) else None
    if not isinstance(sub, str) or not sub:
        raise FxProviderError(f"{config.provider}'s user info endpoint named no account (HTTP {status}): {text}",
                              code=code)
    return {**creds, "account_id": sub}


def _error_name(body: object) -> str | None:
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, str):
            return error
        code = error.get("code") if isinstance(error, Mapping) else None
        if isinstance(code, str):
            return code
    return None


def credentials_from(config: OAuthConfig, tokens: object, *, now_s: float | None = None) -> Credentials:
    """Credentials from a token endpoint's answer (`FX_SIGN_IN_FAILED` when it has no token)."""
    if not isinstance(tokens, Mapping) or not isinstance(tokens.get("access_token"), str):
        raise FxProviderError(f"{config.provider}'s token endpoint answered without an access token",
                              code=Code.SIGN_IN_FAILED)
    now_s = time.time() if now_s is None else now_s
    creds: Credentials = {"access_token": tokens["access_token"]}
    for key in ("refresh_token", "id_token"):
        if isinstance(tokens.get(key), str):
            creds[key] = tokens[key]
    expires_in = tokens.get("expires_in")
    if isinstance(expires_in, (int, float)) and not isinstance(expires_in, bool):
        creds["expires_at"] = int((now_s + expires_in) * 1000)
    else:
        exp = jwt_claims(tokens["access_token"]).get("exp")
        if isinstance(exp, (int, float)) and not isinstance(exp, bool):
            creds["expires_at"] = int(exp * 1000)
    account = config.account_of(tokens)
    if account:
        creds["account_id"] = account
    return creds


async def _token_request(config: OAuthConfig, form: dict[str, str], http_client: httpx.AsyncClient | None,
                         hide: list[str]) -> Credentials:
    status, body, text = await _post(config, config.token_url, form=form, http_client=http_client, hide=hide)
    if status != 200:
        raise FxProviderError(f"{config.provider}'s token endpoint answered HTTP {status}: {text}",
                              code=Code.SIGN_IN_FAILED)
    return await _with_account(config, credentials_from(config, body), http_client, Code.SIGN_IN_FAILED)


# ------------------------------------------------------------------- authorization code


def start_sign_in(config: OAuthConfig) -> dict[str, object]:
    """Starts a PKCE sign-in: send the user to `url`, keep the whole dict on the server.

    Returns:
        ``{"provider", "url", "state", "code_verifier", "redirect_uri", "started_at"}``.
    """
    verifier = _b64url(secrets.token_bytes(48))
    state = _b64url(secrets.token_bytes(24))
    query = {
        "response_type": "code",
        "client_id": config.client_id,
        "redirect_uri": config.redirect_uri,
        "scope": config.scope,
        "code_challenge": _b64url(hashlib.sha256(verifier.encode()).digest()),
        "code_challenge_method": "S256",
        "state": state,
        **config.authorize_params,
    }
    return {
        "provider": config.provider,
        "url": f"{config.authorize_url}?{urlencode(query)}",
        "state": state,
        "code_verifier": verifier,
        "redirect_uri": config.redirect_uri,
        "started_at": int(time.time() * 1000),
    }


async def finish_sign_in(config: OAuthConfig, sign_in: Mapping[str, object], pasted_url: str, *,
                         http_client: httpx.AsyncClient | None = None) -> Credentials:
    """Exchanges the code in the address the user pasted back for credentials.

    Raises:
        FxProviderError: `FX_SIGN_IN_FAILED` for an address without a code, a state that
            is not this sign-in's, an error the server put in the address, or a refused
            exchange.
    """
    verifier = sign_in.get("code_verifier") if isinstance(sign_in, Mapping) else None
    if not isinstance(verifier, str):
        raise FxProviderError("finish_sign_in needs the dict start_sign_in returned", code=Code.SIGN_IN_FAILED)
    if not isinstance(pasted_url, str):
        raise FxProviderError("the pasted address must be a string", code=Code.SIGN_IN_FAILED)
    query = parse_qs(urlsplit(pasted_url.strip()).query)
    if "error" in query:
        raise FxProviderError(f"{config.provider} sign-in failed: {query['error'][0][:200]}", code=Code.SIGN_IN_FAILED)
    codes = query.get("code")
    code = codes[0] if codes else None
    if not code:
        raise FxProviderError("the pasted address holds no authorization code", code=Code.SIGN_IN_FAILED)
    states = query.get("state")
    if (states[0] if states else None) != sign_in.get("state"):
        raise FxProviderError("the pasted address is from another sign-in (state differs)", code=Code.SIGN_IN_FAILED)
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": str(sign_in.get("redirect_uri") or config.redirect_uri),
        "client_id": config.client_id,
        "code_verifier": verifier,
    }
    return await _token_request(config, form, http_client, [code, verifier])


# ------------------------------------------------------------------------- device code


async def start_device_sign_in(config: OAuthConfig, *,
                               http_client: httpx.AsyncClient | None = None) -> dict[str, object]:
    """Starts a device sign-in: show `user_code` and a link to `verification_url`.

    Returns:
        ``{"provider", "device_code", "user_code", "verification_url", "interval_s",
        "expires_at"}`` (plain data; poll it from any process).
    """
    if config.device_style == DEVICE_OPENAI:
        status, body, text = await _post(config, config.device_url, json_body={"client_id": config.client_id},
                                         http_client=http_client, hide=[])
        device_code = body.get("device_auth_id") if isinstance(body, Mapping) else None
        user_code = (body.get("user_code") or body.get("usercode")) if isinstance(body, Mapping) else None
    else:
        status, body, text = await _post(config, config.device_url,
                                         form={"client_id": config.client_id, "scope": config.scope},
                                         http_client=http_client, hide=[])
        device_code = body.get("device_code") if isinstance(body, Mapping) else None
        user_code = body.get("user_code") if isinstance(body, Mapping) else None
    if status != 200 or not isinstance(device_code, str) or not isinstance(user_code, str):
        raise FxProviderError(f"{config.provider} did not start a device sign-in (HTTP {status}): {text}",
                              code=Code.SIGN_IN_FAILED)
    assert isinstance(body, Mapping)  # a device code came in it
    interval = body.get("interval")
    try:
        interval_s = max(1.0, float(interval)) if isinstance(interval, (int, float, str)) else 5.0
    except ValueError:
        interval_s = 5.0
    expires_in = body.get("expires_in")
    lifetime_s = float(expires_in) if isinstance(expires_in, (int, float)) and not isinstance(expires_in, bool) \
        else DEVICE_TIMEOUT_S
    verification = body.get("verification_uri_complete") or body.get("verification_uri") or config.verification_url
    return {
        "provider": config.provider,
        "device_code": device_code,
        "user_code": user_code,
        "verification_url": str(verification),
        "interval_s": interval_s,
        "expires_at": int((time.time() + lifetime_s) * 1000),
    }


async def poll_device_sign_in(config: OAuthConfig, device: Mapping[str, object], *,
                              http_client: httpx.AsyncClient | None = None) -> Credentials | None:
    """Checks a device sign-in once: credentials when the user entered the code, else None.

    Raises:
        FxProviderError: `FX_SIGN_IN_EXPIRED` once the code expired, `FX_SIGN_IN_FAILED`
            when the user or the server refused.
    """
    device_code = device.get("device_code") if isinstance(device, Mapping) else None
    if not isinstance(device_code, str):
        raise FxProviderError("poll_device_sign_in needs the dict start_device_sign_in returned",
                              code=Code.SIGN_IN_FAILED)
    if time.time() * 1000 >= _number(device.get("expires_at") or 0):
        raise FxProviderError(f"the {config.provider} device code expired", code=Code.SIGN_IN_EXPIRED)
    if config.device_style == DEVICE_OPENAI:
        return await _poll_openai(config, device_code, device["user_code"], http_client)
    form = {"grant_type": DEVICE_GRANT, "device_code": device_code, "client_id": config.client_id}
    status, body, text = await _post(config, config.token_url, form=form, http_client=http_client,
                                     hide=[device_code])
    if status == 200:
        return await _with_account(config, credentials_from(config, body), http_client, Code.SIGN_IN_FAILED)
    error = _error_name(body)
    if error in ("authorization_pending", "slow_down"):
        return None
    if error == "expired_token":
        raise FxProviderError(f"the {config.provider} device code expired", code=Code.SIGN_IN_EXPIRED)
    raise FxProviderError(f"{config.provider} device sign-in failed (HTTP {status}): {text}", code=Code.SIGN_IN_FAILED)


def _number(value: object) -> float:
    """A number of a device dict (as `float()` reads it; a TypeError for anything else)."""
    if isinstance(value, (int, float, str)):
        return float(value)
    raise TypeError(f"not a number: {type(value).__name__}")


async def _poll_openai(config: OAuthConfig, device_code: str, user_code: object,
                       http_client: httpx.AsyncClient | None) -> Credentials | None:
    """The Codex device flow: a pending code answers 403 or 404; a confirmed one an
    authorization code and its PKCE verifier, exchanged at the token endpoint."""
    url = config.device_token_url or config.token_url
    status, body, text = await _post(config, url, json_body={"device_auth_id": device_code, "user_code": user_code},
                                     http_client=http_client, hide=[device_code])
    if status in (403, 404):
        return None
    code = body.get("authorization_code") if isinstance(body, Mapping) else None
    verifier = body.get("code_verifier") if isinstance(body, Mapping) else None
    if status != 200 or not isinstance(code, str) or not isinstance(verifier, str):
        raise FxProviderError(f"{config.provider} device sign-in failed (HTTP {status}): {text}",
                              code=Code.SIGN_IN_FAILED)
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": config.device_redirect_uri or config.redirect_uri,
        "client_id": config.client_id,
        "code_verifier": verifier,
    }
    return await _token_request(config, form, http_client, [code, verifier])


async def complete_device_sign_in(config: OAuthConfig, device: Mapping[str, object], *,
                                  http_client: httpx.AsyncClient | None = None,
                                  timeout_s: float | None = None) -> Credentials:
    """Polls a device sign-in at its interval until the user entered the code.

    Raises:
        FxProviderError: as `poll_device_sign_in`; `FX_SIGN_IN_EXPIRED` also when
            `timeout_s` passes first.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    interval_s = _number(device.get("interval_s") or 5.0) if isinstance(device, Mapping) else 5.0
    while True:
        creds = await poll_device_sign_in(config, device, http_client=http_client)
        if creds is not None:
            return creds
        if deadline is not None and time.monotonic() + interval_s > deadline:
            raise FxProviderError(f"the {config.provider} device sign-in did not finish in time",
                                  code=Code.SIGN_IN_EXPIRED)
        await asyncio.sleep(interval_s)


# ----------------------------------------------------------------------------- refresh


async def refresh_credentials(config: OAuthConfig, creds: Mapping[str, object], *,
                              http_client: httpx.AsyncClient | None = None) -> Credentials:
    """New credentials from `creds`' refresh token (a refresh token not rotated is kept).

    Raises:
        FxProviderError: `FX_PROVIDER_AUTH` when the provider refuses the refresh token or
            the credentials have none; `FX_PROVIDER_ACCOUNT_MISMATCH` when the provider
            checks accounts (`same_account`) and the new credentials are another account's.
    """
    refresh_token = creds.get("refresh_token") if isinstance(creds, Mapping) else None
    if not isinstance(refresh_token, str) or not refresh_token:
        raise FxProviderError(f"the {config.provider} credentials have no refresh_token", code=Code.PROVIDER_AUTH)
    hide = [refresh_token, str(creds.get("access_token") or "")]
    form = {"grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": config.client_id,
            "scope": config.scope}
    status, body, text = await _post(config, config.token_url, form=form, http_client=http_client, hide=hide)
    if status != 200:
        raise FxProviderError(f"refreshing the {config.provider} credentials failed (HTTP {status}): {text}",
                              code=Code.PROVIDER_AUTH)
    try:
        fresh = credentials_from(config, body)
    except FxProviderError as exc:
        raise FxProviderError(exc.message, code=Code.PROVIDER_AUTH) from None
    fresh.setdefault("refresh_token", refresh_token)
    old_account = creds.get("account_id")
    if config.same_account and old_account:
        fresh = await _with_account(config, fresh, http_client, Code.PROVIDER_AUTH)
    if config.same_account and old_account and fresh.get("account_id") != old_account:
        raise FxProviderError(f"the refreshed {config.provider} credentials belong to another account",
                              code=Code.PROVIDER_ACCOUNT_MISMATCH)
    if old_account and "account_id" not in fresh:
        fresh["account_id"] = old_account
    return fresh
