"""Requests the web app must refuse or bound, over real HTTP (uvicorn on loopback) and the
test Redis: each is answered with an `FX_` error and nothing is stored.

- loopback mode (no token, no hook): a body that is not `application/json` (415), a `Host`
  that is not a loopback name or an `Origin` that is not a loopback origin (403);
- a repeated create with one `messageId` prompts the first session (`repeated: true`);
- input Python reads but no store keeps (a lone surrogate, NaN, 3000-deep nesting) and
  numbers no stream id holds (5000-digit cursors and limits, a cursor of 2^64) are 400;
- a 405 says what is allowed, a trailing slash is 404 (no redirect built from `Host`),
  the listing is capped, shows only what the `authorize` hook allows and reads at most
  `LIST_STATE_CALLS` states at once, the open streams of a process are bounded.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from fxworker.agent import Agent
from fxworker.settings import Settings
from fxworker.store import redis_store
from fxworker.web import create_app
from fxworker.web.sessions import LIST_STATE_CALLS
from tests.support.redis_server import free_port
from tests.web._inprocess import ThreadServer

pytestmark = [pytest.mark.redis]

PROVIDER = {"name": "scripted", "base_url": "http://127.0.0.1:9/v1", "models": {"scripted": {"supports_tools": True}}}
JSON = {"Content-Type": "application/json"}


class NoWake:
    """A waker that sends nothing: these tests look at what the web layer answers, not at turns."""

    def __init__(self) -> None:
        self.wakes: list[tuple[str, str, str]] = []

    def wake(self, session_id: str, *, agent: str, reason: str) -> None:
        self.wakes.append((session_id, agent, reason))


class Served:
    """One app on uvicorn: its client, agent and store."""

    def __init__(self, client: httpx.Client, agent: Agent, waker: NoWake) -> None:
        self.client = client
        self.agent = agent
        self.store = agent.store
        self.waker = waker

    def sessions(self) -> list[str]:
        """Every session the store holds under this test's prefix."""
        return list(self.store.sync.list_sessions(1000))


def serve(redis_url: str, prefix: str, **app_options: Any) -> Iterator[Served]:
    waker = NoWake()
    agent = Agent(f"refuse-{uuid.uuid4().hex[:6]}", model="scripted", provider=PROVIDER,
                  store=redis_store(redis_url, prefix=prefix), waker=waker)
    try:
        app = create_app(agents={"default": agent}, settings=Settings(redis_url=redis_url, prefix=prefix), **app_options)
        with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=10.0) as client:
            yield Served(client, agent, waker)
    finally:
        agent.close()


@pytest.fixture
def served(redis_url: str, key_prefix: str) -> Iterator[Served]:
    yield from serve(redis_url, key_prefix)


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    code: str = response.json()["error"]["code"]
    assert code.startswith("FX_") and response.json()["error"]["message"]
    return code


# -- item 2: loopback mode is not open to every web page ---------------------------------


