"""MCP tools, images and a steer with images in durable turns: real Redis, real Celery workers.

Each worker (`tests.durable.mcp_agents`) starts the test MCP server (`tests.durable.mcp_server`,
written with the `mcp` SDK) over stdio and runs agent `mcp` with its tools. The scripted
model calls them by prompt:

- `lookup:<id>` calls `orders_lookup_order` (marked idempotent), then answers `done:<result>`;
- `charge:<order>` calls `orders_charge` (an effect, `idempotent=False` as every MCP tool);
- `hold:<name>` streams "partial ", waits for `model.release(name)`, then "rest";
- anything else answers `echo:<prompt>`.
"""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call
from fxworker import Agent, Settings
from tests.durable.mcp_server import INSTRUCTIONS, PNG_1X1, pids_key, release_key, starts_key
from tests.durable.tooling import provider
from tests.support.workers import CeleryWorker, Workers, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery]

pytest.importorskip("mcp")

LEASE_S = 2.0
RESUME_NOTICE = "Resuming from unexpected session interruption."
AMBIGUOUS = "may have partly run"


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _prompt_and_results(request: Any) -> tuple[str, list[str]]:
    """The turn's prompt (the last user message that is not the resume notice) and the tool
    results after it."""
    messages = request.body.get("messages") or []
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user" and not _content(messages[i]).startswith(RESUME_NOTICE):
            return _content(messages[i]), [_content(m) for m in messages[i + 1:] if m.get("role") == "tool"]
    return "", []


def responder(request: Any) -> Reply:
    prompt, results = _prompt_and_results(request)
    kind, _, arg = prompt.partition(":")
    if kind in ("lookup", "charge") and results:
        return Reply(text("done:", results[-1]))
    if kind == "lookup":
        return Reply(tool_call(f"call_{arg}", "orders_lookup_order", {"id": arg}))
    if kind == "charge":
        return Reply(tool_call(f"call_{arg}", "orders_charge", {"order": arg}))
    if kind == "hold":
        return Reply(text("partial "), hold(arg), text("rest"))
    return Reply(text("echo:", prompt))


@pytest.fixture(scope="module")
def mcp_workers(workers: Workers, model: ScriptedModel, redis_url: str, prefix: str) -> Iterator[list[CeleryWorker]]:
    model.responder = responder
    env = {"FX_AGENTS": "tests.durable.mcp_agents", "FX_TEST_MODEL_URL": model.base_url,
           "FX_LEASE_S": str(LEASE_S), "FX_SWEEP_S": "0.5"}
    started = [workers.start(env=env, queues=("mcp",), concurrency=4) for _ in range(2)]
    try:
        yield started
    finally:
        _end_servers(redis_url, prefix)


