from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from fxengine import Engine, Turn, TurnResult, create_engine
from fxengine.models.aio import AioClient
from fxengine.testing import ScriptedModel


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as server:
        yield server


@pytest.fixture(params=["httpx", "aiohttp"])
async def http_client(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    """A plain httpx client, and a worker's (`AioClient`: the model request on aiohttp)."""
    if request.param == "httpx":
        client = httpx.AsyncClient(timeout=httpx.Timeout(10.0))
    else:
        client = AioClient(timeout=httpx.Timeout(10.0), limits=httpx.Limits(max_connections=16),
                           verify=httpx.create_ssl_context())
    async with client:
        yield client


class Diagnostics(list[dict[str, Any]]):
    """Collects `on_event` diagnostics."""

    def __call__(self, event: dict[str, Any]) -> None:
        self.append(event)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self if e["type"] == kind]


@pytest.fixture
def diagnostics() -> Diagnostics:
    return Diagnostics()


@pytest.fixture
async def make_engine(
    model: ScriptedModel, http_client: httpx.AsyncClient, diagnostics: Diagnostics
) -> AsyncIterator[Callable[..., Any]]:
    engines: list[Engine] = []

    async def make(**options: Any) -> Engine:
        options.setdefault("provider", model.provider)
        options.setdefault("http_client", http_client)
        options.setdefault("on_event", diagnostics)
        engine = await create_engine(options.pop("model_id", model.model_id), **options)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.close()


async def run(turn: Turn, timeout_s: float = 10.0) -> tuple[list[dict[str, Any]], TurnResult]:
    """Reads every event of `turn`, then its result."""

    async def read() -> tuple[list[dict[str, Any]], TurnResult]:
        events = [event async for event in turn]
        return events, await turn.result()

    return await asyncio.wait_for(read(), timeout_s)


async def wait_until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Polls `cond` until it holds, failing after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


# Each turn's reader, kept open between calls: closing an iteration early cancels the turn.
_readers: weakref.WeakKeyDictionary[Any, AsyncIterator[dict[str, Any]]] = weakref.WeakKeyDictionary()


async def next_event(turn: Any, kind: str) -> dict[str, Any]:
    """The turn's next event of `kind`, read without cancelling the turn."""
    events = _readers.setdefault(turn, aiter(turn))
    async for event in events:
        if event["type"] == kind:
            return event
    raise AssertionError(f"no {kind}")


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "text_delta")