def test_a_cross_site_text_plain_post_from_a_rebound_host_is_refused(served: Served) -> None:
    port = served.client.base_url.port
    attack = {"Content-Type": "text/plain", "Origin": "http://attacker.example", "Host": f"attacker.example:{port}"}
    body = json.dumps({"input": "run the tools"})
    assert error_of(served.client.post("/v1/sessions", content=body, headers=attack), 403) == "FX_FORBIDDEN_HOST"
    # Each check alone refuses it too.
    text_plain = served.client.post("/v1/sessions", content=body, headers={"Content-Type": "text/plain"})
    assert error_of(text_plain, 415) == "FX_UNSUPPORTED_MEDIA_TYPE"
    form = served.client.post("/v1/sessions", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert error_of(form, 415) == "FX_UNSUPPORTED_MEDIA_TYPE"
    no_type = served.client.post("/v1/sessions", content=body.encode(), headers={"Content-Type": ""})
    assert error_of(no_type, 415) == "FX_UNSUPPORTED_MEDIA_TYPE"
    rebound = served.client.post("/v1/sessions", content=body, headers={**JSON, "Host": f"attacker.example:{port}"})
    assert error_of(rebound, 403) == "FX_FORBIDDEN_HOST"
    foreign = served.client.post("/v1/sessions", content=body, headers={**JSON, "Origin": "http://attacker.example"})
    assert error_of(foreign, 403) == "FX_FORBIDDEN_ORIGIN"
    sandboxed = served.client.post("/v1/sessions", content=body, headers={**JSON, "Origin": "null"})
    assert error_of(sandboxed, 403) == "FX_FORBIDDEN_ORIGIN"
    listing = served.client.get("/v1/sessions", headers={"Host": "attacker.example"})
    assert error_of(listing, 403) == "FX_FORBIDDEN_HOST"
    assert served.sessions() == [] and served.waker.wakes == []


def test_loopback_hosts_and_origins_and_json_bodies_are_served(served: Served) -> None:
    port = served.client.base_url.port
    for host, origin in ((f"127.0.0.1:{port}", None), (f"localhost:{port}", f"http://localhost:{port}"),
                         ("[::1]", "http://127.0.0.1:9999"), (f"LOCALHOST:{port}", f"https://[::1]:{port}")):
        headers = {"Content-Type": "application/json; charset=utf-8", "Host": host, **({"Origin": origin} if origin else {})}
        created = served.client.post("/v1/sessions", content=json.dumps({"input": "hi"}), headers=headers)
        assert created.status_code == 202, (host, origin, created.text)
    sid = created.json()["sessionId"]
    # A body-less POST needs no Content-Type; one with a body does, whichever route.
    assert served.client.post(f"/v1/sessions/{sid}/cancel").status_code == 202
    cancel_form = served.client.post(f"/v1/sessions/{sid}/cancel", content=b"x=1",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert error_of(cancel_form, 415) == "FX_UNSUPPORTED_MEDIA_TYPE"
    assert len(served.sessions()) == 4


def test_with_a_token_a_json_body_is_still_required(redis_url: str, key_prefix: str) -> None:
    agent = Agent(f"tok-{uuid.uuid4().hex[:6]}", model="scripted", provider=PROVIDER,
                  store=redis_store(redis_url, prefix=key_prefix), waker=NoWake())
    try:
        settings = Settings(redis_url=redis_url, prefix=key_prefix, api_token="t0ken")
        with ThreadServer(create_app(agents=[agent], settings=settings)) as url, httpx.Client(base_url=url) as client:
            auth = {"Authorization": "Bearer t0ken"}
            refused = client.post("/v1/sessions", content=b'{"input": "x"}', headers={**auth, "Content-Type": "text/plain"})
            assert error_of(refused, 415) == "FX_UNSUPPORTED_MEDIA_TYPE"
            # A token already proves the caller: any Host (a proxy's name) is served.
            other_host = client.post("/v1/sessions", json={"input": "x"}, headers={**auth, "Host": "api.example.com"})
            assert other_host.status_code == 202, other_host.text
            assert len(agent.store.sync.list_sessions(10)) == 1
    finally:
        agent.close()


# -- item 3: a repeated create is one session ----------------------------------------------


def test_a_repeated_create_with_one_message_id_answers_the_first_session(served: Served) -> None:
    first = served.client.post("/v1/sessions", json={"input": "charge the card", "messageId": "create-once"})
    second = served.client.post("/v1/sessions", json={"input": "charge the card", "messageId": "create-once"})
    assert first.status_code == second.status_code == 202, (first.text, second.text)
    assert first.json()["repeated"] is False
    assert second.json()["sessionId"] == first.json()["sessionId"] and second.json()["repeated"] is True
    assert served.sessions() == [first.json()["sessionId"]]
    state = served.client.get(f"/v1/sessions/{first.json()['sessionId']}").json()
    assert state["status"] == "waiting"  # one prompt waits; the repeat added nothing to run
    other = served.client.post("/v1/sessions", json={"input": "another", "messageId": "create-other"})
    assert other.json()["sessionId"] != first.json()["sessionId"] and other.json()["repeated"] is False


def test_creates_racing_with_one_message_id_make_one_session(served: Served) -> None:
    racers = 8
    barrier = threading.Barrier(racers, timeout=10)
    base_url = served.client.base_url

    def create(_: int) -> httpx.Response:
        with httpx.Client(base_url=base_url, timeout=10.0) as client:
            barrier.wait()  # every request leaves at once
            return client.post("/v1/sessions", json={"input": "charge the card", "messageId": "create-race"})

    with ThreadPoolExecutor(racers) as pool:
        responses = list(pool.map(create, range(racers)))
    assert [r.status_code for r in responses] == [202] * racers, [r.text for r in responses]
    bodies = [r.json() for r in responses]
    assert len({b["sessionId"] for b in bodies}) == 1, bodies
    assert sorted(b["repeated"] for b in bodies) == [False] + [True] * (racers - 1)
    assert served.sessions() == [bodies[0]["sessionId"]]
    state = served.client.get(f"/v1/sessions/{bodies[0]['sessionId']}").json()
    assert state["status"] == "waiting"


def test_a_refused_create_claims_no_message_id(served: Served) -> None:
    assert error_of(served.client.post("/v1/sessions", json={"input": "", "messageId": "mid-1"}), 400).startswith("FX_")
    created = served.client.post("/v1/sessions", json={"input": "now valid", "messageId": "mid-1"})
    assert created.status_code == 202 and created.json()["repeated"] is False
    assert served.sessions() == [created.json()["sessionId"]]


# -- item 6: 400, not 500 -------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        '{"input": "\\ud800"}',
        '{"input": "ok", "context": {"note": "\\udfff"}}',
        '{"input": "ok", "context": {"\\ud800": 1}}',
        '{"input": [{"type": "text", "text": "\\ud800"}]}',
        '{"input": "ok", "context": ' + "[" * 3000 + "]" * 3000 + "}",
        '{"input": "ok", "context": ' + "[" * 65 + "]" * 65 + "}",
        '{"input": "ok", "context": {"x": NaN}}',
        '{"input": "ok", "context": {"x": Infinity}}',
        '{"input": "ok", "context": [-Infinity]}',
        '{"input": "ok", "context": 1e999}',
        '{"input": "ok", "context": ' + "9" * 5000 + "}",
    ],
    ids=["surrogate-input", "surrogate-context", "surrogate-key", "surrogate-block", "nested-3000", "nested-65",
         "nan", "infinity", "minus-infinity", "overflow", "5000-digits"],
)
def test_json_no_store_can_keep_is_400_and_nothing_is_stored(served: Served, raw: str) -> None:
    response = served.client.post("/v1/sessions", content=raw, headers=JSON)
    assert error_of(response, 400) == "FX_INVALID_REQUEST"
    assert served.sessions() == []


