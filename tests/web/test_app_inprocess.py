"""`create_app()` mounted by an embedder: the `authorize` hook, and a store that is down."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from fxworker.agent import Agent
from fxworker.settings import Settings
from fxworker.store import redis_store
from fxworker.web import create_app
from tests.support.redis_server import free_port
from tests.web._inprocess import ThreadServer

pytestmark = [pytest.mark.redis]

PROVIDER = {"name": "scripted", "base_url": "http://127.0.0.1:9/v1", "models": {"scripted": {"supports_tools": True}}}


class NoWake:
    """A waker that sends nothing: these tests look at what the web layer answers, not at turns."""

    def wake(self, session_id: str, *, agent: str, reason: str) -> None:
        self.last = (session_id, agent, reason)


def test_the_authorize_hook_sees_each_action_and_can_refuse(redis_url: str, key_prefix: str) -> None:
    calls: list[tuple[str | None, str]] = []

    async def authorize(request: Request, session_id: str | None, action: str) -> bool:
        calls.append((session_id, action))
        return request.headers.get("x-user") == "alice"

    agent = Agent(f"hook-{uuid.uuid4().hex[:6]}", model="scripted", provider=PROVIDER,
                  store=redis_store(redis_url, prefix=key_prefix), waker=NoWake())
    try:
        app = create_app(agents=[agent], authorize=authorize, settings=Settings(redis_url=redis_url, prefix=key_prefix))
        with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=10.0) as client:
            refused = client.post("/v1/sessions", json={"input": "hi"})
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "FX_FORBIDDEN"
            alice = {"x-user": "alice"}
            created = client.post("/v1/sessions", json={"input": "hi"}, headers=alice)
            assert created.status_code == 202
            sid = created.json()["sessionId"]
            assert client.get(f"/v1/sessions/{sid}", headers=alice).status_code == 200
            assert client.get(f"/v1/sessions/{sid}").status_code == 403
            assert client.post(f"/v1/sessions/{sid}/cancel", headers={**alice, "content-type": "application/json"}).status_code == 202
    finally:
        agent.close()
    assert calls[:3] == [(None, "create"), (None, "create"), (sid, "state")]
    assert (sid, "cancel") in calls


def test_a_store_that_is_down_is_503_store_unavailable(redis_url: str) -> None:
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    agent = Agent(f"down-{uuid.uuid4().hex[:6]}", model="scripted", provider=PROVIDER,
                  store=redis_store(dead_url, prefix="fxdown"), waker=NoWake())
    try:
        app = create_app(agents={"default": agent}, settings=Settings(redis_url=dead_url, prefix="fxdown"))
        with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=15.0) as client:
            health = client.get("/healthz")
            assert health.status_code == 503 and health.json()["error"]["code"] == "FX_STORE_UNAVAILABLE"
            prompt = client.post("/v1/sessions", json={"input": "hi"})
            assert prompt.status_code == 503 and prompt.json()["error"]["code"] == "FX_STORE_UNAVAILABLE"
            assert prompt.headers["retry-after"] == "1"
    finally:
        agent.close()


def test_without_token_or_hook_the_api_is_served_on_loopback_only() -> None:
    from fxworker.web.auth import BearerAuth

    seen: list[Any] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])

    async def run(scope: dict[str, Any]) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await BearerAuth(inner, token=None)(scope, receive, send)
        return sent

    import asyncio

    public = {"type": "http", "path": "/v1/sessions", "headers": [], "server": ("10.0.0.5", 8000), "client": ("10.0.0.9", 1)}
    sent = asyncio.run(run(public))
    assert sent[0]["status"] == 403 and seen == []
    local = {**public, "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5), "headers": [(b"host", b"127.0.0.1:8000")]}
    assert asyncio.run(run(local)) == [] and seen == ["/v1/sessions"]
