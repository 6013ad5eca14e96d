from __future__ import annotations

import base64
from typing import Any

import pytest

from fxengine import FxError, FxInputError, FxLimitError, FxProviderError, MemoryPersistence, check_prompt_input, create_engine
from fxengine.limits import check_message_id
from fxengine.providers import GATEWAY_BASE_URL, gateway_provider, resolve_provider
from fxengine.testing import Reply, ScriptedModel, text

from .conftest import run

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 64
MIB = 1024 * 1024


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image(data: bytes, mime: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "data": b64(data), "mimeType": mime}


@pytest.mark.parametrize(
    ("prompt", "code"),
    [
        ("", "FX_INVALID_INPUT"),
        ("   \n", "FX_INVALID_INPUT"),
        ([], "FX_INVALID_INPUT"),
        (42, "FX_INVALID_INPUT"),
        ([{"type": "video"}], "FX_INVALID_INPUT"),
        ("a lone surrogate \ud800", "FX_INVALID_INPUT"),
        ([{"type": "text", "text": "ok"}, {"type": "text", "text": "\udfff"}], "FX_INVALID_INPUT"),
        ("x" * (MIB + 1), "FX_LIMIT_PROMPT_TEXT"),
        ([image(PNG)] * 9, "FX_LIMIT_IMAGE_COUNT"),
        ([image(PNG + b"\x00" * 3_932_160)], "FX_LIMIT_IMAGE_SIZE"),
        ([image(PNG + b"\x00" * (3 * MIB))] * 2, "FX_LIMIT_IMAGES_TOTAL"),
        ([image(PNG, "image/jpeg")], "FX_INVALID_INPUT"),
        ([image(b"GIF8 not really")], "FX_INVALID_INPUT"),
        ([{"type": "image", "data": b64(PNG)[:-2] + "\n" + b64(PNG)[-2:], "mimeType": "image/png"}], "FX_INVALID_INPUT"),
        ([{"type": "image", "data": "%%%", "mimeType": "image/png"}], "FX_INVALID_INPUT"),
    ],
)
async def test_bad_prompts_are_refused_before_anything_is_sent_or_stored(
    model: ScriptedModel, make_engine: Any, prompt: Any, code: str
) -> None:
    store = MemoryPersistence()
    engine = await make_engine(persistence=store)
    with pytest.raises(FxInputError) as refused:
        engine.prompt(prompt)
    assert refused.value.code == code
    assert refused.value.message
    assert model.requests == [] and store.records == []
    if code.startswith("FX_LIMIT"):
        assert isinstance(refused.value, FxLimitError)


def test_prompt_input_is_normalized() -> None:
    blocks = check_prompt_input(["look:", {"type": "image", "data": JPEG}, image(PNG)])
    assert blocks == [
        {"type": "text", "text": "look:"},
        {"type": "image", "mimeType": "image/jpeg", "data": b64(JPEG)},
        {"type": "image", "mimeType": "image/png", "data": b64(PNG)},
    ]
    assert check_prompt_input("hi") == [{"type": "text", "text": "hi"}]
    assert check_prompt_input([image(PNG)])[0]["mimeType"] == "image/png"  # an image alone is not empty


def test_message_ids() -> None:
    assert check_message_id("msg_1.a:b-c") == "msg_1.a:b-c"
    for bad in ("", "x" * 129, "has space", None):
        with pytest.raises(FxInputError):
            check_message_id(bad)


async def test_an_image_prompt_reaches_the_model_as_a_data_url(model: ScriptedModel, make_engine: Any) -> None:
    model.script(Reply(text("a PNG")))
    engine = await make_engine()
    await run(engine.prompt(["what is this?", image(PNG)]))
    content = model.requests[0].body["messages"][0]["content"]
    assert content[0] == {"type": "text", "text": "what is this?"}
    assert content[1]["image_url"]["url"] == f"data:image/png;base64,{b64(PNG)}"


async def test_a_model_without_images_refuses_an_image_prompt(model: ScriptedModel, make_engine: Any) -> None:
    provider = model.provider
    provider["models"][model.model_id]["supports_images"] = False
    engine = await make_engine(provider=provider)
    with pytest.raises(FxInputError) as refused:
        engine.prompt([image(PNG)])
    assert refused.value.code == "FX_MODEL_NO_IMAGES" and model.requests == []


@pytest.mark.parametrize(
    ("base_url", "ok"),
    [
        ("https://api.example.com/v1", True),
        ("http://127.0.0.1:9/v1", True),
        ("http://localhost:9/v1", True),
        ("http://[::1]:9/v1", True),
        ("http://api.example.com/v1", False),
        ("http://10.0.0.1/v1", False),
        ("ftp://127.0.0.1/v1", False),
        ("not a url", False),
    ],
)
def test_custom_providers_need_https_or_loopback(base_url: str, ok: bool) -> None:
    spec = {"name": "p", "base_url": base_url, "models": {"m": {"context_window": 10}}}
    if ok:
        assert resolve_provider(spec, api_key=None).base_url == base_url
    else:
        with pytest.raises(FxInputError) as refused:
            resolve_provider(spec, api_key=None)
        assert refused.value.code == "FX_PROVIDER_INVALID"


