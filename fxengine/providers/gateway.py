"""The default provider: AI Gateway's OpenAI-compatible Chat Completions endpoint (§8)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import ModelEntry, Provider
from .credentials import gateway_key

GATEWAY_BASE_URL = "https://ai-gateway.vercel.sh/v1"


def gateway_provider(
    *, api_key: str | None, env: Mapping[str, str] | None = None, model_catalog: Mapping[str, Any] | None = None
) -> Provider:
    """AI Gateway with the key from `api_key`, `AI_GATEWAY_API_KEY` or `VERCEL_OIDC_TOKEN`.

    `model_catalog` (id -> entry, as in a custom provider) lets settings be checked
    offline; without it any model id and setting is passed through to the gateway.
    """
    from .custom import parse_models

    models: dict[str, ModelEntry] | None = parse_models(model_catalog) if model_catalog is not None else None
    return Provider("gateway", GATEWAY_BASE_URL, gateway_key(api_key, env), models)
