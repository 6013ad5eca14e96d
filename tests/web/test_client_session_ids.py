"""`POST /v1/sessions` naming its session (`sessionId`), where the embedder allows it
(`create_app(client_session_ids=)`), over real HTTP.

The app serves the agent `default` on the embedded store (the production Lua on fakeredis)
with an in-process worker, as `fx dev` does, against the durable tests' scripted model
(a plain prompt is answered `echo:<prompt>`). With no `authorize` hook (the server's own
token or loopback guards the API) a create may name its session, and a second create with
that id prompts the same session; under a hook it may not (403 `FX_FORBIDDEN`, nothing
stored) unless the embedder says so, with `True` or a callable of its own, and the hook is
asked for a `prompt` on that id. `False` refuses it in token mode too. A refused id form
is 400 `FX_INVALID_SESSION_ID` before any hook is asked about it. The OpenAPI document
describes `sessionId` and the answers. A create naming another agent's session prompts it
as its owner. A create naming an existing session under a `session_context` hook re-pins
that session's context (marked as a known failure: the prompt route keeps the context
pinned at create). Users are named by an `x-user` header (a stand-in for the embedder's
cookie session).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import fakeredis
import httpx
import pytest
import schemathesis
from jsonschema import Draft202012Validator
from starlette.requests import Request

from fxengine.testing import ScriptedModel
from fxworker import Agent
from fxworker.embedded import InProcessWaker
from fxworker.errors import FxUnknownSessionError
from fxworker.keys import session_keys
from fxworker.settings import Settings
from fxworker.store.embedded import shared_server
from fxworker.web import create_app
from tests.durable.conftest import embedded_agent, responder, system_text
from tests.durable.tooling import provider, tools
from tests.web._inprocess import ThreadServer

pytestmark = pytest.mark.timeout(60)

TURN_S = 15.0
ALICE = {"x-user": "alice"}
BOB = {"x-user": "bob"}
REFUSED = ["fxs_user", "..", ".", "a/b", "x" * 129, "a b", "{x}", ""]


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


class Hook:
    """An `authorize` hook that records what it is asked and allows `actions` to alice and bob."""

    def __init__(self, actions: tuple[str, ...] = ("create", "prompt", "stream", "state", "list")) -> None:
        self.actions = actions
        self.asked: list[tuple[str | None, str]] = []

    def __call__(self, request: Request, session_id: str | None, action: str) -> bool:
        self.asked.append((session_id, action))
        return request.headers.get("x-user") in ("alice", "bob") and action in self.actions


@asynccontextmanager
async def serve(scripted: ScriptedModel, *, start_workers: bool = True,
                **options: Any) -> AsyncIterator[tuple[httpx.AsyncClient, Agent]]:
    """`create_app(agents={"default": ...}, **options)` on the embedded store with one
    in-process worker (none with `start_workers=False`: inputs stay in the inbox, seen),
    served on a loopback port; a client of it and the agent."""
    with embedded_agent(scripted, start_workers=start_workers) as agent:
        app = create_app(agents={"default": agent}, settings=Settings(), **options)
        with ThreadServer(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
                yield client, agent


async def turn_end(client: httpx.AsyncClient, session_id: str, message_id: str, *, cursor: int = 0,
                   headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The session's lines after `cursor`, read from its stream (followed) up to the
    `turn_end` of `message_id`; fails after `TURN_S`."""
    async def read() -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        async with client.stream("GET", f"/v1/sessions/{session_id}/stream", params={"cursor": cursor},
                                 headers=headers, timeout=TURN_S) as response:
            assert response.status_code == 200, await response.aread()
            assert response.headers["content-type"].startswith("application/x-ndjson")
            async for raw in response.aiter_lines():
                if not raw.strip():
                    continue
                lines.append(json.loads(raw))
                if lines[-1]["type"] == "turn_end" and lines[-1].get("messageId") == message_id:
                    return lines
        raise AssertionError(f"the stream ended before the turn_end of {message_id}: {lines}")

    return await asyncio.wait_for(read(), TURN_S)