def test_a_lone_surrogate_in_a_steer_or_prompt_is_400(served: Served) -> None:
    sid = served.client.post("/v1/sessions", json={"input": "first"}).json()["sessionId"]
    cursor = served.client.get(f"/v1/sessions/{sid}").json()["cursor"]
    for path in (f"/v1/sessions/{sid}/steer", f"/v1/sessions/{sid}/prompts"):
        response = served.client.post(path, content='{"input": "a\\ud800b"}', headers=JSON)
        assert error_of(response, 400) == "FX_INVALID_REQUEST"
    state = served.client.get(f"/v1/sessions/{sid}").json()
    assert state["cursor"] == cursor and state["turns"] == 0
    assert served.store.sync.read_lines(sid, 0) == []


@pytest.mark.parametrize("cursor", ["9" * 5000, "0" * 4999 + "1" + "9" * 20, str(2**64), str(2**64 + 5), "9" * 21])
def test_a_cursor_no_stream_id_holds_is_400_invalid_cursor(served: Served, cursor: str) -> None:
    sid = served.client.post("/v1/sessions", json={"input": "first"}).json()["sessionId"]
    response = served.client.get(f"/v1/sessions/{sid}/stream", params={"cursor": cursor, "follow": "0"})
    assert error_of(response, 400) == "FX_INVALID_CURSOR"
    assert "Redis" not in response.text and "stream ID" not in response.text


