"""Providers: where requests go and with which credentials (the wire format is in `models/`).

    base.py         Provider, ModelEntry, ModelSpec
    gateway.py      AI Gateway (the default)         custom.py    custom provider dicts
    chatgpt.py      ChatGPT plans (provider="codex") grok.py      Grok plans (provider="grok")
    oauth.py        PKCE, device code and refresh under both plans' sign-in helpers
    auth.py         CredentialSource: credentials(ctx) / on_credentials / refresh_lock
    catalog.py      the Gateway's model catalog, list_models()
    check.py        check_model and the per-agent CatalogCache
    credentials.py  the Gateway key order, masking
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..codes import Code
from ..errors import FxInputError, FxProviderError
from . import chatgpt, grok
from .auth import CredentialSource, CredentialsFn, OnCredentialsFn, RefreshLockFn
from .base import ModelEntry, ModelSpec, Provider
from .catalog import fetch_catalog, list_models, parse_catalog
from .check import (
    EFFORT_MAX_BYTES,
    MODEL_ID_MAX_BYTES,
    PLAN_PROVIDERS,
    PROVIDER_NAMES,
    CatalogCache,
    catalog_of,
    check_model,
    resolve_model,
)
from .credentials import mask_secret, mask_secrets
from .custom import custom_provider
from .gateway import GATEWAY_BASE_URL, gateway_provider

__all__ = [
    # resolved providers and models
    "ModelEntry",
    "ModelSpec",
    "Provider",
    "resolve_provider",
    "custom_provider",
    "gateway_provider",
    "GATEWAY_BASE_URL",
    # plans
    "chatgpt",
    "grok",
    "CredentialSource",
    # the catalog
    "CatalogCache",
    "check_model",
    "fetch_catalog",
    "list_models",
    "parse_catalog",
    "resolve_model",
    # masking
    "mask_secret",
    "mask_secrets",
]


def resolve_provider(
    provider: Mapping[str, object] | Provider | str | None,
    *,
    api_key: str | None,
    env: Mapping[str, str] | None = None,
    model_catalog: object = None,
    credentials: CredentialsFn | None = None,
    on_credentials: OnCredentialsFn | None = None,
    refresh_lock: RefreshLockFn | None = None,
) -> Provider:
    """The `Provider` requests go to.

    None or ``"gateway"``: AI Gateway. ``"codex"`` (ChatGPT plans) and ``"grok"`` (Grok
    plans) need `credentials`; a custom provider dict takes `credentials` instead of a
    fixed `api_key`. A `Provider` (e.g. from `chatgpt.provider(...)`) is used as it is.

    Raises:
        FxInputError: `FX_PROVIDER_INVALID` for an unknown name or a malformed dict, or
            callbacks given with a resolved `Provider`.
        FxProviderError: `FX_PROVIDER_NO_CREDENTIALS` for AI Gateway without a key, or a
            plan without `credentials`.
    """
    callbacks = {"on_credentials": on_credentials, "refresh_lock": refresh_lock}
    if isinstance(provider, Provider):
        if credentials is not None or on_credentials is not None or refresh_lock is not None:
            raise FxInputError("credentials callbacks go to the provider's own constructor, not with a Provider",
                               code=Code.PROVIDER_INVALID)
        return provider
    if provider is None or provider == "gateway":
        return gateway_provider(api_key=api_key, env=env, model_catalog=model_catalog)
    if isinstance(provider, str):
        if provider not in PLAN_PROVIDERS:
            raise FxInputError(f"provider must be one of {', '.join(PROVIDER_NAMES)} or a custom provider dict, "
                               f"got {provider!r}", code=Code.PROVIDER_INVALID)
        if credentials is None:
            raise FxProviderError(f"provider {provider} needs credentials=", code=Code.PROVIDER_NO_CREDENTIALS)
        models = parse_catalog(model_catalog) if model_catalog is not None else None
        if provider == "codex":
            return chatgpt.provider(credentials=credentials, models=models, on_credentials=on_credentials,
                                    refresh_lock=refresh_lock)
        return grok.provider(credentials=credentials, models=models, on_credentials=on_credentials,
                             refresh_lock=refresh_lock)
    resolved = custom_provider(provider, api_key=api_key)
    if credentials is None:
        return resolved
    source = CredentialSource(resolved.name, credentials=credentials, on_credentials=on_credentials,
                              refresh_lock=refresh_lock)
    return dataclasses.replace(resolved, api_key=None, auth=source)
