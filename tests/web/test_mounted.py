"""`create_app()` mounted under a prefix in another ASGI app (the FastAPI example's
`app.mount("/fx", ...)`): the page loads its script and calls the API under the prefix, and
`/fx/healthz` reports the store the sessions go to, though the outer app never runs the
mounted one's lifespan."""

from __future__ import annotations

import uuid

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from fxworker.agent import Agent
from fxworker.settings import Settings
from fxworker.store import redis_store
from fxworker.web import create_app
from tests.web._inprocess import ThreadServer

pytestmark = [pytest.mark.redis]

PROVIDER = {"name": "scripted", "base_url": "http://127.0.0.1:9/v1", "models": {"scripted": {}}}


class NoWake:
    def wake(self, session_id: str, *, agent: str, reason: str) -> None:
        pass


def test_the_app_mounted_under_a_prefix_serves_its_page_and_reports_its_store(redis_url: str, key_prefix: str) -> None:
    agent = Agent(f"mnt-{uuid.uuid4().hex[:6]}", model="scripted", provider=PROVIDER,
                  store=redis_store(redis_url, prefix=key_prefix), waker=NoWake())
    try:
        inner = create_app(agents={"default": agent}, settings=Settings(redis_url=redis_url, prefix=key_prefix))
        outer = Starlette(routes=[Mount("/fx", inner)])
        with ThreadServer(outer) as url, httpx.Client(base_url=url, timeout=10.0) as client:
            page = client.get("/fx/")
            assert page.status_code == 200 and 'src="static/app.js"' in page.text
            assert client.get("/fx/static/app.js").status_code == 200
            script = client.get("/fx/static/app.js").text
            assert 'ROOT + "/v1/sessions' in script and 'fetch("/v1' not in script
            health = client.get("/fx/healthz").json()
            assert health["store"] == "redis" and health["ok"] is True
            created = client.post("/fx/v1/sessions", json={"input": "hi"})
            assert created.status_code == 202
    finally:
        agent.close()
