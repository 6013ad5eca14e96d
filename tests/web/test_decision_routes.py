"""`POST /v1/sessions/{id}/calls/{call_id}` under an embedder's `authorize` hook, over real HTTP.

The app (`create_app(authorize=…)`) serves an agent on the embedded store (the production
Lua on fakeredis) with an in-process worker, as `fx dev` does; the durable tests' scripted
model parks `refund:<n>` on an approval and `pick:<p>` on an external tool's result. Users
are named by an `x-user` header (a stand-in for the embedder's cookie session): the hook
names them as the request's principal, lets alice and bob read and prompt, and lets only
alice decide. While a test sends decisions that must change nothing, the in-process worker
is stopped, so a decision stored by mistake would stay in the store to be seen.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from fxengine import Tool, ToolContext
from fxengine.testing import ScriptedModel
from fxworker import Agent, embedded
from fxworker.keys import session_keys
from fxworker.settings import Settings
from fxworker.store.embedded import shared_server
from fxworker.web import create_app
from tests.durable.conftest import embedded_agent, responder
from tests.durable.tooling import tools
from tests.web._inprocess import ThreadServer

pytestmark = pytest.mark.timeout(60)

TURN_S = 15.0
ALICE = {"x-user": "alice"}
BOB = {"x-user": "bob"}
UNKNOWN_SESSION = "fxs_01JZZZZZZZZZZZZZZZZZZZZZZZ"


def authorize(request: Request, session_id: str | None, action: str) -> bool:
    user = request.headers.get("x-user")
    if user not in ("alice", "bob"):
        return False
    request.state.principal = user
    return user == "alice" if action == "approve" else True


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


class Refunds:
    """The durable tools, with `refund` (waits for approval) counting its real runs here."""

    def __init__(self) -> None:
        self.runs: list[int] = []

        def execute(input: Any, ctx: ToolContext) -> str:
            self.runs.append(input["amount"])
            return f"refunded {input['amount']}"

        refund = Tool("refund", "Refunds an order.", {"type": "object", "properties": {"amount": {"type": "integer"}}},
                      idempotent=False, execute=execute, approval=True)
        self.tools = [refund if t.name == "refund" else t for t in tools()]


@pytest.fixture
def refunds() -> Refunds:
    return Refunds()


@pytest.fixture
async def served(scripted: ScriptedModel, refunds: Refunds) -> AsyncIterator[tuple[httpx.AsyncClient, Agent]]:
    with embedded_agent(scripted, agent_tools=refunds.tools) as agent:
        app = create_app(agents={"default": agent}, authorize=authorize, settings=Settings())
        with ThreadServer(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
                yield client, agent


async def paused_session(client: httpx.AsyncClient, prompt: str) -> tuple[str, str, str]:
    """A new session (alice's) whose first turn parked on one call: (session, turn, call)."""
    created = await client.post("/v1/sessions", headers=ALICE, json={"input": prompt})
    assert created.status_code == 202, created.text
    session_id, turn_id = created.json()["sessionId"], created.json()["messageId"]

    async def look() -> str:
        while True:
            info = (await client.get(f"/v1/sessions/{session_id}", headers=ALICE)).json()
            if info["status"] == "paused" and len(info.get("pendingCalls", [])) == 1:
                return str(info["pendingCalls"][0])
            await asyncio.sleep(0.02)

    return session_id, turn_id, await asyncio.wait_for(look(), TURN_S)


def decisions_in_inbox(agent: Agent, session_id: str) -> list[dict[str, Any]]:
    """The decisions stored in the session's inbox, each its input as accepted (with `by`)."""
    import fakeredis

    raw = fakeredis.FakeRedis(server=shared_server())
    try:
        entries = raw.xrange(session_keys(agent.prefix, session_id).inbox)  # type: ignore[attr-defined]
    finally:
        raw.close()
    return [json.loads(fields[b"in"]) for _, fields in entries if fields.get(b"k") == b"d"]


async def lines(client: httpx.AsyncClient, session_id: str) -> list[dict[str, Any]]:
    answer = await client.get(f"/v1/sessions/{session_id}/stream", headers=ALICE, params={"follow": 0})
    assert answer.status_code == 200
    return [json.loads(line) for line in answer.text.splitlines() if line.strip()]


async def turn_end(client: httpx.AsyncClient, session_id: str, turn_id: str) -> dict[str, Any]:
    async def look() -> dict[str, Any]:
        while True:
            for line in await lines(client, session_id):
                if line["type"] == "turn_end" and line["messageId"] == turn_id:
                    return line
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(look(), TURN_S)


async def still_waiting(client: httpx.AsyncClient, agent: Agent, session_id: str, call_id: str) -> None:
    state = await agent.store.state(session_id)
    assert state is not None
    assert state.status == "paused" and state.paused_calls == (call_id,)
    assert state.decisions == 0 and state.lease_holder is None
    info = (await client.get(f"/v1/sessions/{session_id}", headers=ALICE)).json()
    assert info["status"] == "paused" and info["pendingCalls"] == [call_id]
    assert decisions_in_inbox(agent, session_id) == []


def calls(session_id: str, call_id: str) -> str:
    return f"/v1/sessions/{session_id}/calls/{call_id}"


async def test_a_principal_the_hook_refuses_changes_nothing_and_an_allowed_one_is_who_decided(
        served: tuple[httpx.AsyncClient, Agent], refunds: Refunds) -> None:
    client, agent = served
    session_id, turn_id, call_id = await paused_session(client, "refund:5")
    embedded.stop_embedded_workers()  # a decision stored now stays in the store, seen

    refused = await client.post(calls(session_id, call_id), headers=BOB, json={"type": "approve"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "FX_FORBIDDEN", refused.text
    nobody = await client.post(calls(session_id, call_id), json={"type": "deny", "reason": "no"})
    assert nobody.status_code == 403, nobody.text
    await still_waiting(client, agent, session_id, call_id)

    allowed = await client.post(calls(session_id, call_id), headers=ALICE,
                                json={"type": "approve", "messageId": "alice-approves"})
    assert allowed.status_code == 202, allowed.text
    assert allowed.json() == {"sessionId": session_id, "callId": call_id, "messageId": "alice-approves",
                              "repeated": False, "turnId": turn_id, "cursor": allowed.json()["cursor"]}
    [stored] = decisions_in_inbox(agent, session_id)
    assert stored["callId"] == call_id and stored["by"] == "alice" and stored["decision"]["type"] == "approve"
    state = await agent.store.state(session_id)
    assert state is not None and state.decisions == 1

    embedded.start_embedded_workers(1)
    end = await turn_end(client, session_id, turn_id)
    assert end["stopReason"] == "end_turn"
    got = await lines(client, session_id)
    [tool_end] = [line for line in got if line["type"] == "tool_end"]
    assert tool_end["id"] == call_id and tool_end["isError"] is False and tool_end["content"] == "refunded 5"
    assert refunds.runs == [5]
    [decision] = [line for line in got if line["type"] == "approval_decision"]
    assert decision["id"] == call_id and decision["decision"] == "approve" and decision["by"] == "alice"
    assert decision["messageId"] == turn_id


async def test_bad_bodies_are_400_and_change_nothing(served: tuple[httpx.AsyncClient, Agent], refunds: Refunds) -> None:
    client, agent = served
    session_id, _, call_id = await paused_session(client, "refund:6")
    embedded.stop_embedded_workers()
    url = calls(session_id, call_id)
    json_header = {**ALICE, "content-type": "application/json"}
    bodies: list[tuple[str, bytes]] = [
        ("not JSON", b"{approve"),
        ("not an object", b'["approve"]'),
        ("no type", b"{}"),
        ("an unknown type", b'{"type": "maybe"}'),
        ("an unknown field", b'{"type": "approve", "by": "mallory"}'),
        ("a reason that is no string", b'{"type": "deny", "reason": 5}'),
        ("a reason over the cap", json.dumps({"type": "deny", "reason": "x" * 4097}).encode()),
        ("isError that is no bool", b'{"type": "result", "result": "x", "isError": "yes"}'),
        ("a bad message id", b'{"type": "approve", "messageId": "two\\nlines"}'),
    ]
    for what, body in bodies:
        answer = await client.post(url, headers=json_header, content=body)
        assert answer.status_code == 400, (what, answer.status_code, answer.text)
    form = await client.post(url, headers={**ALICE, "content-type": "application/x-www-form-urlencoded"},
                             content=b"type=approve")
    assert form.status_code == 415, form.text
    await still_waiting(client, agent, session_id, call_id)
    assert refunds.runs == []


async def test_decisions_for_no_waiting_call_are_409_and_an_unknown_session_is_404(
        served: tuple[httpx.AsyncClient, Agent], refunds: Refunds) -> None:
    client, agent = served
    session_id, turn_id, call_id = await paused_session(client, "refund:7")
    embedded.stop_embedded_workers()
    unknown = await client.post(calls(session_id, "call_nope"), headers=ALICE, json={"type": "approve"})
    assert unknown.status_code == 409 and unknown.json()["error"]["code"] == "FX_DECISION_UNKNOWN_CALL", unknown.text
    wrong_kind = await client.post(calls(session_id, call_id), headers=ALICE, json={"type": "result", "result": "x"})
    assert wrong_kind.json()["error"]["code"] == "FX_DECISION_INVALID", wrong_kind.text
    assert wrong_kind.status_code == 400
    nowhere = await client.post(calls(UNKNOWN_SESSION, call_id), headers=ALICE, json={"type": "approve"})
    assert nowhere.status_code == 404 and nowhere.json()["error"]["code"] == "FX_UNKNOWN_SESSION", nowhere.text
    await still_waiting(client, agent, session_id, call_id)

    first = await client.post(calls(session_id, call_id), headers=ALICE, json={"type": "deny", "reason": "no"})
    assert first.status_code == 202, first.text
    second = await client.post(calls(session_id, call_id), headers=ALICE, json={"type": "approve"})
    assert second.status_code == 409 and second.json()["error"]["code"] == "FX_DECISION_REPEATED", second.text
    embedded.start_embedded_workers(1)
    assert (await turn_end(client, session_id, turn_id))["stopReason"] == "end_turn"
    # Its turn ended: the denial stood, and a later answer is told so.
    ended = await client.post(calls(session_id, call_id), headers=ALICE, json={"type": "approve"})
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "FX_DECISION_REPEATED", ended.text
    other = await client.post(calls(session_id, "call_nope"), headers=ALICE, json={"type": "approve"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "FX_DECISION_UNKNOWN_CALL", other.text
    assert refunds.runs == []


async def test_an_external_call_takes_a_result_and_refuses_an_approval(
        served: tuple[httpx.AsyncClient, Agent], scripted: ScriptedModel) -> None:
    client, _ = served
    session_id, turn_id, call_id = await paused_session(client, "pick:*.csv")
    approve = await client.post(calls(session_id, call_id), headers=ALICE, json={"type": "approve"})
    assert approve.status_code == 400 and approve.json()["error"]["code"] == "FX_DECISION_INVALID", approve.text
    result = await client.post(calls(session_id, call_id), headers=ALICE,
                               json={"type": "result", "result": "report.csv"})
    assert result.status_code == 202, result.text
    assert (await turn_end(client, session_id, turn_id))["stopReason"] == "end_turn"
    tool_texts = [m["content"] for r in scripted.requests for m in r.body["messages"] if m["role"] == "tool"]
    assert "report.csv" in tool_texts
