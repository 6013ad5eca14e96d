"""A resolved provider (where requests go, with which credentials) and a resolved model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .credentials import mask


@dataclass(frozen=True)
class ModelEntry:
    """A catalog entry: what a model supports (docs/design.md §8)."""

    context_window: int | None = None
    max_output_tokens: int | None = None
    supports_tools: bool = True
    supports_images: bool = True
    efforts: tuple[str, ...] | None = None
    supports_fast: bool = False
    supports_ultrafast: bool = False


@dataclass(frozen=True)
class Provider:
    """Where Chat Completions requests go. `api_key` never appears in `repr`."""

    name: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    models: Mapping[str, ModelEntry] | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        key = mask(self.api_key) if self.api_key else None
        return f"<Provider {self.name} base_url={self.base_url} key={key}>"

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def request_headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "text/event-stream", **self.headers}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers


@dataclass(frozen=True)
class ModelSpec:
    """The model a turn talks to and its settings, validated against the catalog."""

    id: str
    effort: str | None = None
    fast: bool = False
    ultrafast: bool = False
    entry: ModelEntry | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.effort is not None:
            out["effort"] = self.effort
        if self.fast:
            out["fast"] = True
        if self.ultrafast:
            out["ultrafast"] = True
        return out
