"""The HTTP API under an embedder's own auth (`create_app(authorize=…, session_context=…)`),
over real HTTP: the server pins a session's context, cross-site POSTs are refused, a server
of several agents without `default` serves every route, `/metrics` sits behind the hook,
two `Authorization` headers are refused, one caller cannot squat another's message id, and
the timeline asks the hook for `timeline` (the prompts' text), not `state`.

Users are named by an `x-user` header here (a stand-in for the embedder's cookie session).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from starlette.requests import Request

from fxworker.agent import Agent
from fxworker.errors import FxForbiddenError
from fxworker.settings import Settings
from fxworker.store import redis_store
from fxworker.web import create_app
from tests.web._inprocess import ThreadServer

pytestmark = [pytest.mark.redis]

PROVIDER = {"name": "scripted", "base_url": "http://127.0.0.1:9/v1", "models": {"scripted": {"supports_tools": True}}}
JSON = {"content-type": "application/json"}


class NoWake:
    """A waker that sends nothing: these tests look at what the web layer stores and answers."""

    def wake(self, session_id: str, *, agent: str, reason: str) -> None:
        pass


ASKED: list[tuple[str | None, str]] = []  # what the hook was asked for the `x-user: carol` requests


def authorize(request: Request, session_id: str | None, action: str) -> bool:
    if request.headers.get("x-user") == "carol":  # a hook written before `timeline`: it knows no such action
        ASKED.append((session_id, action))
        return action in ("create", "prompt", "steer", "cancel", "stream", "state", "list")
    return request.headers.get("x-user") in ("alice", "mallory")


def pinned(request: Request, create: Any) -> dict[str, Any]:
    """The embedder's choice: the context is the caller, whatever the body says."""
    user = request.headers.get("x-user")
    if create.agent == "b" and user != "alice":
        raise FxForbiddenError("only alice may talk to b")
    return {"userId": user}


@pytest.fixture
def served(redis_url: str, key_prefix: str) -> Iterator[tuple[httpx.Client, Any]]:
    tag = uuid.uuid4().hex[:6]
    store = redis_store(redis_url, prefix=key_prefix)
    agents = {name: Agent(f"{name}-{tag}", model="scripted", provider=PROVIDER, store=store, waker=NoWake())
              for name in ("a", "b")}
    try:
        app = create_app(agents=agents, authorize=authorize, session_context=pinned,
                         settings=Settings(redis_url=redis_url, prefix=key_prefix))
        with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=10.0) as client:
            yield client, store
    finally:
        for agent in agents.values():
            agent.close()


def _contexts(redis_url: str, prefix: str, session_id: str) -> list[Any]:
    """The tool context stored with each input of a session, in order (what its tools get)."""
    r = redis.Redis.from_url(redis_url)
    try:
        entries = r.xrange(f"{prefix}:{{{session_id}}}:inbox")
    finally:
        r.close()
    return [json.loads(fields[b"cx"]) if fields.get(b"cx") else None for _, fields in entries]


