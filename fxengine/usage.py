"""Token usage in the wire shape of docs/design.md §4, summed over the steps of a turn."""

from __future__ import annotations

from collections.abc import Mapping

# The only keys a usage dict carries; each appears only when the provider reported it.
USAGE_KEYS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")

Usage = dict[str, int]


def add_usage(total: Mapping[str, int], step: Mapping[str, int] | None) -> Usage:
    """Returns `total + step`, key by key; a key absent from both stays absent."""
    out: Usage = dict(total)
    if not step:
        return out
    for key in USAGE_KEYS:
        value = step.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = out.get(key, 0) + value
    return out


def clean_usage(raw: Mapping[str, object] | None) -> Usage:
    """Keeps the known integer keys of `raw`, in the canonical order."""
    if not raw:
        return {}
    return {k: v for k in USAGE_KEYS if isinstance(v := raw.get(k), int) and not isinstance(v, bool)}