async def nothing_stored(client: httpx.AsyncClient, agent: Agent, session_id: str,
                         headers: dict[str, str] | None = None) -> None:
    with pytest.raises(FxUnknownSessionError):
        await agent.store.state(session_id)
    assert session_id not in await agent.store.list_sessions()
    assert (await client.get(f"/v1/sessions/{session_id}", headers=headers)).status_code == 404


def forbidden(answer: httpx.Response) -> bool:
    return answer.status_code == 403 and answer.json()["error"]["code"] == "FX_FORBIDDEN"


# ---------------------------------------------------------------------------- token / loopback mode


async def test_without_a_hook_a_create_names_its_session_and_a_second_one_prompts_it(scripted: ScriptedModel) -> None:
    async with serve(scripted) as (client, agent):
        created = await client.post("/v1/sessions", json={"input": "hi", "sessionId": "user-7"})
        assert created.status_code == 202, created.text
        body = created.json()
        assert body["sessionId"] == "user-7" and body["repeated"] is False
        assert created.headers["x-fx-session-id"] == "user-7"
        first = await turn_end(client, "user-7", body["messageId"])
        assert first[-1]["stopReason"] == "end_turn"
        assert "".join(line.get("delta", "") for line in first if line["type"] == "text_delta") == "echo:hi"

        again = await client.post("/v1/sessions", json={"input": "again", "sessionId": "user-7"})
        assert again.status_code == 202, again.text
        assert again.json()["sessionId"] == "user-7" and again.json()["messageId"] != body["messageId"]
        second = await turn_end(client, "user-7", again.json()["messageId"], cursor=first[-1]["cursor"])
        assert second[-1]["stopReason"] == "end_turn"
        assert [line["type"] for line in second].count("turn_start") == 1  # only the new turn after the cursor

        state = (await client.get("/v1/sessions/user-7")).json()
        assert (state["sessionId"], state["status"], state["turns"]) == ("user-7", "idle", 2)
        listed = (await client.get("/v1/sessions")).json()["sessions"]
        assert [s["sessionId"] for s in listed if s["sessionId"] == "user-7"] == ["user-7"]
        timeline = await client.get("/v1/sessions/user-7/timeline")
        assert timeline.status_code == 200, timeline.text
        assert [t["messageId"] for t in timeline.json()["turns"]] == [body["messageId"], again.json()["messageId"]]
        assert (await agent.session("user-7").state())["turns"] == 2
        # The model was sent the first turn with the second: one conversation.
        sent = json.dumps(scripted.requests[-1].body["messages"])
        assert "hi" in sent and "again" in sent


async def test_a_named_create_repeated_under_its_message_id_stores_nothing_new(scripted: ScriptedModel) -> None:
    async with serve(scripted) as (client, agent):
        create = {"input": "hi", "sessionId": "user-8", "messageId": "first-hello"}
        created = await client.post("/v1/sessions", json=create)
        assert created.status_code == 202, created.text
        await turn_end(client, "user-8", "first-hello")
        repeated = await client.post("/v1/sessions", json=create)
        assert repeated.status_code == 202, repeated.text
        assert repeated.json()["sessionId"] == "user-8" and repeated.json()["repeated"] is True
        state = await agent.store.state("user-8")
        assert (state.turns, state.pending) == (1, 0)


async def test_a_named_create_can_stream_its_turn(scripted: ScriptedModel) -> None:
    async with serve(scripted) as (client, _):
        async def read() -> list[dict[str, Any]]:
            async with client.stream("POST", "/v1/sessions", json={"input": "streamed", "sessionId": "user-9"},
                                     headers={"accept": "application/x-ndjson"}, timeout=TURN_S) as response:
                assert response.status_code == 200, await response.aread()
                return [json.loads(raw) async for raw in response.aiter_lines() if raw.strip()]

        lines = await asyncio.wait_for(read(), TURN_S)
        assert lines[0]["type"] == "turn_start" and lines[-1]["type"] == "turn_end"
        assert lines[-1]["stopReason"] == "end_turn"
        state = (await client.get("/v1/sessions/user-9")).json()
        assert state["turns"] == 1


