"""Fixtures of the provider tests: a fake plan (issuer and APIs) and its OAuth configs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fxengine.providers import chatgpt, grok
from fxengine.providers.oauth import OAuthConfig
from tests.providers.fakes import FakePlan


@pytest.fixture
def plan() -> Iterator[FakePlan]:
    with FakePlan() as server:
        yield server


@pytest.fixture
def chatgpt_config(plan: FakePlan) -> OAuthConfig:
    return chatgpt.config(issuer=plan.url)


@pytest.fixture
def grok_config(plan: FakePlan) -> OAuthConfig:
    # The fake issuer serves RFC 8628 and the token grant at /oauth2/*.
    return grok.config(client_id="test-client", issuer=plan.url)


class CredentialStore:
    """The application's side of the callbacks: credentials per (provider, session), and
    every call recorded."""

    def __init__(self, creds: dict | None = None) -> None:
        self.creds = dict(creds) if creds else None
        self.loads: list[dict] = []
        self.saved: list[tuple[dict, dict]] = []

    def load(self, ctx: dict) -> dict | None:
        self.loads.append(dict(ctx))
        return dict(self.creds) if self.creds else None

    def save(self, creds: dict, ctx: dict) -> None:
        self.saved.append((dict(creds), dict(ctx)))
        self.creds = dict(creds)
