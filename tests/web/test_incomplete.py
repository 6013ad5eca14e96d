"""A session with a key gone (an evicting Redis, a hand) is 410 FX_SESSION_INCOMPLETE, not served."""

from __future__ import annotations

import httpx
import pytest
import redis

from fxworker.keys import session_keys
from tests.support.workers import wait_until
from tests.web.conftest import read_turn

pytestmark = [pytest.mark.redis, pytest.mark.celery]


@pytest.mark.parametrize("name", ["ckpt", "ui", "lease", "meta"])
def test_a_session_missing_a_key_is_410_on_every_route(api: httpx.Client, redis_url: str, prefix: str, name: str) -> None:
    sid = api.post("/v1/sessions", json={"input": "soon half gone"}).json()["sessionId"]
    read_turn(api, sid)
    keys = session_keys(prefix, sid)
    client = redis.Redis.from_url(redis_url)
    try:
        # At rest once released: the checkpoint holds the conversation, `ui` its lines packed.
        wait_until(lambda: client.hget(keys.lease, "state") == b"released", 10, what="the session at rest")
        assert client.exists(keys.ckpt) and not client.exists(keys.log, keys.rest)
        assert client.delete(getattr(keys, name)) == 1
    finally:
        client.close()
    for response in (
        api.get(f"/v1/sessions/{sid}"),
        api.post(f"/v1/sessions/{sid}/prompts", json={"input": "on what is left?"}),
        api.post(f"/v1/sessions/{sid}/steer", json={"input": "steer"}),
        api.post(f"/v1/sessions/{sid}/cancel"),
        api.get(f"/v1/sessions/{sid}/stream", params={"follow": "0"}),
    ):
        assert response.status_code == 410, (response.request.url, response.text)
        error = response.json()["error"]
        assert error["code"] == "FX_SESSION_INCOMPLETE" and name in error["message"]
        assert "noeviction" in error["message"]