def test_the_largest_cursor_is_read_as_past_the_end(served: Served) -> None:
    sid = served.client.post("/v1/sessions", json={"input": "first"}).json()["sessionId"]
    response = served.client.get(f"/v1/sessions/{sid}/stream", params={"cursor": str(2**64 - 1), "follow": "0"})
    assert response.status_code == 200 and response.text == ""


@pytest.mark.parametrize("limit", ["9" * 5000, "0", "1001", "-1", "٣", "1.5"])
def test_a_limit_out_of_range_is_400(served: Served, limit: str) -> None:
    assert error_of(served.client.get("/v1/sessions", params={"limit": limit}), 400) == "FX_INVALID_REQUEST"


def test_a_store_that_is_down_is_503_without_its_address(redis_url: str) -> None:
    port = free_port()
    dead_url = f"redis://127.0.0.1:{port}/0"
    agent = Agent(f"down-{uuid.uuid4().hex[:6]}", model="scripted", provider=PROVIDER,
                  store=redis_store(dead_url, prefix="fxdown"), waker=NoWake())
    try:
        app = create_app(agents={"default": agent}, settings=Settings(redis_url=dead_url, prefix="fxdown"))
        with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=15.0) as client:
            for response in (client.get("/healthz"), client.post("/v1/sessions", json={"input": "hi"}),
                             client.get("/v1/sessions/fxs_01JZZZZZZZZZZZZZZZZZZZZZZZ")):
                assert error_of(response, 503) == "FX_STORE_UNAVAILABLE"
                message = response.json()["error"]["message"]
                assert str(port) not in message and "127.0.0.1" not in message, message
    finally:
        agent.close()


# -- item 7: 405, trailing slashes, the listing --------------------------------------------


def test_a_405_names_every_method_of_the_path(served: Served) -> None:
    response = served.client.delete("/v1/sessions")
    assert error_of(response, 405) == "FX_METHOD_NOT_ALLOWED"
    assert {m.strip() for m in response.headers["allow"].split(",")} >= {"GET", "POST"}
    state = served.client.post("/v1/sessions/fxs_01JZZZZZZZZZZZZZZZZZZZZZZZ")
    assert error_of(state, 405) == "FX_METHOD_NOT_ALLOWED" and "GET" in state.headers["allow"]


def test_a_trailing_slash_is_404_not_a_redirect_built_from_host(served: Served) -> None:
    response = served.client.get("/v1/sessions/", headers={"Host": "127.0.0.1.attacker.example"})
    assert response.status_code in (403, 404) and "location" not in response.headers
    plain = served.client.get("/v1/sessions/", follow_redirects=False)
    assert error_of(plain, 404) == "FX_NOT_FOUND" and "location" not in plain.headers
    assert error_of(served.client.get("/healthz/", follow_redirects=False), 404) == "FX_NOT_FOUND"


def test_the_listing_is_capped(served: Served) -> None:
    store = served.store
    for i in range(105):
        store.sync.accept(served.agent.new_session_id(), agent=served.agent.name, message_id=f"m{i}", input="x")
    listed = served.client.get("/v1/sessions", params={"limit": "1000"})
    assert listed.status_code == 200 and len(listed.json()["sessions"]) == 100
    assert len(served.client.get("/v1/sessions", params={"limit": "7"}).json()["sessions"]) == 7