def test_the_server_pins_the_context_and_it_holds_for_every_prompt(served: Any, redis_url: str,
                                                                   key_prefix: str) -> None:
    client, _ = served
    alice = {"x-user": "alice"}
    forged = client.post("/v1/sessions", headers=alice,
                         json={"input": "hi", "agent": "a", "context": {"userId": "bob", "role": "admin"}})
    assert forged.status_code == 202, forged.text
    sid = forged.json()["sessionId"]
    again = client.post(f"/v1/sessions/{sid}/prompts", headers=alice, json={"input": "and then"})
    steer = client.post(f"/v1/sessions/{sid}/steer", headers=alice, json={"input": "faster"})
    assert again.status_code == 202 and steer.status_code == 202
    assert _contexts(redis_url, key_prefix, sid) == [{"userId": "alice"}] * 3
    refused = client.post("/v1/sessions", headers={"x-user": "mallory"}, json={"input": "hi", "agent": "b"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "FX_FORBIDDEN"


def test_without_a_context_hook_a_hook_server_refuses_a_clients_context(redis_url: str, key_prefix: str) -> None:
    agent = Agent(f"solo-{uuid.uuid4().hex[:6]}", model="scripted", provider=PROVIDER,
                  store=redis_store(redis_url, prefix=key_prefix), waker=NoWake())
    try:
        app = create_app(agents={"default": agent}, authorize=authorize,
                         settings=Settings(redis_url=redis_url, prefix=key_prefix))
        with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=10.0) as client:
            forged = client.post("/v1/sessions", headers={"x-user": "alice"},
                                 json={"input": "hi", "context": {"userId": "bob"}})
            assert forged.status_code == 403 and "context" in forged.json()["error"]["message"]
            plain = client.post("/v1/sessions", headers={"x-user": "alice"}, json={"input": "hi"})
            assert plain.status_code == 202
    finally:
        agent.close()


def test_a_cross_site_post_is_refused_and_the_turn_runs_on(served: Any, redis_url: str, key_prefix: str) -> None:
    client, _ = served
    alice = {"x-user": "alice"}
    sid = client.post("/v1/sessions", headers=alice, json={"input": "hi", "agent": "a"}).json()["sessionId"]
    evil = {**alice, "origin": "https://evil.example"}
    form = client.post(f"/v1/sessions/{sid}/cancel", headers={**alice, "content-type": "application/x-www-form-urlencoded"})
    bare = client.post(f"/v1/sessions/{sid}/cancel", headers=alice)
    foreign = client.post(f"/v1/sessions/{sid}/cancel", headers={**evil, **JSON})
    assert (form.status_code, bare.status_code, foreign.status_code) == (415, 415, 403)
    assert foreign.json()["error"]["code"] == "FX_FORBIDDEN_ORIGIN"
    r = redis.Redis.from_url(redis_url)
    try:
        assert not r.hget(f"{key_prefix}:{{{sid}}}:meta", "cancel")  # nothing was cancelled
    finally:
        r.close()
    own = client.post(f"/v1/sessions/{sid}/cancel", headers={**alice, **JSON, "origin": str(client.base_url)})
    assert own.status_code == 202


def test_a_server_of_two_agents_without_default_serves_every_route(served: Any) -> None:
    client, _ = served
    alice = {"x-user": "alice"}
    created = client.post("/v1/sessions", headers=alice, json={"input": "hi", "agent": "b"})
    assert created.status_code == 202
    sid = created.json()["sessionId"]
    assert client.get(f"/v1/sessions/{sid}", headers=alice).json()["agent"].startswith("b-")
    assert client.post(f"/v1/sessions/{sid}/prompts", headers=alice, json={"input": "more"}).status_code == 202
    assert client.post(f"/v1/sessions/{sid}/steer", headers=alice, json={"input": "s"}).status_code == 202
    assert client.get(f"/v1/sessions/{sid}/stream", headers=alice, params={"follow": 0}).status_code == 200
    assert client.post(f"/v1/sessions/{sid}/cancel", headers={**alice, **JSON}).status_code == 202
    listed = client.get("/v1/sessions", headers=alice)
    assert listed.status_code == 200 and sid in {s["sessionId"] for s in listed.json()["sessions"]}


def test_metrics_sit_behind_the_hook(served: Any) -> None:
    client, _ = served
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", headers={"x-user": "alice"}).status_code == 200


def test_two_authorization_headers_are_refused(served: Any) -> None:
    client, _ = served
    twice = httpx.Headers([("x-user", "alice"), ("authorization", "Bearer a"), ("authorization", "Bearer b")])
    answer = client.get("/v1/sessions", headers=twice)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "FX_INVALID_REQUEST"


def test_one_caller_cannot_squat_anothers_message_id(served: Any) -> None:
    client, _ = served
    message_id = f"msg_squat{uuid.uuid4().hex[:10]}"
    squat = client.post("/v1/sessions", headers={"x-user": "mallory"},
                        json={"input": "mine", "agent": "a", "messageId": message_id})
    own = client.post("/v1/sessions", headers={"x-user": "alice"},
                      json={"input": "hers", "agent": "a", "messageId": message_id})
    assert squat.status_code == 202 and own.status_code == 202, own.text
    assert own.json()["sessionId"] != squat.json()["sessionId"] and own.json()["repeated"] is False
    repeat = client.post("/v1/sessions", headers={"x-user": "alice"},
                         json={"input": "hers", "agent": "a", "messageId": message_id})
    assert repeat.json()["sessionId"] == own.json()["sessionId"] and repeat.json()["repeated"] is True


def test_the_timeline_is_its_own_action_and_a_hook_allowing_state_alone_is_refused_it(served: Any) -> None:
    client, _ = served
    carol = {"x-user": "carol"}
    created = client.post("/v1/sessions", headers=carol, json={"input": "secret plans", "agent": "a"})
    assert created.status_code == 202, created.text
    sid = created.json()["sessionId"]
    ASKED.clear()
    assert client.get(f"/v1/sessions/{sid}", headers=carol).status_code == 200
    assert client.get(f"/v1/sessions/{sid}/stream", headers=carol, params={"follow": 0}).status_code == 200
    refused = client.get(f"/v1/sessions/{sid}/timeline", headers=carol)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "FX_FORBIDDEN", refused.text
    assert "secret" not in refused.text
    assert ASKED == [(sid, "state"), (sid, "stream"), (sid, "timeline")]
    # Asked before anything is read: a bad cursor or an unknown session is refused the same way.
    assert client.get(f"/v1/sessions/{sid}/timeline", headers=carol, params={"cursor": "x"}).status_code == 403
    assert client.get("/v1/sessions/fxs_01J00000000000000000000000/timeline", headers=carol).status_code == 403

    allowed = client.get(f"/v1/sessions/{sid}/timeline", headers={"x-user": "alice"})
    assert allowed.status_code == 200, allowed.text
    body = allowed.json()
    assert body["next"] is None and [t["messageId"] for t in body["turns"]] in ([], [created.json()["messageId"]])