@pytest.mark.parametrize(
    "spec",
    [
        None,
        {"base_url": "https://x/v1", "models": {"m": {}}},
        {"name": "p", "base_url": "https://x/v1", "models": {}},
        {"name": "p", "base_url": "https://x/v1", "models": {"m": {"context_window": -1}}},
        {"name": "p", "base_url": "https://x/v1", "models": {"m": {"supports_tools": "yes"}}},
    ],
)
def test_malformed_provider_dicts(spec: Any) -> None:
    with pytest.raises(FxInputError):
        resolve_provider(spec if spec is not None else "nope", api_key=None)  # type: ignore[arg-type]


async def test_the_gateway_needs_a_key_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AI_GATEWAY_API_KEY", raising=False)
    monkeypatch.delenv("VERCEL_OIDC_TOKEN", raising=False)
    with pytest.raises(FxProviderError) as missing:
        await create_engine("anthropic/claude-haiku-4.5")
    assert missing.value.code == "FX_PROVIDER_NO_CREDENTIALS"
    assert "AI_GATEWAY_API_KEY" in missing.value.message


def test_gateway_key_order() -> None:
    env = {"AI_GATEWAY_API_KEY": "from-env", "VERCEL_OIDC_TOKEN": "oidc"}
    assert gateway_provider(api_key="given", env=env).api_key == "given"
    assert gateway_provider(api_key=None, env=env).api_key == "from-env"
    assert gateway_provider(api_key=None, env={"VERCEL_OIDC_TOKEN": "oidc"}).api_key == "oidc"
    provider = gateway_provider(api_key="sk-secret-value-123", env={})
    assert provider.base_url == GATEWAY_BASE_URL == "https://ai-gateway.vercel.sh/v1"
    assert "sk-secret-value-123" not in repr(provider)


def test_gateway_base_url_order() -> None:
    env = {"AI_GATEWAY_API_KEY": "k", "AI_GATEWAY_BASE_URL": "http://127.0.0.1:9/v1"}
    assert gateway_provider(api_key=None, env=env).base_url == "http://127.0.0.1:9/v1"
    assert gateway_provider(api_key=None, env=env, base_url="https://proxy.internal/v1").base_url == "https://proxy.internal/v1"
    with pytest.raises(FxInputError):
        gateway_provider(api_key=None, env={**env, "AI_GATEWAY_BASE_URL": "ftp://nope"})


@pytest.mark.parametrize(
    ("model_setting", "code"),
    [
        ({"id": "scripted", "effort": "high"}, "FX_MODEL_UNSUPPORTED_EFFORT"),
        ({"id": "scripted", "fast": True}, "FX_MODEL_UNSUPPORTED_FAST"),
        ({"id": "scripted", "ultrafast": True}, "FX_MODEL_UNSUPPORTED_ULTRAFAST"),
        ({"id": "other"}, "FX_MODEL_UNKNOWN"),
        ({"id": "scripted", "speed": 3}, "FX_INVALID_INPUT"),
        ({"effort": "high"}, "FX_INVALID_INPUT"),
        (7, "FX_INVALID_INPUT"),
    ],
)
async def test_model_settings_are_checked_against_the_catalog(model: ScriptedModel, model_setting: Any, code: str) -> None:
    with pytest.raises(FxInputError) as refused:
        await create_engine(model_setting, provider=model.provider)
    assert refused.value.code == code
    assert model.requests == []


async def test_supported_settings_reach_the_request(model: ScriptedModel, make_engine: Any) -> None:
    provider = model.provider
    provider["models"][model.model_id].update({"efforts": ["low", "high"], "ultrafast": True})
    model.script(Reply(text("ok")))
    engine = await make_engine(provider=provider, model_id={"id": model.model_id, "effort": "high", "ultrafast": True})
    await run(engine.prompt("q"))
    body = model.requests[0].body
    assert body["reasoning_effort"] == "high" and body["service_tier"] == "priority"


async def test_bad_engine_options(model: ScriptedModel) -> None:
    for options in ({"max_model_turns": 0}, {"instructions": 5}, {"instructions": "x" * (65 * 1024)},
                    {"context": {1, 2}}, {"checkpoint": "text"}, {"tools": [object()]}):
        with pytest.raises(FxInputError):
            await create_engine(model.model_id, provider=model.provider, **options)
    engine = await create_engine(model.model_id, provider=model.provider)
    with pytest.raises(FxInputError):
        engine.prompt("q", yield_at=-1)
    with pytest.raises(FxInputError):
        engine.prompt("q", turn_id="bad id")
    await engine.close()
    with pytest.raises(FxError) as closed:
        engine.prompt("q")
    assert closed.value.code == "FX_ENGINE_CLOSED"