async def test_a_create_naming_another_agents_session_prompts_it_as_its_owner(scripted: ScriptedModel) -> None:
    with embedded_agent(scripted) as agent:
        other = Agent("other", model="scripted", provider=provider(scripted.base_url), api_key="test-key",
                      tools=tools(), store=agent.store, waker=InProcessWaker(start_workers=False),
                      instructions="You are other.")
        try:
            app = create_app(agents={"default": agent, "other": other}, settings=Settings())
            with ThreadServer(app) as url:
                async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
                    first = await client.post("/v1/sessions",
                                              json={"input": "a", "sessionId": "user-5", "agent": "other"})
                    assert first.status_code == 202, first.text
                    await turn_end(client, "user-5", first.json()["messageId"])
                    second = await client.post("/v1/sessions", json={"input": "b", "sessionId": "user-5"})
                    assert second.status_code == 202 and second.json()["sessionId"] == "user-5", second.text
                    await turn_end(client, "user-5", second.json()["messageId"])
                    state = (await client.get("/v1/sessions/user-5")).json()
                    assert (state["agent"], state["turns"]) == ("other", 2)
        finally:
            other.close()
    asked = [(system_text(r), r.body["messages"][-1]["content"]) for r in scripted.requests[-2:]]
    assert asked == [("You are other.", "a"), ("You are other.", "b")]


async def test_client_session_ids_false_refuses_a_named_create_in_token_mode(scripted: ScriptedModel) -> None:
    async with serve(scripted, client_session_ids=False) as (client, agent):
        refused = await client.post("/v1/sessions", json={"input": "hi", "sessionId": "user-7"})
        assert forbidden(refused), refused.text
        await nothing_stored(client, agent, "user-7")
        plain = await client.post("/v1/sessions", json={"input": "hi"})
        assert plain.status_code == 202 and plain.json()["sessionId"].startswith("fxs_")


# ---------------------------------------------------------------------------- under an authorize hook


async def test_under_a_hook_a_named_create_is_forbidden_by_default_and_stores_nothing(
        scripted: ScriptedModel) -> None:
    hook = Hook()
    async with serve(scripted, authorize=hook) as (client, agent):
        refused = await client.post("/v1/sessions", headers=ALICE, json={"input": "hi", "sessionId": "user-7"})
        assert forbidden(refused), refused.text
        assert hook.asked == [(None, "create")]  # never asked about user-7: the server refused it first
        await nothing_stored(client, agent, "user-7", ALICE)
        plain = await client.post("/v1/sessions", headers=ALICE, json={"input": "hi"})
        assert plain.status_code == 202, plain.text


async def test_client_session_ids_true_under_a_hook_asks_it_for_a_prompt_on_that_id(scripted: ScriptedModel) -> None:
    hook = Hook()
    async with serve(scripted, authorize=hook, client_session_ids=True) as (client, _):
        created = await client.post("/v1/sessions", headers=ALICE, json={"input": "hi", "sessionId": "user-7"})
        assert created.status_code == 202, created.text
        assert created.json()["sessionId"] == "user-7"
        assert hook.asked == [(None, "create"), ("user-7", "prompt")]
        lines = await turn_end(client, "user-7", created.json()["messageId"], headers=ALICE)
        assert lines[-1]["stopReason"] == "end_turn"


async def test_client_session_ids_true_under_a_hook_that_refuses_the_prompt_stores_nothing(
        scripted: ScriptedModel) -> None:
    hook = Hook(actions=("create", "state"))
    async with serve(scripted, authorize=hook, client_session_ids=True) as (client, agent):
        refused = await client.post("/v1/sessions", headers=ALICE, json={"input": "hi", "sessionId": "user-7"})
        assert forbidden(refused), refused.text
        assert hook.asked == [(None, "create"), ("user-7", "prompt")]
        await nothing_stored(client, agent, "user-7", ALICE)


