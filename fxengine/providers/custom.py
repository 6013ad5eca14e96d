"""Custom providers given as a dict (docs/design.md §8), validated before any request is sent.

    {"name": "local", "base_url": "http://127.0.0.1:8000/v1", "api_key"?: "...",
     "headers"?: {...},
     "models": {"my-model": {"context_window": 128000, "max_output_tokens": 8192,
                             "supports_tools": True, "supports_images": False,
                             "efforts"?: ["low", "high"], "fast"?: bool, "ultrafast"?: bool,
                             "supports_structured_output"?: bool}}}

HTTPS is required, except plain HTTP to a loopback host (a local or test server).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

from ..codes import Code
from ..errors import FxInputError
from .base import ModelEntry, Provider

_LOOPBACK_NAMES = ("localhost",)
URL_MAX_CHARS = 16 * 1024


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_base_url(url: object) -> str:
    """A provider base URL: HTTPS, or HTTP on loopback only (`FX_PROVIDER_INVALID`)."""
    if not isinstance(url, str) or not url or len(url) > URL_MAX_CHARS:
        raise FxInputError("provider base_url must be a URL string", code=Code.PROVIDER_INVALID)
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not host:
        raise FxInputError(f"provider base_url {url!r} has no host", code=Code.PROVIDER_INVALID)
    if parts.scheme == "https":
        return url
    if parts.scheme == "http" and _is_loopback(host):
        return url
    raise FxInputError(
        f"provider base_url must be https (plain http only to a loopback host), got {parts.scheme}://{host}",
        code=Code.PROVIDER_INVALID,
    )


def _positive_int(value: object, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise FxInputError(f"{what} must be a positive integer", code=Code.PROVIDER_INVALID)
    return value


def _bool(value: object, what: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise FxInputError(f"{what} must be a boolean", code=Code.PROVIDER_INVALID)
    return value


def parse_models(models: object) -> dict[str, ModelEntry]:
    """Validates a `models` mapping of id -> entry."""
    if not isinstance(models, Mapping) or not models:
        raise FxInputError("provider models must be a non-empty object of model id -> entry", code=Code.PROVIDER_INVALID)
    out: dict[str, ModelEntry] = {}
    for model_id, raw in models.items():
        if not isinstance(model_id, str) or not model_id or len(model_id.encode()) > 1024:
            raise FxInputError(f"model id {model_id!r} is invalid", code=Code.PROVIDER_INVALID)
        if not isinstance(raw, Mapping):
            raise FxInputError(f"model {model_id} entry must be an object", code=Code.PROVIDER_INVALID)
        _check_spellings(raw, f"model {model_id}")
        efforts = raw.get("efforts")
        if efforts is not None and (not isinstance(efforts, (list, tuple)) or not all(isinstance(e, str) for e in efforts)):
            raise FxInputError(f"model {model_id} efforts must be a list of strings", code=Code.PROVIDER_INVALID)
        out[model_id] = ModelEntry(
            context_window=_positive_int(raw.get("context_window"), f"model {model_id} context_window"),
            max_output_tokens=_positive_int(raw.get("max_output_tokens"), f"model {model_id} max_output_tokens"),
            supports_tools=_bool(raw.get("supports_tools"), f"model {model_id} supports_tools", True),
            supports_images=_bool(raw.get("supports_images"), f"model {model_id} supports_images", True),
            efforts=tuple(efforts) if efforts is not None else None,
            supports_fast=_bool(raw.get("fast"), f"model {model_id} fast", False),
            supports_ultrafast=_bool(raw.get("ultrafast"), f"model {model_id} ultrafast", False),
            supports_structured_output=_bool(raw.get("supports_structured_output"),
                                             f"model {model_id} supports_structured_output", False),
        )
    return out


# libfx's spellings of provider and model keys, and the key to use here instead: a libfx
# provider definition pasted as it is gets told which key is misspelt, not that a key it
# never set is missing.
LIBFX_KEYS = {
    "baseUrl": "base_url", "baseURL": "base_url", "apiKey": "api_key", "idleTimeoutMs": "idle_timeout_s (seconds)",
    "contextWindow": "context_window", "maxOutputTokens": "max_output_tokens", "maxTokens": "max_output_tokens",
    "supportsToolUse": "supports_tools", "supportsTools": "supports_tools", "supportsImages": "supports_images",
    "supportsVision": "supports_images", "supportsStructuredOutput": "supports_structured_output",
    "reasoningEfforts": "efforts",
}


def _check_spellings(raw: Mapping[object, object], where: str) -> None:
    """`FX_PROVIDER_INVALID` naming the first libfx spelling in `raw` and the key to use."""
    for key in raw:
        if isinstance(key, str) and key in LIBFX_KEYS:
            raise FxInputError(f"{where} key {key!r}: use {LIBFX_KEYS[key]!r} (provider and model keys are "
                               "snake_case here)", code=Code.PROVIDER_INVALID)


def custom_provider(spec: object, *, api_key: str | None = None) -> Provider:
    """A `Provider` from a custom-provider dict; `api_key` overrides the dict's own key."""
    if not isinstance(spec, Mapping):
        raise FxInputError("provider must be a dict {name, base_url, models}", code=Code.PROVIDER_INVALID)
    _check_spellings(spec, "provider")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise FxInputError("provider name must be a non-empty string", code=Code.PROVIDER_INVALID)
    base_url = check_base_url(spec.get("base_url"))
    key = api_key or spec.get("api_key")
    if key is not None and not isinstance(key, str):
        raise FxInputError("provider api_key must be a string", code=Code.PROVIDER_INVALID)
    headers = spec.get("headers") or {}
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise FxInputError("provider headers must map strings to strings", code=Code.PROVIDER_INVALID)
    idle = spec.get("idle_timeout_s")
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float)) or not idle > 0):
        raise FxInputError("provider idle_timeout_s must be a positive number of seconds", code=Code.PROVIDER_INVALID)
    return Provider(name, base_url, key or None, parse_models(spec.get("models")), dict(headers),
                    idle_timeout_s=float(idle) if idle is not None else None)
