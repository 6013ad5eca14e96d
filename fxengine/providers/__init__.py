"""Providers: where requests go and with which credentials (the wire format is in `models/`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import FxInputError
from .base import ModelEntry, ModelSpec, Provider
from .credentials import mask_secret
from .custom import custom_provider
from .gateway import GATEWAY_BASE_URL, gateway_provider

EFFORT_MAX_BYTES = 64
MODEL_ID_MAX_BYTES = 1024
_MODEL_KEYS = ("id", "effort", "fast", "ultrafast")

__all__ = [
    "GATEWAY_BASE_URL",
    "ModelEntry",
    "ModelSpec",
    "Provider",
    "custom_provider",
    "gateway_provider",
    "mask_secret",
    "resolve_model",
    "resolve_provider",
]


def resolve_provider(
    provider: Mapping[str, Any] | Provider | None,
    *,
    api_key: str | None,
    env: Mapping[str, str] | None = None,
    model_catalog: Mapping[str, Any] | None = None,
) -> Provider:
    """AI Gateway when `provider` is None, else the validated custom provider."""
    if isinstance(provider, Provider):
        return provider
    if provider is None:
        return gateway_provider(api_key=api_key, env=env, model_catalog=model_catalog)
    return custom_provider(provider, api_key=api_key)


def resolve_model(model: str | Mapping[str, Any], provider: Provider) -> ModelSpec:
    """Validates `model` (an id, or ``{"id", "effort"?, "fast"?, "ultrafast"?}``).

    Raises:
        FxInputError: `FX_INVALID_INPUT` for a malformed model, `FX_MODEL_UNKNOWN` for an
            id the provider's catalog lacks, `FX_MODEL_UNSUPPORTED_EFFORT` / `_FAST` /
            `_ULTRAFAST` for a setting the catalog entry does not offer.
    """
    if isinstance(model, str):
        spec: dict[str, Any] = {"id": model}
    elif isinstance(model, Mapping):
        unknown = set(model) - set(_MODEL_KEYS)
        if unknown:
            raise FxInputError(f"unsupported model option: {', '.join(sorted(unknown))}")
        spec = dict(model)
    else:
        raise FxInputError("model must be a model id or {id, effort?, fast?, ultrafast?}")
    model_id = spec.get("id")
    if not isinstance(model_id, str) or not model_id or len(model_id.encode()) > MODEL_ID_MAX_BYTES:
        raise FxInputError("model id must be a non-empty string of at most 1024 bytes")
    effort = spec.get("effort")
    if effort is not None and (not isinstance(effort, str) or not effort or len(effort.encode()) > EFFORT_MAX_BYTES):
        raise FxInputError("model effort must be a short string")
    for flag in ("fast", "ultrafast"):
        if spec.get(flag) is not None and not isinstance(spec.get(flag), bool):
            raise FxInputError(f"model {flag} must be a boolean")
    fast = bool(spec.get("fast"))
    ultrafast = bool(spec.get("ultrafast"))
    entry: ModelEntry | None = None
    if provider.models is not None:
        entry = provider.models.get(model_id)
        if entry is None:
            raise FxInputError(f"provider {provider.name} has no model {model_id}", code="FX_MODEL_UNKNOWN")
        if effort is not None and (entry.efforts is None or effort not in entry.efforts):
            raise FxInputError(f"model {model_id} does not support effort {effort!r}", code="FX_MODEL_UNSUPPORTED_EFFORT")
        if fast and not entry.supports_fast:
            raise FxInputError(f"model {model_id} does not support fast", code="FX_MODEL_UNSUPPORTED_FAST")
        if ultrafast and not entry.supports_ultrafast:
            raise FxInputError(f"model {model_id} does not support ultrafast", code="FX_MODEL_UNSUPPORTED_ULTRAFAST")
    return ModelSpec(model_id, effort, fast, ultrafast, entry)
