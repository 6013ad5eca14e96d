"""Model settings checked against a provider's catalog: the one check the engine and the
durable layer share (docs/design.md §8), and the per-agent catalog cache."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from ..codes import Code
from ..errors import FxInputError, FxModelUnsupportedError, FxProviderError
from ..limits import is_utf8
from .base import ModelEntry, ModelSpec, Provider
from .catalog import fetch_catalog, names_setting, parse_catalog
from .credentials import gateway_key
from .custom import custom_provider

EFFORT_MAX_BYTES = 64
MODEL_ID_MAX_BYTES = 1024
PLAN_PROVIDERS = ("codex", "grok")
PROVIDER_NAMES = ("gateway", *PLAN_PROVIDERS)
_MODEL_KEYS = ("id", "effort", "fast", "ultrafast")


def _parsed(catalog: object) -> Mapping[str, ModelEntry]:
    if isinstance(catalog, Mapping) and catalog and all(isinstance(v, ModelEntry) for v in catalog.values()):
        return catalog
    return parse_catalog(catalog)


def catalog_of(
    provider: Mapping[str, object] | Provider | str | None, *, model_catalog: object = None
) -> Mapping[str, ModelEntry] | None:
    """The model catalog requests to `provider` are checked against, without credentials.

    A custom provider dict is validated whole (`FX_PROVIDER_INVALID`) and its `models` are
    the catalog; AI Gateway and the plans (a name, or a `Provider` without models) have
    `model_catalog` when given, else no catalog (any id and setting goes through).
    """
    if isinstance(provider, Provider):
        if provider.models is not None:
            return provider.models
        return _parsed(model_catalog) if model_catalog is not None else None
    if provider is None or isinstance(provider, str):
        if isinstance(provider, str) and provider not in PROVIDER_NAMES:
            raise FxInputError(f"provider must be one of {', '.join(PROVIDER_NAMES)} or a custom provider dict, "
                               f"got {provider!r}", code=Code.PROVIDER_INVALID)
        return _parsed(model_catalog) if model_catalog is not None else None
    return custom_provider(provider).models


def check_model(
    model: object,
    provider: Mapping[str, object] | Provider | str | None = None,
    *,
    model_catalog: object = None,
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
        spec: dict[object, object] = {"id": model}
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
    if fast and ultrafast:
        raise FxInputError("model fast and ultrafast are mutually exclusive (ultrafast is the faster tier)")
    entry: ModelEntry | None = None
    if models is not None:
        entry = models.get(model_id)
        name = provider.name if isinstance(provider, Provider) else (
            provider.get("name") if isinstance(provider, Mapping) else provider or "gateway")
        if entry is None:
            raise FxInputError(f"provider {name} has no model {model_id}", code=Code.MODEL_UNKNOWN)
        _check_settings(model_id, entry, effort, fast, ultrafast)
    return ModelSpec(model_id, effort, fast, ultrafast, entry)


def _check_settings(model_id: str, entry: ModelEntry, effort: str | None, fast: bool, ultrafast: bool) -> None:
    """Raises `FxModelUnsupportedError` for a setting the catalog entry does not offer."""
    if effort is not None and (entry.efforts is None or effort not in entry.efforts):
        supported = tuple(entry.efforts or ())
        shown = ", ".join(supported) if supported else "none"
        raise FxModelUnsupportedError(
            f"model {model_id} does not support effort {effort!r} (supported: {shown})",
            code=Code.MODEL_UNSUPPORTED_EFFORT, model=model_id, capability="effort", supported=supported)
    if fast and not entry.supports_fast:
        raise FxModelUnsupportedError(f"model {model_id} does not support fast",
                                      code=Code.MODEL_UNSUPPORTED_FAST, model=model_id, capability="fast")
    if ultrafast and not entry.supports_ultrafast:
        raise FxModelUnsupportedError(f"model {model_id} does not support ultrafast",
                                      code=Code.MODEL_UNSUPPORTED_ULTRAFAST, model=model_id, capability="ultrafast")


def resolve_model(model: str | Mapping[str, object], provider: Provider) -> ModelSpec:
    """`check_model` against a resolved provider's catalog."""
    return check_model(model, provider)


class CatalogCache:
    """The catalog one agent checks its models against, fetched at most once.

    `provider` is what the agent was given: None / ``"gateway"`` / a gateway `Provider`
    without models fetch from the Gateway (with `api_key`) when a setting needs it;
    any other provider has its own catalog (or none) and fetches nothing.
    """

    def __init__(self, provider: Mapping[str, object] | Provider | str | None, *, api_key: str | None = None,
                 model_catalog: object = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.provider = provider
        self._api_key = api_key
        self._env = env
        self._catalog = parse_catalog(model_catalog) if model_catalog is not None else None
        self._lock = threading.Lock()
        self.fetches = 0

    def __repr__(self) -> str:
        size = None if self._catalog is None else len(self._catalog)
        return f"<CatalogCache provider={getattr(self.provider, 'name', self.provider)!r} models={size}>"

    @property
    def catalog(self) -> dict[str, ModelEntry] | None:
        """The catalog held now (None before a fetch, when none was supplied)."""
        return self._catalog

    def _fetches_from_gateway(self) -> tuple[bool, str | None, str | None]:
        """(fetch?, key, base URL): the Gateway's catalog is fetched only for AI Gateway,
        and only with a key (without one, settings go through unchecked, as the engine's
        turn would fail for want of the key anyway)."""
        provider = self.provider
        if provider is None or provider == "gateway":
            key, base_url = self._api_key, None
        elif isinstance(provider, Provider) and provider.name == "gateway" and provider.models is None:
            key, base_url = provider.api_key or self._api_key, provider.base_url
        else:
            return False, None, None
        try:
            key = gateway_key(key, self._env)
        except FxProviderError:
            return False, None, None
        return True, key, base_url

    def check(self, model: object) -> ModelSpec:
        """`check_model` against this catalog, fetching it first when `model` names a
        setting and the Gateway's catalog is not held yet."""
        spec = check_model(model, self.provider, model_catalog=self._catalog)  # the shape, offline first
        fetches, key, base_url = self._fetches_from_gateway()
        if not (fetches and self._catalog is None and names_setting(model)):
            return spec
        with self._lock:
            if self._catalog is None:
                self._catalog = fetch_catalog(api_key=key, base_url=base_url, env=self._env)
                self.fetches += 1
        return check_model(model, self.provider, model_catalog=self._catalog)
