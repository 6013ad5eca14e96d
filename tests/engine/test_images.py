"""Images in an engine's turns (docs/design.md §10): the request body, the resize hook,
models that take no images, tool-result images, and a steer with images."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from fxengine import FxInputError, FxSteerDeferredError, MemoryPersistence, Tool
from fxengine.limits import IMAGE_MAX_BYTES, prepare_prompt_input, stage_prompt_input
from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call

from .conftest import next_event, run, wait_until

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 64
GIF = b"GIF89a" + b"\x00" * 32
WEBP = b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\x00" * 32


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image(data: bytes, mime: str, key: str = "mimeType") -> dict[str, Any]:
    return {"type": "image", "data": b64(data), key: mime}


def image_urls(body: dict[str, Any]) -> list[str]:
    return [part["image_url"]["url"] for message in body["messages"] if isinstance(message.get("content"), list)
            for part in message["content"] if part["type"] == "image_url"]


def no_images_provider(model: ScriptedModel) -> dict[str, Any]:
    provider = model.provider
    provider["models"][model.model_id]["supports_images"] = False
    return provider


async def test_an_image_turn_sends_each_type_in_order_as_data_urls(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("four pictures")))
    engine = await make_engine()
    prompt = ["compare:", image(PNG, "image/png"), image(JPEG, "image/jpeg", "mime_type"),
              {"type": "image", "data": GIF}, image(WEBP, "image/webp"), "which is best?"]
    _, result = await run(engine.prompt(prompt))
    assert result.stop_reason == "end_turn"
    content = model.requests[0].body["messages"][0]["content"]
    assert content == [
        {"type": "text", "text": "compare:"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{b64(JPEG)}"}},
        {"type": "image_url", "image_url": {"url": f"data:image/gif;base64,{b64(GIF)}"}},
        {"type": "image_url", "image_url": {"url": f"data:image/webp;base64,{b64(WEBP)}"}},
        {"type": "text", "text": "which is best?"},
    ]


async def test_bytes_are_taken_by_the_engine_alone(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("ok")))
    engine = await make_engine()
    await run(engine.prompt([{"type": "image", "data": PNG, "mimeType": "image/png"}]))
    assert image_urls(model.requests[0].body) == [f"data:image/png;base64,{b64(PNG)}"]
    with pytest.raises(FxInputError, match="base64 string"):
        stage_prompt_input([{"type": "image", "data": PNG}], json_only=True)


async def test_a_sync_resize_hook_runs_before_the_limits(model: ScriptedModel, make_engine: Any) -> None:
    seen: list[tuple[int, str | None]] = []

    def shrink(picture: dict[str, Any]) -> dict[str, Any]:
        seen.append((len(picture["bytes"]), picture["mime_type"]))
        return {"bytes": JPEG, "mime_type": "image/jpeg"}

    huge = PNG + b"\x00" * IMAGE_MAX_BYTES  # over 3.75 MiB: refused without the hook
    model.script(Reply(text("small now")))
    engine = await make_engine(resize_image=shrink)
    await run(engine.prompt(["look", image(huge, "image/png")]))
    assert seen == [(len(huge), "image/png")]
    assert image_urls(model.requests[0].body) == [f"data:image/jpeg;base64,{b64(JPEG)}"]
    # The limits apply to what the hook returns: a claimed type its bytes do not match.
    liar = await make_engine(resize_image=lambda picture: {"bytes": PNG, "mime_type": "image/gif"})
    with pytest.raises(FxInputError) as refused:
        liar.prompt([image(PNG, "image/png")])
    assert refused.value.code == "FX_INVALID_INPUT" and "image/gif" in refused.value.message
    assert len(model.requests) == 1


async def test_an_async_resize_hook_is_awaited_in_the_turn(model: ScriptedModel, make_engine: Any) -> None:
    async def convert(picture: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"bytes": GIF, "mime_type": "image/gif"}

    model.script(Reply(text("a gif")))
    store = MemoryPersistence()
    engine = await make_engine(resize_image=convert, persistence=store)
    _, result = await run(engine.prompt([image(PNG, "image/png")]))
    assert result.stop_reason == "end_turn"
    assert image_urls(model.requests[0].body) == [f"data:image/gif;base64,{b64(GIF)}"]

    async def enlarge(picture: dict[str, Any]) -> dict[str, Any]:
        return {"bytes": PNG + b"\x00" * IMAGE_MAX_BYTES, "mime_type": "image/png"}

    before = len(store.records)
    big = await make_engine(resize_image=enlarge, persistence=MemoryPersistence())
    _, refused = await run(big.prompt([image(PNG, "image/png")]))
    assert refused.stop_reason == "error" and refused.error["code"] == "FX_LIMIT_IMAGE_SIZE"
    assert len(model.requests) == 1 and len(store.records) == before
    assert big.core.journal.head is None  # nothing journaled
    model.script(Reply(text("text is fine")))
    assert (await run(big.prompt("and now text")))[1].stop_reason == "end_turn"  # the engine stays usable


async def test_a_model_without_images_gets_none(model: ScriptedModel, make_engine: Any) -> None:
    async def picture(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"type": "fx.tool-result", "text": "here", "images": [{"data": b64(PNG), "mimeType": "image/png"}]}

    tools = [Tool("picture", "a picture", {"type": "object"}, idempotent=True, execute=picture)]
    engine = await make_engine(provider=no_images_provider(model), tools=tools)
    with pytest.raises(FxInputError) as refused:
        engine.prompt(["see", image(PNG, "image/png")])
    assert refused.value.code == "FX_MODEL_NO_IMAGES" and model.requests == []
    # A tool's images are left out, and the model is told.
    model.script(Reply(tool_call("c", "picture", {})), Reply(text("ok")))
    events, _ = await run(engine.prompt("take a picture"))
    assert image_urls(model.requests[1].body) == []
    tool_message = next(m for m in model.requests[1].body["messages"] if m["role"] == "tool")
    assert "FX_MODEL_NO_IMAGES" in tool_message["content"]
    assert b64(PNG) not in str(model.requests[1].body)


async def test_image_history_is_not_sent_to_a_model_without_images(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("seen")))
    seeing = await make_engine()
    await run(seeing.prompt(["remember this", image(PNG, "image/png")]))
    blind = await make_engine(provider=no_images_provider(model), checkpoint=seeing.checkpoint())
    _, result = await run(blind.prompt("what was it?"))
    assert result.stop_reason == "error" and result.error["code"] == "FX_MODEL_NO_IMAGES"
    assert len(model.requests) == 1


async def test_a_steer_with_images_ends_the_turn_and_runs_next(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("a long "), hold("h"), text("answer")), Reply(text("a PNG")))
    engine = await make_engine()
    turn = engine.prompt("describe things")
    assert (await asyncio.wait_for(next_event(turn, "text_delta"), 5))["delta"] == "a long "
    steer = ["and this?", image(PNG, "image/png")]
    with pytest.raises(FxSteerDeferredError) as deferred:
        turn.steer(steer, id="str_img")
    assert deferred.value.code == "FX_STEER_NEXT_TURN"
    with pytest.raises(FxInputError) as later:
        turn.steer("a later text steer")  # the turn takes no further steer
    assert later.value.code == "FX_TURN_ENDED"
    model.release("h")
    events, result = await run(turn)
    assert result.stop_reason == "end_turn" and len(model.requests) == 1
    assert not [e for e in events if e["type"] == "user_message"]
    _, next_result = await run(engine.prompt(steer))
    assert next_result.stop_reason == "end_turn"
    assert image_urls(model.requests[1].body) == [f"data:image/png;base64,{b64(PNG)}"]
    assert [m["role"] for m in model.requests[1].body["messages"]] == ["user", "assistant", "user"]


async def test_a_steer_with_images_during_tools_lets_them_finish(model: ScriptedModel, make_engine: Any) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow(input: dict[str, Any], ctx: Any) -> str:
        started.set()
        await release.wait()
        return "finished"

    tools = [Tool("slow", "slow", {"type": "object"}, idempotent=True, execute=slow)]
    model.script(Reply(tool_call("c", "slow", {})), Reply(text("never asked")))
    engine = await make_engine(tools=tools)
    turn = engine.prompt("go")
    await asyncio.wait_for(started.wait(), 5)
    with pytest.raises(FxSteerDeferredError):
        turn.steer([image(PNG, "image/png")])
    release.set()
    events, result = await run(turn)
    assert result.stop_reason == "end_turn" and len(model.requests) == 1
    assert [e["content"] for e in events if e["type"] == "tool_end"] == ["finished"]


async def test_a_text_only_block_steer_joins_the_turn(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("one "), hold("h"), text("two")), Reply(text("three")))
    engine = await make_engine()
    turn = engine.prompt("count")
    await asyncio.wait_for(next_event(turn, "text_delta"), 5)
    turn.steer([{"type": "text", "text": "faster"}], id="str_t")
    model.release("h")
    events, _ = await run(turn)
    assert [e["text"] for e in events if e["type"] == "user_message"] == ["faster"]
    await wait_until(lambda: len(model.requests) == 2)


async def test_the_session_form_refuses_bytes_and_keeps_limits() -> None:
    assert await prepare_prompt_input([image(PNG, "image/png")], json_only=True) == [
        {"type": "image", "mimeType": "image/png", "data": b64(PNG)}]
    with pytest.raises(FxInputError):
        await prepare_prompt_input([{"type": "image", "data": PNG}], json_only=True)
