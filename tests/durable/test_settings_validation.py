"""Settings are checked at the door (§8, §10): a bad model, instructions, provider or context
is refused when the `Agent` is made, when `agent.session(...)` is built and before a prompt
or steer is stored — with the code the engine itself would raise, and nothing stored.

The HTTP cases run the real app over loopback on the test Redis and then look at the keys:
a refused request leaves no session, no inbox entry, no ready mark.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from fxengine import FxInputError, create_engine
from fxengine.limits import CONTEXT_MAX_BYTES, CONTEXT_MAX_DEPTH, check_context
from fxworker import Agent, FxUnknownSessionError, Settings, get_agent
from fxworker.keys import live_workers_key
from fxworker.store import memory_store, redis_store
from fxworker.web import create_app
from tests.durable.tooling import provider, tools
from tests.web._inprocess import ThreadServer

# A catalog entry with no efforts, no fast and no ultrafast (tests.durable.tooling).
BAD_MODELS: list[tuple[Any, str]] = [
    ({"id": "scripted", "effort": "high"}, "FX_MODEL_UNSUPPORTED_EFFORT"),
    ({"id": "scripted", "fast": True}, "FX_MODEL_UNSUPPORTED_FAST"),
    ({"id": "scripted", "ultrafast": True}, "FX_MODEL_UNSUPPORTED_ULTRAFAST"),
    ({"id": "no-such-model"}, "FX_MODEL_UNKNOWN"),
    ("no-such-model", "FX_MODEL_UNKNOWN"),
    (42, "FX_INVALID_INPUT"),
    ({"speed": 1}, "FX_INVALID_INPUT"),
    ({"id": "scripted", "effort": 3}, "FX_INVALID_INPUT"),
    ({"id": "scripted", "fast": "yes"}, "FX_INVALID_INPUT"),
    ({"id": "\ud800"}, "FX_INVALID_INPUT"),
]
BAD_INSTRUCTIONS: list[tuple[Any, str]] = [
    (7, "FX_INVALID_INPUT"),
    (["one", 2], "FX_INVALID_INPUT"),
    ({"text": "a dict"}, "FX_INVALID_INPUT"),
    ("x" * (64 * 1024 + 1), "FX_LIMIT_INSTRUCTIONS"),
    ("lone \udc00", "FX_INVALID_INPUT"),
]


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_CONTEXTS: list[tuple[Any, str]] = [
    ({"x": math.nan}, "FX_INVALID_INPUT"),
    ({"x": [math.inf]}, "FX_INVALID_INPUT"),
    ({"x": "\ud800"}, "FX_INVALID_INPUT"),
    ({"\udfff": 1}, "FX_INVALID_INPUT"),
    ({1: "int key"}, "FX_INVALID_INPUT"),
    ({"x": {1, 2}}, "FX_INVALID_INPUT"),
    ({"x": b"bytes"}, "FX_INVALID_INPUT"),
    (nested(CONTEXT_MAX_DEPTH + 1), "FX_LIMIT_CONTEXT"),
    ({"x": "y" * CONTEXT_MAX_BYTES}, "FX_LIMIT_CONTEXT"),
]


def code_of(call: Any) -> str:
    with pytest.raises(FxInputError) as refused:
        call()
    return refused.value.code


def make_agent(store: Any, name: str = "default", **options: Any) -> Agent:
    options.setdefault("model", "scripted")
    return Agent(name, provider=provider(), tools=tools(), api_key="test-key", store=store,
                 waker=NoWake(), settings=Settings(), **options)


class NoWake:
    """Wakes nobody: these tests look at what is stored, not at turns."""

    def __init__(self) -> None:
        self.wakes: list[str] = []

    def wake(self, session_id: str, *, agent: str, reason: str) -> None:
        self.wakes.append(session_id)


@pytest.fixture
def store() -> Any:
    return memory_store()


# ------------------------------------------------------------------------------ the door


@pytest.mark.parametrize(("model", "code"), BAD_MODELS)
def test_a_bad_model_is_refused_when_the_agent_is_made_and_no_agent_registers(store: Any, model: Any, code: str) -> None:
    name = f"bad-{uuid.uuid4().hex[:6]}"
    assert code_of(lambda: make_agent(store, name, model=model)) == code
    assert get_agent(name) is None


@pytest.mark.parametrize(("instructions", "code"), BAD_INSTRUCTIONS)
def test_bad_instructions_are_refused_when_the_agent_is_made(store: Any, instructions: Any, code: str) -> None:
    assert code_of(lambda: make_agent(store, f"bad-{uuid.uuid4().hex[:6]}", instructions=instructions)) == code


@pytest.mark.parametrize(
    "bad",
    [
        "not a dict",
        {"name": "p", "base_url": "http://example.com/v1", "models": {"m": {}}},  # plain http off loopback
        {"name": "p", "base_url": "https://example.com/v1", "models": {}},
        {"name": "p", "base_url": "https://example.com/v1", "models": {"m": {"context_window": -1}}},
        {"base_url": "https://example.com/v1", "models": {"m": {}}},
    ],
)
def test_a_bad_custom_provider_is_refused_when_the_agent_is_made(bad: Any) -> None:
    with pytest.raises(FxInputError) as refused:
        Agent(f"bad-{uuid.uuid4().hex[:6]}", model="m", provider=bad, store=memory_store())
    assert refused.value.code == "FX_PROVIDER_INVALID"


def test_the_gateway_without_a_catalog_takes_any_model_id_and_needs_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine checks a gateway model only against `model_catalog`; with none, neither does the door.
    monkeypatch.delenv("AI_GATEWAY_API_KEY", raising=False)
    monkeypatch.delenv("VERCEL_OIDC_TOKEN", raising=False)
    agent = Agent(f"gw-{uuid.uuid4().hex[:6]}", model={"id": "vendor/any-model", "effort": "high"}, store=memory_store())
    try:
        assert agent.session(model="another/model").model == "another/model"
        assert code_of(lambda: agent.session(model={"id": "x", "speed": 1})) == "FX_INVALID_INPUT"
    finally:
        agent.close()


@pytest.mark.parametrize(("model", "code"), BAD_MODELS)
async def test_a_bad_session_model_is_refused_and_nothing_is_stored(store: Any, model: Any, code: str) -> None:
    agent = make_agent(store)
    try:
        assert code_of(lambda: agent.session(model=model)) == code
        assert code_of(lambda: agent.blocking_session(model=model)) == code
        session = agent.session()
        session.model = model  # changed after it was built: the prompt checks again
        with pytest.raises(FxInputError) as refused:
            await session.prompt("hi")
        assert refused.value.code == code
        with pytest.raises(FxInputError) as refused:
            await session.steer("hi")
        assert refused.value.code == code
        with pytest.raises(FxUnknownSessionError):
            await session.state()
        assert agent.waker.wakes == []  # type: ignore[attr-defined]
    finally:
        agent.close()


@pytest.mark.parametrize(("instructions", "code"), BAD_INSTRUCTIONS)
async def test_bad_session_instructions_are_refused_and_nothing_is_stored(store: Any, instructions: Any, code: str) -> None:
    agent = make_agent(store)
    try:
        assert code_of(lambda: agent.session(instructions=instructions)) == code
        session = agent.session(instructions=["line one", "line two"])
        session.instructions = instructions
        with pytest.raises(FxInputError) as refused:
            await session.prompt("hi")
        assert refused.value.code == code
        with pytest.raises(FxUnknownSessionError):
            await session.state()
    finally:
        agent.close()


@pytest.mark.parametrize(("context", "code"), BAD_CONTEXTS)
async def test_a_bad_context_is_refused_and_nothing_is_stored(store: Any, context: Any, code: str) -> None:
    agent = make_agent(store)
    try:
        assert code_of(lambda: agent.session(context=context)) == code
        session = agent.session(context={"user": "u1"})
        session.context = context
        with pytest.raises(FxInputError) as refused:
            await session.prompt("hi")
        assert refused.value.code == code
        with pytest.raises(FxUnknownSessionError):
            await session.state()
    finally:
        agent.close()


def test_context_limits_are_exact() -> None:
    assert check_context(nested(CONTEXT_MAX_DEPTH - 1)) == nested(CONTEXT_MAX_DEPTH - 1)
    # The largest string that fits: 64 KiB of JSON text with the quotes and the key.
    fits = {"x": "y" * (CONTEXT_MAX_BYTES - len('{"x":""}'))}
    assert check_context(fits) == fits
    assert code_of(lambda: check_context({"x": fits["x"] + "y"})) == "FX_LIMIT_CONTEXT"
    assert check_context({"t": (1, "two", None, True, 2.5)}) == {"t": [1, "two", None, True, 2.5]}


async def test_good_settings_are_stored_with_the_prompt(store: Any) -> None:
    agent = make_agent(store)
    try:
        session = agent.session(model={"id": "scripted"}, instructions=("be", "brief"), context={"t": (1, 2)})
        await session.prompt("hi")
        claim = await store.claim(session.id, holder="test", lease_ms=10_000)
        assert claim is not None
        [entry] = claim.pending
        assert entry.settings == {"model": {"id": "scripted"}, "instructions": ["be", "brief"]}
        assert entry.context == {"t": [1, 2]}
    finally:
        agent.close()


# ------------------------------------------------------- the door and the engine agree


@pytest.mark.parametrize(("model", "code"), BAD_MODELS)
async def test_the_engine_refuses_a_bad_model_with_the_code_the_door_gives(model: Any, code: str) -> None:
    with pytest.raises(FxInputError) as refused:
        await create_engine(model, provider=provider(), api_key="test-key")
    assert refused.value.code == code


@pytest.mark.parametrize(("context", "code"), BAD_CONTEXTS)
async def test_the_engine_refuses_a_bad_context_with_the_code_the_door_gives(context: Any, code: str) -> None:
    with pytest.raises(FxInputError) as refused:
        await create_engine("scripted", provider=provider(), api_key="test-key", context=context)
    assert refused.value.code == code


@pytest.mark.parametrize(("instructions", "code"), BAD_INSTRUCTIONS)
async def test_the_engine_refuses_bad_instructions_with_the_code_the_door_gives(instructions: Any, code: str) -> None:
    with pytest.raises(FxInputError) as refused:
        await create_engine("scripted", provider=provider(), api_key="test-key", instructions=instructions)
    assert refused.value.code == code


# ------------------------------------------------------------------------------ over HTTP


@pytest.fixture
def web(redis_url: str, key_prefix: str) -> Iterator[tuple[httpx.Client, Agent, redis.Redis]]:
    agent = make_agent(redis_store(redis_url, prefix=key_prefix), f"http-{uuid.uuid4().hex[:6]}")
    raw = redis.Redis.from_url(redis_url)
    try:
        app = create_app(agents=[agent], settings=Settings(redis_url=redis_url, prefix=key_prefix))
        with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=10.0) as client:
            yield client, agent, raw
    finally:
        raw.close()
        agent.close()


def stored_keys(raw: redis.Redis, prefix: str) -> list[bytes]:
    """The keys under `prefix` but the web process's own live mark (what it reads; no request's)."""
    live = live_workers_key(prefix).encode()
    return sorted(key for key in raw.scan_iter(match=f"{prefix}:*", count=1000) if key != live)


@pytest.mark.redis
@pytest.mark.parametrize(
    ("body", "codes"),
    [
        (b'{"input": "hi", "context": {"x": NaN}}', {"FX_INVALID_INPUT", "FX_INVALID_REQUEST"}),
        (b'{"input": "hi", "context": {"x": -Infinity}}', {"FX_INVALID_INPUT", "FX_INVALID_REQUEST"}),
        (b'{"input": "hi", "context": {"x": "\\ud800"}}', {"FX_INVALID_INPUT", "FX_INVALID_REQUEST"}),
        (b'{"input": "hi", "context": ' + b"[" * 40 + b"1" + b"]" * 40 + b"}", {"FX_LIMIT_CONTEXT", "FX_INVALID_REQUEST"}),
        (b'{"input": "hi", "context": {"x": "' + b"y" * (CONTEXT_MAX_BYTES + 1) + b'"}}', {"FX_LIMIT_CONTEXT"}),
    ],
)
def test_a_session_with_a_bad_context_is_refused_over_http_and_nothing_is_stored(
    web: tuple[httpx.Client, Agent, redis.Redis], key_prefix: str, body: bytes, codes: set[str]
) -> None:
    client, agent, raw = web
    refused = client.post("/v1/sessions", content=body, headers={"content-type": "application/json"})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] in codes
    assert stored_keys(raw, key_prefix) == []  # no session, no inbox entry, no ready mark
    assert agent.waker.wakes == []  # type: ignore[attr-defined]
    # The same app stores a good one: the check above is not a store that writes nothing.
    created = client.post("/v1/sessions", json={"input": "hi", "context": {"x": 1.5}})
    assert created.status_code == 202, created.text
    assert stored_keys(raw, key_prefix) != []


@pytest.mark.parametrize("text", ["a lone surrogate \ud800", "\udfff"])
async def test_a_prompt_or_steer_with_a_lone_surrogate_is_refused_and_nothing_is_stored(store: Any, text: str) -> None:
    agent = make_agent(store, f"surrogate-{uuid.uuid4().hex[:6]}")
    try:
        session = agent.session()
        with pytest.raises(FxInputError) as refused:
            await session.prompt(text)
        assert refused.value.code == "FX_INVALID_INPUT"
        with pytest.raises(FxInputError) as refused:
            await session.steer(text)
        assert refused.value.code == "FX_INVALID_INPUT"
        with pytest.raises(FxUnknownSessionError):
            await session.state()
        assert agent.waker.wakes == []  # type: ignore[attr-defined]
    finally:
        agent.close()