def by_name(seen: list[tuple[str | None, str]]) -> Callable[[Request, str], bool]:
    def allowed(request: Request, session_id: str) -> bool:
        user = request.headers.get("x-user")
        seen.append((user, session_id))
        return user is not None and session_id.startswith(f"{user}-")
    return allowed


def by_name_async(seen: list[tuple[str | None, str]]) -> Callable[[Request, str], Any]:
    decide = by_name(seen)

    async def allowed(request: Request, session_id: str) -> bool:
        await asyncio.sleep(0)
        return decide(request, session_id)
    return allowed


@pytest.mark.parametrize("rule", [by_name, by_name_async], ids=["sync", "async"])
async def test_a_callable_lets_each_user_name_only_their_own_sessions(scripted: ScriptedModel, rule: Any) -> None:
    hook = Hook()
    seen: list[tuple[str | None, str]] = []
    async with serve(scripted, authorize=hook, client_session_ids=rule(seen)) as (client, agent):
        own = await client.post("/v1/sessions", headers=ALICE, json={"input": "hi", "sessionId": "alice-1"})
        assert own.status_code == 202 and own.json()["sessionId"] == "alice-1", own.text
        other = await client.post("/v1/sessions", headers=ALICE, json={"input": "mine now", "sessionId": "bob-1"})
        assert forbidden(other), other.text
        await nothing_stored(client, agent, "bob-1", BOB)
        # alice's session is not bob's to name either (it exists: it would be prompted).
        taken = await client.post("/v1/sessions", headers=BOB, json={"input": "hijack", "sessionId": "alice-1"})
        assert forbidden(taken), taken.text
        assert seen == [("alice", "alice-1"), ("alice", "bob-1"), ("bob", "alice-1")]
        assert ("bob-1", "prompt") not in hook.asked and hook.asked.count(("alice-1", "prompt")) == 1
        lines = await turn_end(client, "alice-1", own.json()["messageId"], headers=ALICE)
        assert [line["type"] for line in lines].count("turn_start") == 1  # bob's input never reached it
        assert (await agent.store.state("alice-1")).turns == 1


async def test_a_callable_answering_truthy_but_not_true_is_a_refusal(scripted: ScriptedModel) -> None:
    async with serve(scripted, client_session_ids=lambda request, session_id: "yes") as (client, agent):
        refused = await client.post("/v1/sessions", json={"input": "hi", "sessionId": "user-7"})
        assert forbidden(refused), refused.text
        await nothing_stored(client, agent, "user-7")


def stored_contexts(agent: Agent, session_id: str) -> list[Any]:
    """The tool context stored with each input of a session, in order (what its tools get)."""
    raw = fakeredis.FakeRedis(server=shared_server())
    try:
        entries = raw.xrange(session_keys(agent.prefix, session_id).inbox)  # type: ignore[attr-defined]
    finally:
        raw.close()
    return [json.loads(fields[b"cx"]) if fields.get(b"cx") else None for _, fields in entries]


def pinned(request: Request, create: Any) -> dict[str, Any]:
    """The embedder's choice of a new session's context: its creator."""
    return {"userId": request.headers.get("x-user")}


