"""Providers: where requests go and with which credentials (the wire format is in `models/`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import FxInputError
from ..limits import is_utf8
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
    "check_model",
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


def catalog_of(
    provider: Mapping[str, Any] | Provider | None, *, model_catalog: Mapping[str, Any] | None = None
) -> Mapping[str, ModelEntry] | None:
    """The model catalog requests to `provider` are checked against, without credentials.

    A custom provider dict is validated whole (`FX_PROVIDER_INVALID`) and its `models` are
    the catalog; AI Gateway (`provider=None`) has `model_catalog` when given, else no
    catalog (any id and setting goes through to the gateway).
    """
    if isinstance(provider, Provider):
        return provider.models
    if provider is None:
        from .custom import parse_models

        return parse_models(model_catalog) if model_catalog is not None else None
    return custom_provider(provider).models


def check_model(
    model: Any,
    provider: Mapping[str, Any] | Provider | None = None,
    *,
    model_catalog: Mapping[str, Any] | None = None,
) -> ModelSpec:
    """Validates a model setting against the catalog the engine would use; the one check
    `create_engine` and the durable layer (`fxworker.Agent`, `Session`) share.

    Args:
        model: a model id, or ``{"id", "effort"?, "fast"?, "ultrafast"?}``.
        provider: None (AI Gateway), a custom provider dict, or a resolved `Provider`.
        model_catalog: AI Gateway's catalog (id -> entry, as in a custom provider).

    Touches no network and needs no credentials.

    Raises:
        FxInputError: `FX_INVALID_INPUT` for a malformed model, `FX_MODEL_UNKNOWN` for an
            id the catalog lacks, `FX_MODEL_UNSUPPORTED_EFFORT` / `_FAST` / `_ULTRAFAST`
            for a setting the catalog entry does not offer, `FX_PROVIDER_INVALID` for a
            malformed custom provider.
    """
    models = catalog_of(provider, model_catalog=model_catalog)
    if isinstance(model, str):
        spec: dict[str, Any] = {"id": model}
    elif isinstance(model, Mapping):
        unknown = set(model) - set(_MODEL_KEYS)
        if unknown:
            shown = ", ".join(sorted(repr(k) if not isinstance(k, str) else k for k in unknown))
            raise FxInputError(f"unsupported model option: {shown} (a model is {{id, effort?, fast?, ultrafast?}})")
        spec = dict(model)
    else:
        raise FxInputError(
            f"model must be a model id or {{id, effort?, fast?, ultrafast?}}, got {type(model).__name__}"
        )
    model_id = spec.get("id")
    if (not isinstance(model_id, str) or not model_id or not is_utf8(model_id)
            or len(model_id.encode()) > MODEL_ID_MAX_BYTES):
        raise FxInputError("model id must be a non-empty string of at most 1024 bytes of UTF-8")
    effort = spec.get("effort")
    if effort is not None and (not isinstance(effort, str) or not effort or not is_utf8(effort)
                               or len(effort.encode()) > EFFORT_MAX_BYTES):
        raise FxInputError(f"model effort must be a string of 1 to {EFFORT_MAX_BYTES} bytes")
    for flag in ("fast", "ultrafast"):
        if spec.get(flag) is not None and not isinstance(spec.get(flag), bool):
            raise FxInputError(f"model {flag} must be a boolean")
    fast = bool(spec.get("fast"))
    ultrafast = bool(spec.get("ultrafast"))
    entry: ModelEntry | None = None
    if models is not None:
        entry = models.get(model_id)
        name = provider.name if isinstance(provider, Provider) else (
            provider.get("name") if isinstance(provider, Mapping) else "gateway")
        if entry is None:
            raise FxInputError(f"provider {name} has no model {model_id}", code="FX_MODEL_UNKNOWN")
        if effort is not None and (entry.efforts is None or effort not in entry.efforts):
            raise FxInputError(f"model {model_id} does not support effort {effort!r}", code="FX_MODEL_UNSUPPORTED_EFFORT")
        if fast and not entry.supports_fast:
            raise FxInputError(f"model {model_id} does not support fast", code="FX_MODEL_UNSUPPORTED_FAST")
        if ultrafast and not entry.supports_ultrafast:
            raise FxInputError(f"model {model_id} does not support ultrafast", code="FX_MODEL_UNSUPPORTED_ULTRAFAST")
    return ModelSpec(model_id, effort, fast, ultrafast, entry)


def resolve_model(model: str | Mapping[str, Any], provider: Provider) -> ModelSpec:
    """`check_model` against a resolved provider's catalog."""
    return check_model(model, provider)
