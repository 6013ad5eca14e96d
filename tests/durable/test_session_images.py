"""Session prompts and steers with images on a real Redis store (no worker needed): every limit
and mismatch is refused with its code before anything is stored, the agent's resize hook runs
before the limits, and a model that takes no images gets none (docs/design.md §10)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fxengine import FxInputError, FxLimitError
from fxengine.limits import IMAGE_MAX_BYTES, MIB
from fxworker import Agent, Settings
from tests.durable.tooling import provider

pytestmark = [pytest.mark.redis]

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 64


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image(data: bytes, mime: str | None = "image/png") -> dict[str, Any]:
    block: dict[str, Any] = {"type": "image", "data": b64(data)}
    if mime is not None:
        block["mimeType"] = mime
    return block


class Wakes(list[tuple[str, str]]):
    """A waker that only records: these tests run no worker."""

    def wake(self, session_id: str, *, agent: str, reason: str) -> None:
        self.append((session_id, reason))


@pytest.fixture
def wakes() -> Wakes:
    return Wakes()


@pytest.fixture
def make_agent(redis_url: str, key_prefix: str, wakes: Wakes) -> Iterator[Any]:
    from fxworker.store import redis_store

    made: list[Agent] = []

    def make(name: str, **options: Any) -> Agent:
        options.setdefault("provider", provider())
        agent = Agent(name, model="scripted", api_key="test-key", store=redis_store(redis_url, prefix=key_prefix),
                      waker=wakes, settings=Settings(redis_url=redis_url, prefix=key_prefix), **options)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.close()


def stored_keys(redis_url: str, prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(redis_url)
    try:
        return list(client.scan_iter(match=f"{prefix}:*"))
    finally:
        client.close()


@pytest.mark.parametrize(
    ("prompt", "code"),
    [
        ([image(PNG)] * 9, "FX_LIMIT_IMAGE_COUNT"),
        ([image(PNG + b"\x00" * IMAGE_MAX_BYTES)], "FX_LIMIT_IMAGE_SIZE"),
        ([image(PNG + b"\x00" * (3 * MIB))] * 2, "FX_LIMIT_IMAGES_TOTAL"),
        ([image(PNG, "image/jpeg")], "FX_INVALID_INPUT"),  # the bytes are PNG
        ([image(b"BM not an image")], "FX_INVALID_INPUT"),  # not PNG, JPEG, GIF or WebP
        ([{"type": "image", "data": b64(PNG) + "\n", "mimeType": "image/png"}], "FX_INVALID_INPUT"),
        ([{"type": "image", "data": b64(PNG + b"\x00")[:-3] + "B==", "mimeType": "image/png"}], "FX_INVALID_INPUT"),
        ([{"type": "image", "data": PNG, "mimeType": "image/png"}], "FX_INVALID_INPUT"),  # bytes: not JSON
        ([{"type": "image", "data": b64(PNG), "mimeType": 7}], "FX_INVALID_INPUT"),
    ],
)
async def test_an_image_prompt_or_steer_over_a_limit_stores_nothing(
    make_agent: Any, wakes: Wakes, redis_url: str, key_prefix: str, prompt: Any, code: str
) -> None:
    session = make_agent("img-limits").session()
    for send in (session.prompt, session.steer):
        with pytest.raises(FxInputError) as refused:
            await send(prompt)
        assert refused.value.code == code, refused.value.message
        if code.startswith("FX_LIMIT"):
            assert isinstance(refused.value, FxLimitError)
    assert stored_keys(redis_url, key_prefix) == [] and wakes == []


async def test_a_model_that_takes_no_images_gets_none_stored(
    make_agent: Any, wakes: Wakes, redis_url: str, key_prefix: str
) -> None:
    blind = provider()
    blind["models"]["scripted"]["supports_images"] = False
    session = make_agent("img-blind", provider=blind).session()
    for send in (session.prompt, session.steer):
        with pytest.raises(FxInputError) as refused:
            await send(["look", image(PNG)])
        assert refused.value.code == "FX_MODEL_NO_IMAGES"
    assert stored_keys(redis_url, key_prefix) == [] and wakes == []
    await session.prompt("text is fine")  # and stored
    assert stored_keys(redis_url, key_prefix) and wakes == [(session.id, "prompt")]


async def test_the_resize_hook_runs_before_the_limits_and_what_it_returns_is_stored(make_agent: Any) -> None:
    seen: list[str | None] = []

    async def to_jpeg(picture: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        seen.append(picture["mime_type"])
        return {"bytes": JPEG, "mime_type": "image/jpeg"}

    agent = make_agent("img-resize", resize_image=to_jpeg)
    session = agent.session()
    huge = PNG + b"\x00" * IMAGE_MAX_BYTES  # over 3.75 MiB before the hook
    turn = await session.prompt(["shrunk", image(huge)])
    assert seen == ["image/png"]
    inbox = await agent.store.watch_inbox(session.id, 0)
    assert [entry.input for entry in inbox] == [[{"type": "text", "text": "shrunk"},
                                                 {"type": "image", "mimeType": "image/jpeg", "data": b64(JPEG)}]]
    assert inbox[0].message_id == turn.message_id


async def test_a_failing_resize_hook_refuses_the_prompt(make_agent: Any, redis_url: str, key_prefix: str) -> None:
    def broken(picture: dict[str, Any]) -> dict[str, Any]:
        raise OSError("no decoder for this image")

    session = make_agent("img-broken", resize_image=broken).session()
    with pytest.raises(FxInputError) as refused:
        await session.prompt([image(PNG)])
    assert refused.value.code == "FX_INVALID_INPUT" and "no decoder" in refused.value.message
    assert stored_keys(redis_url, key_prefix) == []


async def test_a_steer_with_images_is_stored_as_blocks_and_a_text_one_as_text(make_agent: Any) -> None:
    agent = make_agent("img-steer")
    session = agent.session()
    await session.steer(["and this?", image(PNG)], message_id="str_a")
    await session.steer([{"type": "text", "text": "just text"}], message_id="str_b")
    inbox = await agent.store.watch_inbox(session.id, 0)
    assert [(e.message_id, e.input) for e in inbox] == [
        ("str_a", [{"type": "text", "text": "and this?"}, {"type": "image", "mimeType": "image/png", "data": b64(PNG)}]),
        ("str_b", "just text"),
    ]


async def test_a_steer_counts_its_text_not_its_image_against_the_steer_size(make_agent: Any) -> None:
    """A steer's 64 KiB is its text; an image of 1 MiB (within the image limits) is stored."""
    session = make_agent("img-steer-size").session()
    big = PNG + b"\x00" * MIB
    accepted = await session.steer(["look", image(big)], message_id="str_big")
    assert not accepted.repeated
    with pytest.raises(FxLimitError) as refused:
        await session.steer(["x" * (64 * 1024 + 1), image(PNG)], message_id="str_long")
    assert refused.value.code == "FX_LIMIT_STEER_SIZE"
