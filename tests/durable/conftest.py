"""Fixtures of the durable tests: a scripted model, a test prefix, Celery workers, client agents.

Everything module-scoped: worker processes are started once per test module and reused.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from fxengine.testing import Reply, ScriptedModel, delay, hold, text, tool_call
from tests.durable.tooling import provider, tools
from tests.support.redis_server import delete_prefix
from tests.support.workers import Workers


def last_message_text(request: Any) -> tuple[str, str]:
    """(role, text) of the last message of a recorded chat request."""
    messages = request.body.get("messages") or []
    if not messages:
        return "", ""
    last = messages[-1]
    content = last.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return last.get("role", ""), content or ""


def system_text(request: Any) -> str:
    """The system message of a recorded chat request (the agent's instructions): how a
    scripted responder serving several agents tells them apart."""
    for message in request.body.get("messages") or []:
        if message.get("role") == "system":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def first_user_text(request: Any) -> str:
    for message in request.body.get("messages") or []:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content or ""
    return ""


def responder(request: Any) -> Reply:
    """The scripted model of the durable tests, driven by the prompt text:

    - `hold:<name>`: streams "partial ", waits for `model.release(name)`, then "rest";
    - `slow:<ms>`: waits <ms>, then answers "ok";
    - `send:<to>`: calls the `send` tool once, then answers "done";
    - `refund:<amount>[,<amount>...]`: calls `refund` once per amount, in one response;
    - `pick:<pattern>`: calls the external `pick_file`;
    - anything else: answers "echo:<prompt>".
    After a tool result it answers "done".
    """
    role, last = last_message_text(request)
    if role == "tool":
        return Reply(text("done"))
    if last.startswith("refund:"):
        return Reply(*[tool_call(f"call_{uuid.uuid4().hex[:8]}", "refund", {"amount": int(a)})
                       for a in last[7:].split(",")])
    if last.startswith("pick:"):
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "pick_file", {"pattern": last[5:]}))
    if last.startswith("hold:"):
        return Reply(text("partial "), hold(last[5:]), text("rest"))
    if last.startswith("slow:"):
        return Reply(delay(float(last[5:])), text("ok"))
    if last.startswith("send:"):
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "send", {"to": last[5:]}))
    return Reply(text("echo:", last))


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


@contextmanager
def embedded_agent(
    model: ScriptedModel, *, start_workers: bool = True, agent_tools: Sequence[Any] | None = None,
    redis_url: str | None = None, **options: Any
) -> Iterator[Any]:
    """An agent on an embedded store of its own (the same Lua on fakeredis; on the Redis at
    `redis_url` when given) with one in-process worker, started now (`start_workers`) or
    left to the test; `a.prefix` is its key prefix. Stops the workers and closes the agent
    after (and deletes a Redis prefix)."""
    from fxworker import Agent, Settings, embedded
    from fxworker.embedded import InProcessWaker
    from fxworker.store import embedded_store, redis_store

    prefix = f"fxe{uuid.uuid4().hex[:8]}"
    store = redis_store(redis_url, prefix=prefix) if redis_url else embedded_store(prefix=prefix)
    a = Agent(
        "default", model="scripted", provider=provider(model.base_url), api_key="test-key",
        tools=tools() if agent_tools is None else list(agent_tools), store=store,
        waker=InProcessWaker(start_workers=False), settings=Settings(lease_s=2.0, reserve_s=4.0, sweep_s=0.5),
        **options,
    )
    a.prefix = prefix  # type: ignore[attr-defined]
    if start_workers:
        embedded.start_embedded_workers(1)
    try:
        yield a
    finally:
        embedded.stop_embedded_workers()
        a.close()
        if redis_url:
            delete_prefix(redis_url, prefix)


async def wait_idle(agent: Any, session_id: str, *, timeout_s: float, drained: bool = True) -> Any:
    """The session's state once it is idle (and, when `drained`, with no input waiting);
    fails after `timeout_s`. Reads the store every 20 ms: nothing signals an idle session."""
    async def idle() -> Any:
        while True:
            state = await agent.store.state(session_id)
            if state is not None and state.status == "idle" and (not drained or state.pending == 0):
                return state
            await asyncio.sleep(0.02)
    return await asyncio.wait_for(idle(), timeout_s)


async def stored_lines(agent: Any, session_id: str) -> list[dict[str, Any]]:
    """Every line of the session's stream, as the store holds them."""
    return list(await agent.store.read_lines(session_id, 0, count=10_000))


@pytest.fixture(scope="module")
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix for the whole module (the workers are started with it)."""
    value = f"fxd{uuid.uuid4().hex[:10]}"
    yield value
    delete_prefix(redis_url, value)


@pytest.fixture(scope="module")
def workers(redis_url: str, prefix: str, model: ScriptedModel) -> Iterator[Workers]:
    pool = Workers(redis_url=redis_url, prefix=prefix, env={"FX_TEST_MODEL_URL": model.base_url})
    try:
        yield pool
    finally:
        pool.close()


class Client:
    """This process's side: agents of the workers' names, on the same store and broker."""

    def __init__(self, redis_url: str, prefix: str, model: ScriptedModel, names: tuple[str, ...]) -> None:
        from fxworker import Agent, Settings
        from fxworker.celery_app import make_celery_app
        from fxworker.store import redis_store
        from fxworker.wakers import CeleryWaker

        self.settings = Settings(redis_url=redis_url, prefix=prefix, lease_s=3.0, reserve_s=4.0)
        self.celery = make_celery_app(self.settings)
        self.store = redis_store(redis_url, prefix=prefix)
        self.waker = CeleryWaker(self.celery)
        self.events: list[dict[str, Any]] = []
        self.agents = {
            name: Agent(
                name,
                model="scripted",
                provider=provider(model.base_url),
                tools=tools(),
                api_key="test-key",
                store=self.store,
                waker=self.waker,
                settings=self.settings,
                on_event=self.events.append,
            )
            for name in names
        }

    def close(self) -> None:
        for agent in self.agents.values():
            agent.close()


@pytest.fixture(scope="module")
def client(redis_url: str, prefix: str, model: ScriptedModel) -> Iterator[Client]:
    c = Client(redis_url, prefix, model, ("default", "a", "b"))
    try:
        yield c
    finally:
        c.close()
