"""A resolved provider (where requests go, with which credentials) and a resolved model."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .credentials import GATEWAY_BASE_URL, mask

if TYPE_CHECKING:
    from .auth import CredentialSource

# The two request shapes: OpenAI Chat Completions, and the Responses API the Codex
# backend speaks (`models/responses.py` converts the request and decodes the stream).
WIRE_CHAT = "chat"
WIRE_RESPONSES = "responses"


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
    # Takes a JSON-schema response format (typed answers ask for it natively, else by a tool).
    supports_structured_output: bool = False


MODEL_IDLE_TIMEOUT_S = 120.0  # the default longest silence of a model stream (connect to last byte)


@dataclass(frozen=True)
class Provider:
    """Where model requests go. `api_key` and `auth` never appear in `repr`.

    `auth`, when set, supplies the credentials of each request from the application's
    callbacks (ChatGPT and Grok plans, or a custom provider's `credentials`), refreshing
    them when they expire or are rejected; a provider with `auth` is bound to one
    session (`bind`) before a turn uses it.
    """

    name: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    models: Mapping[str, ModelEntry] | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    wire: str = WIRE_CHAT
    auth: CredentialSource | None = field(default=None, repr=False, compare=False)
    # A model stream silent this long fails its step FX_PROVIDER_TIMEOUT (None: the
    # engine's `model_idle_timeout_s`, default MODEL_IDLE_TIMEOUT_S).
    idle_timeout_s: float | None = None

    def __repr__(self) -> str:
        key = mask(self.api_key) if self.api_key else None
        return f"<Provider {self.name} base_url={self.base_url} key={key} wire={self.wire}>"

    @property
    def chat_url(self) -> str:
        """The endpoint a model step posts to."""
        path = "/responses" if self.wire == WIRE_RESPONSES else "/chat/completions"
        return self.base_url.rstrip("/") + path

    def request_headers(self) -> dict[str, str]:
        """The headers every request carries; `auth` adds its own just before sending."""
        headers = {"content-type": "application/json", "accept": "text/event-stream", **self.headers}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

    def bind(self, session_id: str | None) -> Provider:
        """This provider for one session: its `auth` calls back with that session's ctx."""
        if self.auth is None:
            return self
        return dataclasses.replace(self, auth=self.auth.bind(session_id))

    def secrets(self) -> list[str]:
        """Every credential this provider has sent or may send, for masking errors."""
        out = [self.api_key] if self.api_key else []
        if self.auth is not None:
            out += self.auth.secrets()
        return out


@dataclass(frozen=True)
class ModelSpec:
    """The model a turn talks to and its settings, validated against the catalog."""

    id: str
    effort: str | None = None
    fast: bool = False
    ultrafast: bool = False
    entry: ModelEntry | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"id": self.id}
        if self.effort is not None:
            out["effort"] = self.effort
        if self.fast:
            out["fast"] = True
        if self.ultrafast:
            out["ultrafast"] = True
        return out