def _end_servers(redis_url: str, prefix: str) -> None:
    """Ends the MCP server processes a killed worker left behind (the others end with theirs)."""
    client = redis.Redis.from_url(redis_url)
    try:
        for raw in client.lrange(pids_key(prefix), 0, -1):
            try:
                os.kill(int(raw), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    finally:
        client.close()


@pytest.fixture(scope="module")
def agent(redis_url: str, prefix: str, mcp_workers: list[CeleryWorker]) -> Iterator[Agent]:
    from fxworker.celery_app import make_celery_app
    from fxworker.store import redis_store
    from fxworker.wakers import CeleryWaker

    settings = Settings(redis_url=redis_url, prefix=prefix, lease_s=LEASE_S, reserve_s=4.0)
    client_agent = Agent("mcp", model="scripted", provider=provider(), api_key="test-key",
                         store=redis_store(redis_url, prefix=prefix),
                         waker=CeleryWaker(make_celery_app(settings)), settings=settings)
    try:
        yield client_agent
    finally:
        client_agent.close()


def lines_of(agent: Agent, session_id: str) -> list[dict[str, Any]]:
    return list(agent.blocking_session(session_id).stream(0, follow=False))


def requests_for(model: ScriptedModel, prompt: str) -> list[Any]:
    return [r for r in model.requests if _prompt_and_results(r)[0] == prompt]


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def test_an_agent_calls_an_mcp_tool_in_a_durable_turn(agent: Agent, model: ScriptedModel) -> None:
    session = agent.blocking_session()
    result = session.prompt("lookup:7").result()
    assert result.stop_reason == "end_turn"
    lines = lines_of(agent, session.id)
    starts = [ln for ln in lines if ln["type"] == "tool_start"]
    ends = [ln for ln in lines if ln["type"] == "tool_end"]
    assert [(s["name"], s["input"]) for s in starts] == [("orders_lookup_order", {"id": "7"})]
    assert [(e["isError"], e["content"]) for e in ends] == [(False, "order 7: shipped")]
    assert "".join(ln["delta"] for ln in lines if ln["type"] == "text_delta") == "done:order 7: shipped"
    first, second = requests_for(model, "lookup:7")
    assert first.body["messages"][0] == {"role": "system", "content": INSTRUCTIONS}
    names = {t["function"]["name"] for t in first.body["tools"]}
    assert names == {"orders_lookup_order", "orders_snapshot", "orders_charge"}
    assert [m["content"] for m in second.body["messages"] if m["role"] == "tool"] == ["order 7: shipped"]


def test_a_crash_during_an_mcp_call_is_answered_as_possibly_run(
    agent: Agent, model: ScriptedModel, mcp_workers: list[CeleryWorker], workers: Workers, redis_url: str, prefix: str
) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    order = "o-crash"
    session = agent.blocking_session()
    try:
        turn = session.prompt(f"charge:{order}")
        started = wait_until(lambda: client.lrange(starts_key(prefix), 0, -1), 30, what="the MCP charge started")
        assert started == [f"{order}|{started[0].split('|')[1]}"]
        server_pid = int(started[0].split("|")[1])
        victim = next(w for w in mcp_workers if w.pid == parent_pid(server_pid))
        victim.kill()  # kill -9 while the server's tool runs
        result = turn.result()
        assert result.stop_reason == "end_turn"
        lines = lines_of(agent, session.id)
        ends = [ln for ln in lines if ln["type"] == "tool_end"]
        assert len(ends) == 1 and ends[0]["isError"] is True and AMBIGUOUS in ends[0]["content"]
        resumed = [ln for ln in lines if ln["type"] == "turn_resume"]
        assert resumed and resumed[0]["interrupted"] is True
        # The call was not sent again: one start in all, by the server of the killed worker.
        client.set(release_key(order, prefix), "1")
        assert client.lrange(starts_key(prefix), 0, -1) == started
        last = requests_for(model, f"charge:{order}")[-1].body["messages"]
        assert [AMBIGUOUS in m["content"] for m in last if m["role"] == "tool"] == [True]
    finally:
        client.close()
        for worker in [w for w in mcp_workers if w.proc is not None and w.proc.poll() is not None]:
            mcp_workers.remove(worker)  # a replacement keeps two workers for the tests after this one
            mcp_workers.append(workers.start(env=dict(worker.extra_env), queues=("mcp",), concurrency=4))


def _png() -> str:
    return base64.b64encode(PNG_1X1).decode()


def test_an_image_prompt_reaches_the_model_from_a_worker(agent: Agent, model: ScriptedModel) -> None:
    session = agent.blocking_session()
    result = session.prompt(["what is this?", {"type": "image", "mimeType": "image/png", "data": _png()}]).result()
    assert result.stop_reason == "end_turn"
    body = requests_for(model, "what is this?")[0].body
    content = body["messages"][1]["content"]
    assert content == [{"type": "text", "text": "what is this?"},
                       {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_png()}"}}]


def test_a_steer_with_images_ends_the_running_turn_and_runs_next(agent: Agent, model: ScriptedModel) -> None:
    session = agent.blocking_session()
    turn = session.prompt("hold:steer-img")
    model.wait_held("steer-img", timeout_s=30)
    wait_until(lambda: any(ln["type"] == "text_delta" for ln in lines_of(agent, session.id)), 10,
               what="the partial reply stored")
    accepted = session.steer(["and this one?", {"type": "image", "mimeType": "image/png", "data": _png()}],
                             message_id="str_img1")
    assert turn.result().stop_reason == "end_turn"
    model.release("steer-img")
    wait_until(lambda: [ln for ln in lines_of(agent, session.id)
                        if ln["type"] == "turn_end" and ln["messageId"] == accepted.message_id], 30,
               what="the steer's own turn ended")
    lines = lines_of(agent, session.id)
    ends = [(ln["messageId"], ln["stopReason"]) for ln in lines if ln["type"] == "turn_end"]
    assert ends == [(turn.message_id, "end_turn"), ("str_img1", "end_turn")]
    assert not [ln for ln in lines if ln["type"] == "user_message"]
    body = requests_for(model, "and this one?")[0].body
    urls = [p["image_url"]["url"] for m in body["messages"] if isinstance(m.get("content"), list)
            for p in m["content"] if p["type"] == "image_url"]
    assert urls == [f"data:image/png;base64,{_png()}"]
    assert len(requests_for(model, "hold:steer-img")) == 1  # the first turn asked nothing more
