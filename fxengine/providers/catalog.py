"""AI Gateway's model catalog: `list_models()`, parsing, and the per-agent cache.

A catalog is id -> `ModelEntry`. It comes from a custom provider's `models`, from
`model_catalog=` (supplied offline: then nothing is fetched), or from the Gateway's
``GET {base_url}/models``, fetched only when a model names a setting (`effort`, `fast`,
`ultrafast`) that must be checked against it, and then once per `CatalogCache`.

`model_catalog=` takes either form: id -> entry (as a custom provider's `models`), or
the Gateway's own answer (``{"data": [{"id", "type", "context_window", "max_tokens",
"tags", ...}]}`` or its list). In the Gateway's form an entry's efforts are its
`efforts` (or `reasoning_efforts`) list, else `REASONING_EFFORTS` when it is tagged
`reasoning`; a JSON-schema response format is taken when `supports_structured_output` is
true or it is tagged `structured-outputs` (or `json-schema`); `fast` and `ultrafast` are booleans or tags (`priority` also means
ultrafast, the provider's faster service tier).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ..codes import Code
from ..errors import FxProviderError
from .base import ModelEntry
from .credentials import gateway_base_url, gateway_key, mask_secret
from .custom import parse_models

REASONING_EFFORTS = ("minimal", "low", "medium", "high")
CATALOG_TIMEOUT = httpx.Timeout(15.0)
_SETTINGS = ("effort", "fast", "ultrafast")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def gateway_entry(raw: Mapping[str, Any]) -> ModelEntry:
    """A `ModelEntry` from one entry of the Gateway's catalog."""
    tags = {t for t in raw.get("tags") or () if isinstance(t, str)}
    efforts = raw.get("efforts", raw.get("reasoning_efforts"))
    if isinstance(efforts, (list, tuple)) and all(isinstance(e, str) for e in efforts):
        efforts_t: tuple[str, ...] | None = tuple(efforts)
    else:
        efforts_t = REASONING_EFFORTS if "reasoning" in tags else None
    fast = raw.get("fast")
    ultrafast = raw.get("ultrafast")
    structured = raw.get("supports_structured_output")
    return ModelEntry(
        context_window=_int(raw.get("context_window")),
        max_output_tokens=_int(raw.get("max_output_tokens", raw.get("max_tokens"))),
        supports_tools=raw.get("supports_tools") is not False,
        supports_images=raw.get("supports_images") is not False,
        efforts=efforts_t,
        supports_fast=fast if isinstance(fast, bool) else "fast" in tags,
        supports_ultrafast=ultrafast if isinstance(ultrafast, bool) else bool(tags & {"ultrafast", "priority"}),
        supports_structured_output=(structured if isinstance(structured, bool)
                                    else bool(tags & {"structured-outputs", "structured-output", "json-schema"})),
    )


def _gateway_entries(data: Sequence[object]) -> dict[str, ModelEntry]:
    out: dict[str, ModelEntry] = {}
    for raw in data:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("id"), str):
            continue
        if raw.get("type", "language") != "language":
            continue
        out[raw["id"]] = gateway_entry(raw)
    return out


def parse_catalog(catalog: object) -> dict[str, ModelEntry]:
    """A catalog in either form the module docstring names (`FX_PROVIDER_INVALID` otherwise)."""
    if isinstance(catalog, Mapping) and isinstance(catalog.get("data"), list):
        return _gateway_entries(catalog["data"])
    if isinstance(catalog, (list, tuple)):
        return _gateway_entries(catalog)
    return parse_models(catalog)


def fetch_catalog(*, api_key: str | None = None, base_url: str | None = None,
                  env: Mapping[str, str] | None = None, timeout: httpx.Timeout = CATALOG_TIMEOUT) -> dict[str, ModelEntry]:
    """The Gateway's language models: ``GET {base_url}/models`` (blocking).

    Raises:
        FxProviderError: `FX_PROVIDER_NO_CREDENTIALS` without a key; `FX_PROVIDER_AUTH`,
            `FX_PROVIDER_REJECTED` or `FX_PROVIDER_UNAVAILABLE` for an HTTP error (the key
            masked in its message); `FX_PROVIDER_UNREACHABLE` when it cannot be reached.
    """
    key = gateway_key(api_key, env)
    url = (base_url or gateway_base_url(env)).rstrip("/") + "/models"
    try:
        response = httpx.get(url, headers={"authorization": f"Bearer {key}", "accept": "application/json"},
                             timeout=timeout)
    except httpx.HTTPError as exc:
        raise FxProviderError(f"cannot fetch the model catalog ({type(exc).__name__})",
                              code=Code.PROVIDER_UNREACHABLE) from None
    if response.status_code != 200:
        code = (Code.PROVIDER_AUTH if response.status_code in (401, 403) else
                Code.PROVIDER_UNAVAILABLE if response.status_code >= 500 else Code.PROVIDER_REJECTED)
        text = mask_secret(response.text[:500], key)
        raise FxProviderError(f"the model catalog answered HTTP {response.status_code}: {text}", code=code)
    try:
        return parse_catalog(json.loads(response.text))
    except (ValueError, FxProviderError):
        raise FxProviderError("the model catalog is not JSON of the Gateway's shape",
                              code=Code.PROVIDER_REJECTED) from None


def list_models(api_key: str | None = None, *, base_url: str | None = None,
                env: Mapping[str, str] | None = None) -> list[str]:
    """The ids of AI Gateway's language models (blocking; `fetch_catalog` for the errors).

    The key is `api_key`, then `AI_GATEWAY_API_KEY`, then `VERCEL_OIDC_TOKEN`. From async
    code, run it in a thread: ``await asyncio.to_thread(list_models, api_key=key)``.
    """
    return sorted(fetch_catalog(api_key=api_key, base_url=base_url, env=env))


def names_setting(model: object) -> bool:
    """Whether `model` names an effort, fast or ultrafast that a catalog must confirm."""
    return isinstance(model, Mapping) and any(model.get(k) not in (None, False) for k in _SETTINGS)