async def test_a_create_naming_an_existing_session_keeps_the_context_pinned_at_its_create(
        scripted: ScriptedModel) -> None:
    """A session shared by the embedder's rule (alice and bob may both prompt `ticket-1`):
    a create naming it prompts it as `POST /prompts` does, under the context pinned when it
    was created."""
    async with serve(scripted, start_workers=False, authorize=Hook(), client_session_ids=True,
                     session_context=pinned) as (client, agent):
        created = await client.post("/v1/sessions", headers=ALICE, json={"input": "a", "sessionId": "ticket-1"})
        assert created.status_code == 202, created.text
        prompted = await client.post("/v1/sessions/ticket-1/prompts", headers=BOB, json={"input": "b"})
        assert prompted.status_code == 202, prompted.text
        assert stored_contexts(agent, "ticket-1") == [{"userId": "alice"}] * 2  # the prompt route keeps it
        named = await client.post("/v1/sessions", headers=BOB, json={"input": "c", "sessionId": "ticket-1"})
        assert named.status_code == 202 and named.json()["sessionId"] == "ticket-1", named.text
        later = await client.post("/v1/sessions/ticket-1/prompts", headers=ALICE, json={"input": "d"})
        assert later.status_code == 202, later.text
        assert stored_contexts(agent, "ticket-1") == [{"userId": "alice"}] * 4


# ---------------------------------------------------------------------------- refused forms


async def test_a_refused_id_form_is_400_before_any_hook_is_asked_about_it(scripted: ScriptedModel) -> None:
    hook = Hook()
    seen: list[tuple[str | None, str]] = []
    async with serve(scripted, authorize=hook, client_session_ids=by_name(seen)) as (client, agent):
        for bad in REFUSED:
            answer = await client.post("/v1/sessions", headers=ALICE, json={"input": "hi", "sessionId": bad})
            assert answer.status_code == 400, (bad, answer.text)
            assert answer.json()["error"]["code"] == "FX_INVALID_SESSION_ID", (bad, answer.text)
        wrong_type = await client.post("/v1/sessions", headers=ALICE, json={"input": "hi", "sessionId": 42})
        assert wrong_type.status_code == 400 and wrong_type.json()["error"]["code"].startswith("FX_"), wrong_type.text
        assert seen == []  # the embedder's rule was never asked
        # The hook was asked for each create (before the body is read), never about an id.
        assert hook.asked == [(None, "create")] * (len(REFUSED) + 1)
        assert await agent.store.list_sessions() == []


async def test_a_refused_id_form_is_400_in_token_mode_even_where_naming_is_off(scripted: ScriptedModel) -> None:
    for rule in (None, False):
        async with serve(scripted, client_session_ids=rule) as (client, agent):
            for bad in REFUSED:
                answer = await client.post("/v1/sessions", json={"input": "hi", "sessionId": bad})
                assert answer.status_code == 400, (rule, bad, answer.text)
                assert answer.json()["error"]["code"] == "FX_INVALID_SESSION_ID", (rule, bad, answer.text)
            assert await agent.store.list_sessions() == []


# ---------------------------------------------------------------------------- the description


async def test_the_openapi_document_describes_session_id_and_the_answers(scripted: ScriptedModel) -> None:
    async with serve(scripted) as (client, _):
        served = await client.get("/openapi.json")
        assert served.status_code == 200
        document = served.json()
        schema = schemathesis.openapi.from_dict(document)
        operations = {(op.method.upper(), op.path): op for op in (r.ok() for r in schema.get_all_operations())}
        assert len(operations) == 10
        create = operations[("POST", "/v1/sessions")]
        body_schema = document["paths"]["/v1/sessions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        Draft202012Validator.check_schema(body_schema)
        assert {"type": "string"} in body_schema["properties"]["sessionId"]["anyOf"]
        Draft202012Validator(body_schema).validate({"input": "hi", "sessionId": "user-7"})
        assert set(document["paths"]["/v1/sessions"]["post"]["responses"]) >= {"202", "400", "403"}

        accepted = await client.post("/v1/sessions", json={"input": "hi", "sessionId": "user-7"})
        bad = await client.post("/v1/sessions", json={"input": "hi", "sessionId": "a/b"})
        assert (accepted.status_code, bad.status_code) == (202, 400)
        for answer in (accepted, bad):
            create.validate_response(answer)
        state = operations[("GET", "/v1/sessions/{session_id}")]
        state.validate_response(await client.get("/v1/sessions/user-7"))