def test_the_listing_shows_only_the_sessions_the_authorize_hook_allows(redis_url: str, key_prefix: str) -> None:
    allowed: set[str] = set()
    asked: list[tuple[str | None, str]] = []

    def authorize(request: Any, session_id: str | None, action: str) -> bool:
        asked.append((session_id, action))
        return session_id is None or session_id in allowed

    for served in serve(redis_url, key_prefix, authorize=authorize):
        ids = [served.agent.new_session_id() for _ in range(12)]
        for i, sid in enumerate(ids):
            served.store.sync.accept(sid, agent=served.agent.name, message_id=f"m{i}", input="x")
        allowed.update(ids[::3])
        listed = served.client.get("/v1/sessions", params={"limit": "50"})
        assert listed.status_code == 200, listed.text
        assert {s["sessionId"] for s in listed.json()["sessions"]} == allowed
        assert (None, "list") in asked and {(sid, "state") for sid in ids} <= set(asked)


class StateCalls:
    """A real store that counts its `state` calls in flight; each waits until
    `LIST_STATE_CALLS` are in flight (or a bound passes), so the most ever seen together is
    what the listing lets run, not how fast Redis answered."""

    def __init__(self, store: Any) -> None:
        self.wrapped = store
        self.in_flight = 0
        self.most_in_flight = 0
        self.calls = 0
        self.full = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    async def state(self, session_id: str, **kwargs: Any) -> Any:
        self.calls += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.in_flight >= LIST_STATE_CALLS:
                self.full.set()
            try:
                await asyncio.wait_for(self.full.wait(), 5.0)
            except TimeoutError:
                pass  # fewer than LIST_STATE_CALLS came: the count still says how many did
            return await self.wrapped.state(session_id, **kwargs)
        finally:
            self.in_flight -= 1


def test_the_listing_reads_at_most_list_state_calls_states_at_once(redis_url: str, key_prefix: str) -> None:
    store = StateCalls(redis_store(redis_url, prefix=key_prefix))
    agent = Agent(f"list-{uuid.uuid4().hex[:6]}", model="scripted", provider=PROVIDER, store=store, waker=NoWake())
    try:
        for i in range(LIST_STATE_CALLS * 5):
            store.sync.accept(agent.new_session_id(), agent=agent.name, message_id=f"m{i}", input="x")
        app = create_app(agents=[agent], settings=Settings(redis_url=redis_url, prefix=key_prefix))
        with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=20.0) as client:
            listed = client.get("/v1/sessions", params={"limit": "100"})
            assert listed.status_code == 200, listed.text
            assert len(listed.json()["sessions"]) == LIST_STATE_CALLS * 5
    finally:
        agent.close()
    assert store.calls == LIST_STATE_CALLS * 5
    assert store.most_in_flight == LIST_STATE_CALLS


# -- item 5: open streams are bounded -------------------------------------------------------


def test_open_streams_past_the_limit_are_503_and_store_nothing(redis_url: str, key_prefix: str) -> None:
    for served in serve(redis_url, key_prefix, max_streams=2):
        sid = served.client.post("/v1/sessions", json={"input": "first"}).json()["sessionId"]
        with served.client.stream("GET", f"/v1/sessions/{sid}/stream") as one, \
                served.client.stream("GET", f"/v1/sessions/{sid}/stream") as two:
            assert one.status_code == two.status_code == 200
            third = served.client.get(f"/v1/sessions/{sid}/stream")
            assert error_of(third, 503) == "FX_LIMIT_STREAMS" and third.headers["retry-after"] == "1"
            streamed = served.client.post("/v1/sessions", json={"input": "streamed"},
                                          headers={"Accept": "application/x-ndjson"})
            assert error_of(streamed, 503) == "FX_LIMIT_STREAMS"
            assert served.sessions() == [sid]
            # Other calls are served meanwhile.
            assert served.client.get(f"/v1/sessions/{sid}").status_code == 200
        # Closed streams give their places back.
        with served.client.stream("GET", f"/v1/sessions/{sid}/stream") as again:
            assert again.status_code == 200
        assert served.client.get(f"/v1/sessions/{sid}/stream", params={"follow": "0"}).status_code == 200
