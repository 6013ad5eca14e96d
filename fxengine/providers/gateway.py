"""The default provider: AI Gateway's OpenAI-compatible Chat Completions endpoint (§8)."""

from __future__ import annotations

from collections.abc import Mapping

from .base import ModelEntry, Provider
from .catalog import parse_catalog
from .credentials import GATEWAY_BASE_URL, gateway_base_url, gateway_key
from .custom import check_base_url

__all__ = ["GATEWAY_BASE_URL", "gateway_provider"]


def gateway_provider(
    *,
    api_key: str | None,
    env: Mapping[str, str] | None = None,
    model_catalog: object = None,
    base_url: str | None = None,
) -> Provider:
    """AI Gateway with the key from `api_key`, `AI_GATEWAY_API_KEY` or `VERCEL_OIDC_TOKEN`.

    `model_catalog` (either form of `providers.catalog.parse_catalog`) lets settings be
    checked offline; without it any model id and setting is passed through to the
    gateway. `base_url` (else `AI_GATEWAY_BASE_URL`) points it elsewhere (a proxy, a test
    server): requests go to ``{base_url}/chat/completions`` and the catalog is
    ``{base_url}/models``.
    """
    base_url = base_url or gateway_base_url(env)
    models: dict[str, ModelEntry] | None = parse_catalog(model_catalog) if model_catalog is not None else None
    return Provider("gateway", check_base_url(base_url), gateway_key(api_key, env), models)
