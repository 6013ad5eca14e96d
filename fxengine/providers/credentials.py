"""Credentials: where keys come from, and masking so a key never leaves in an error or event."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ..codes import Code
from ..errors import FxProviderError

GATEWAY_BASE_URL = "https://ai-gateway.vercel.sh/v1"
# AI Gateway's key, then the OIDC token Vercel injects into deployments (docs/design.md §8).
GATEWAY_KEY_VARIABLES = ("AI_GATEWAY_API_KEY", "VERCEL_OIDC_TOKEN")
_PREFIX_CHARS = 6

# Credentials as every step and callback passes them: `{"access_token", "refresh_token"?,
# "id_token"?, "expires_at"? (epoch ms), "account_id"?}` and whatever else a callback keeps.
Credentials = dict[str, object]


def gateway_key(api_key: str | None, env: Mapping[str, str] | None = None) -> str:
    """The AI Gateway key: `api_key`, then `AI_GATEWAY_API_KEY`, then `VERCEL_OIDC_TOKEN`.

    Raises:
        FxProviderError: `FX_PROVIDER_NO_CREDENTIALS` when none is set.
    """
    if api_key:
        return api_key
    source = os.environ if env is None else env
    for name in GATEWAY_KEY_VARIABLES:
        value = source.get(name)
        if value:
            return value
    raise FxProviderError(
        "no AI Gateway key: pass api_key= or set AI_GATEWAY_API_KEY (or VERCEL_OIDC_TOKEN)",
        code=Code.PROVIDER_NO_CREDENTIALS,
    )


def gateway_base_url(env: Mapping[str, str] | None = None) -> str:
    """Where AI Gateway requests go: `AI_GATEWAY_BASE_URL` (a proxy, a test server), else the Gateway."""
    source = os.environ if env is None else env
    return source.get("AI_GATEWAY_BASE_URL") or GATEWAY_BASE_URL


def mask(secret: str) -> str:
    """A form of `secret` safe to show: its first few characters and a run of stars."""
    return secret[:3] + "****" if len(secret) > 8 else "****"


def mask_secret(text: str, secret: str | None) -> str:
    """Replaces `secret` in `text`, and any token starting like it (a key a server quotes
    back partly starred, such as ``sk-abc1********wxyz``), with a masked form."""
    if not secret or not text:
        return text
    text = text.replace(secret, mask(secret))
    if len(secret) >= 2 * _PREFIX_CHARS:
        prefix = re.escape(secret[:_PREFIX_CHARS])
        text = re.sub(prefix + r"[^\s\"',;]*", mask(secret), text)
    return text


def mask_secrets(text: str, secrets: list[str] | tuple[str, ...]) -> str:
    """`mask_secret` for each of `secrets`, longest first (a token containing another)."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = mask_secret(text, secret)
    return text
