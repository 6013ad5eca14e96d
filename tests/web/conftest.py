"""Fixtures of the web tests: a scripted model, Celery workers and `fx web` processes on the test Redis.

Module-scoped: one model, one worker process and two web processes serve a whole module.
`web_open` runs without a token (agents default and a, FX_WAKE_SECRET set); `web_auth`
requires FX_API_TOKEN (agents default, a and b). The worker serves all three agents.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import hypothesis  # noqa: F401  # imported now, at a shallow stack: CPython 3.11.7's AST depth check misfires when the plugin imports it late
import pytest

from fxengine.testing import ScriptedModel
from tests.support.redis_server import RedisServer, delete_prefix
from tests.support.workers import Workers
from tests.web._model import responder
from tests.web._server import WebProcess

TOKEN = "test-token-123"
WAKE_SECRET = "wake-secret-456"


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


@pytest.fixture(scope="module")
def prefix(redis_url: str) -> Iterator[str]:
    value = f"fxw{uuid.uuid4().hex[:10]}"
    yield value
    delete_prefix(redis_url, value)


def _env(redis_url: str, prefix: str, model: ScriptedModel, agents: str, **extra: str) -> dict[str, str]:
    return {
        "REDIS_URL": redis_url, "FX_PREFIX": prefix, "FX_AGENTS": "tests.durable.agents",
        "FX_TEST_AGENTS": agents, "FX_TEST_MODEL_URL": model.base_url, "FX_LEASE_S": "3", **extra,
    }


@pytest.fixture(scope="module")
def workers(redis_url: str, prefix: str, model: ScriptedModel) -> Iterator[Workers]:
    pool = Workers(redis_url=redis_url, prefix=prefix, env={"FX_TEST_MODEL_URL": model.base_url})
    try:
        pool.start(queues=("default", "a", "b"), concurrency=8)
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def web_open(redis_url: str, prefix: str, model: ScriptedModel, workers: Workers) -> Iterator[WebProcess]:
    web = WebProcess(env=_env(redis_url, prefix, model, "default,a", FX_WAKE_SECRET=WAKE_SECRET))
    try:
        yield web.wait_ready()
    finally:
        web.close()


@pytest.fixture(scope="module")
def web_auth(redis_url: str, prefix: str, model: ScriptedModel, workers: Workers) -> Iterator[WebProcess]:
    web = WebProcess(env=_env(redis_url, prefix, model, "default,a,b", FX_API_TOKEN=TOKEN))
    try:
        yield web.wait_ready()
    finally:
        web.close()


@pytest.fixture
def api(web_open: WebProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=web_open.url, timeout=15.0) as client:
        yield client


def ndjson_lines(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.iter_lines() if line.strip()]


def read_turn(client: httpx.Client, session_id: str, *, cursor: int = 0, message_id: str | None = None) -> list[dict[str, Any]]:
    """The session's lines after `cursor` up to the `turn_end` of `message_id` (or the first one)."""
    out: list[dict[str, Any]] = []
    with client.stream("GET", f"/v1/sessions/{session_id}/stream", params={"cursor": cursor}) as response:
        assert response.status_code == 200, response.read()
        for raw in response.iter_lines():
            if not raw.strip():
                continue
            line = json.loads(raw)
            out.append(line)
            if line["type"] == "turn_end" and (message_id is None or line.get("messageId") == message_id):
                return out
    raise AssertionError(f"stream ended before turn_end: {out}")


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own, to kill connections on or restart."""
    server = RedisServer()
    try:
        yield server
    finally:
        server.close()
