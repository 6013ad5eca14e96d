"""The scripted model server, over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from fxengine.testing import (
    RecordedRequest,
    Reply,
    ScriptedModel,
    cut,
    delay,
    demo_responder,
    hold,
    http_error,
    reasoning,
    text,
    tool_call,
    usage,
)


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        yield m


def chat(model: ScriptedModel, client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post(f"{model.base_url}/chat/completions", json={"model": "scripted", "stream": True, **body})


def events(body: str) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded except `[DONE]`."""
    out: list[Any] = []
    for block in body.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def deltas(evs: list[Any]) -> list[dict[str, Any]]:
    return [e["choices"][0]["delta"] for e in evs if isinstance(e, dict) and e["choices"]]


def test_text_stream_has_one_chunk_per_piece_then_finish_and_done(model: ScriptedModel) -> None:
    model.script(Reply(text("Hel", "lo"), reasoning("hm")))
    with httpx.Client() as client:
        response = chat(model, client)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    evs = events(response.text)
    assert evs[-1] == "[DONE]"
    assert [d.get("content") for d in deltas(evs)] == ["", "Hel", "lo", None, None]
    assert deltas(evs)[3] == {"reasoning_content": "hm"}
    assert evs[-2]["choices"][0]["finish_reason"] == "stop"
    assert all(e["model"] == "scripted" and e["object"] == "chat.completion.chunk" for e in evs[:-1])


def test_tool_calls_get_indexes_and_stream_arguments_in_pieces(model: ScriptedModel) -> None:
    model.script(
        Reply(
            tool_call("call_a", "lookup", {"q": "alpha beta"}, pieces=3),
            tool_call("call_b", "send", {"to": "x"}, pieces=2),
            interleave_tool_calls=True,
        )
    )
    with httpx.Client() as client:
        evs = events(chat(model, client).text)
    entries = [d["tool_calls"][0] for d in deltas(evs) if "tool_calls" in d]
    assert [e["index"] for e in entries] == [0, 1, 0, 1, 0, 1, 0]  # interleaved round-robin
    args: dict[int, str] = {}
    names: dict[int, tuple[str, str]] = {}
    for e in entries:
        if "id" in e:
            names[e["index"]] = (e["id"], e["function"]["name"])
        args[e["index"]] = args.get(e["index"], "") + e["function"]["arguments"]
    assert names == {0: ("call_a", "lookup"), 1: ("call_b", "send")}
    assert json.loads(args[0]) == {"q": "alpha beta"} and json.loads(args[1]) == {"to": "x"}
    assert evs[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_usage_chunk_follows_the_finish_chunk(model: ScriptedModel) -> None:
    model.script(Reply(usage(10, 5, cache_read_tokens=3, reasoning_tokens=2, cache_write_tokens=1), text("x")))
    with httpx.Client() as client:
        evs = events(chat(model, client).text)
    assert evs[-3]["choices"][0]["finish_reason"] == "stop"
    assert evs[-2]["choices"] == []
    assert evs[-2]["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 3},
        "completion_tokens_details": {"reasoning_tokens": 2},
        "cache_creation_input_tokens": 1,
    }


def test_cut_ends_the_body_incomplete_and_the_server_keeps_serving(model: ScriptedModel) -> None:
    model.script(Reply(text("part"), cut(), text("never")), Reply(text("next")))
    received = b""
    with httpx.Client() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            with client.stream("POST", f"{model.base_url}/chat/completions", json={"stream": True}) as response:
                for piece in response.iter_bytes():
                    received += piece
        assert b"part" in received and b"never" not in received and b"[DONE]" not in received
        assert "next" in chat(model, client).text


def test_http_errors_carry_status_body_and_retry_after(model: ScriptedModel) -> None:
    model.script(http_error(429, "slow down", retry_after_s=2), http_error(500))
    with httpx.Client() as client:
        first = chat(model, client)
        second = chat(model, client)
    assert first.status_code == 429
    assert first.headers["retry-after"] == "2"
    assert first.json()["error"]["message"] == "slow down"
    assert second.status_code == 500 and second.json()["error"]["type"] == "api_error"


def test_requests_are_recorded_and_the_responder_answers_when_the_queue_is_empty(model: ScriptedModel) -> None:
    seen: list[RecordedRequest] = []

    def responder(request: RecordedRequest) -> Reply:
        seen.append(request)
        return Reply(text(f"echo {len(request.body['messages'])}"))

    model.script(Reply(text("scripted")))
    with httpx.Client() as client:
        assert "scripted" in chat(model, client, messages=[{"role": "user", "content": "a"}]).text
        model.responder = responder
        before_ms = time.time() * 1000
        assert "echo 2" in chat(model, client, messages=[{}, {}], extra=1).text
        client.get(f"{model.base_url}/models")
    requests = model.wait_for_requests(3, timeout_s=1.0)
    assert [r.path for r in requests] == ["/v1/chat/completions", "/v1/chat/completions", "/v1/models"]
    assert requests[1].body["extra"] == 1 and requests[1].at_ms >= before_ms
    assert requests[0].headers["content-type"] == "application/json"
    assert seen == [requests[1]]
    with pytest.raises(TimeoutError):
        model.wait_for_requests(4, timeout_s=0.05)


def test_default_responder_says_ok(model: ScriptedModel) -> None:
    with httpx.Client() as client:
        assert [d.get("content") for d in deltas(events(chat(model, client).text))][1] == "ok"


def test_delay_pauses_between_chunks(model: ScriptedModel) -> None:
    model.script(Reply(text("a"), delay(150), text("b")))
    with httpx.Client() as client:
        start = time.monotonic()
        chat(model, client)
        assert time.monotonic() - start >= 0.15


def test_hold_pauses_until_release(model: ScriptedModel) -> None:
    model.script(Reply(text("before"), hold("gate"), text("after")))
    got: dict[str, str] = {}
    with httpx.Client() as client:
        thread = threading.Thread(target=lambda: got.update(body=chat(model, client).text))
        thread.start()
        model.wait_held("gate", timeout_s=5.0)
        assert "body" not in got
        model.release("gate")
        thread.join(timeout=5.0)
    assert "after" in got["body"] and got["body"].endswith("data: [DONE]\n\n")
    with pytest.raises(TimeoutError):
        model.wait_held("other", timeout_s=0.05)


def test_a_client_leaving_at_a_hold_frees_the_server(model: ScriptedModel) -> None:
    model.script(Reply(text("x"), hold("never")), Reply(text("fine")))
    with httpx.Client() as client:
        with client.stream("POST", f"{model.base_url}/chat/completions", json={"stream": True}) as response:
            next(response.iter_bytes())
            model.wait_held("never", timeout_s=5.0)
    # The held handler notices the disconnect; closing must not wait on it either.
    with httpx.Client() as client:
        assert "fine" in chat(model, client).text
    start = time.monotonic()
    model.close()
    assert time.monotonic() - start < 2.0


def test_close_ends_a_held_response_promptly() -> None:
    model = ScriptedModel().start()
    model.script(Reply(text("x"), hold("forever")))
    errors: list[BaseException] = []

    def call() -> None:
        try:
            with httpx.Client(timeout=10) as client:
                chat(model, client)
        except httpx.HTTPError as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    model.wait_held("forever", timeout_s=5.0)
    start = time.monotonic()
    model.close()
    thread.join(timeout=5.0)
    assert not thread.is_alive() and time.monotonic() - start < 2.0
    assert len(errors) == 1 and isinstance(errors[0], httpx.RemoteProtocolError)


async def test_serves_a_hundred_concurrent_streams(model: ScriptedModel) -> None:
    model.responder = lambda request: Reply(text("w"), hold("all"), text(str(request.body["n"])))
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(limits=limits, timeout=10) as client:
        tasks = [
            asyncio.create_task(client.post(f"{model.base_url}/chat/completions", json={"stream": True, "n": n}))
            for n in range(100)
        ]
        # All 100 arrive while none can finish: they are being served at the same time.
        await asyncio.to_thread(model.wait_for_requests, 100, 10.0)
        model.release("all")
        bodies = [r.text for r in await asyncio.gather(*tasks)]
    assert all(f'"content":"{n}"' in body for n, body in enumerate(bodies))


def test_non_streaming_request_gets_a_whole_completion(model: ScriptedModel) -> None:
    model.script(Reply(text("a", "b"), tool_call("c", "lookup", {"q": 1}), usage(2, 3)))
    with httpx.Client() as client:
        body = chat(model, client, stream=False).json()
    assert body["choices"][0]["message"]["content"] == "ab"
    assert body["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q":1}'}
    assert body["choices"][0]["finish_reason"] == "tool_calls" and body["usage"]["total_tokens"] == 5


def test_the_openai_sdk_reads_the_stream(model: ScriptedModel) -> None:
    model.script(Reply(text("Hi", " there"), tool_call("call_1", "lookup", {"q": "x"}, pieces=3), usage(4, 2)))
    client = openai.OpenAI(base_url=model.base_url, api_key="sk-test", max_retries=0)
    try:
        stream = client.chat.completions.create(
            model=model.model_id, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        chunks = list(stream)
    finally:
        client.close()
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    arguments = "".join(
        (tc.function.arguments or "") for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []
    )
    assert content == "Hi there" and json.loads(arguments) == {"q": "x"}
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 4
    assert model.requests[0].headers["authorization"] == "Bearer sk-test"


def test_provider_describes_the_server(model: ScriptedModel) -> None:
    assert model.base_url == f"http://127.0.0.1:{model.port}/v1"
    assert model.provider["base_url"] == model.base_url
    assert model.provider["models"][model.model_id]["supports_tools"] is True


def test_demo_responder_looks_up_then_answers_from_the_result(model: ScriptedModel) -> None:
    model.responder = demo_responder
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    user = {"role": "user", "content": "weather in Oslo"}
    with httpx.Client() as client:
        first = deltas(events(chat(model, client, messages=[user], tools=tools).text))
        call = next(d["tool_calls"][0] for d in first if "tool_calls" in d)
        args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in first if "tool_calls" in d)
        assert call["function"]["name"] == "lookup" and json.loads(args) == {"query": "weather in Oslo"}
        assistant = {"role": "assistant", "tool_calls": [{"id": call["id"], "type": "function", "function": {"name": "lookup", "arguments": args}}]}
        result = {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 C"}
        second = deltas(events(chat(model, client, messages=[user, assistant, result], tools=tools).text))
    answer = "".join(d.get("content") or "" for d in second)
    assert "sunny, 21 C" in answer and len([d for d in second if d.get("content")]) > 3


def test_demo_responder_calls_send_when_asked_and_offered() -> None:
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "please send it"}]}],
        "tools": [
            {"type": "function", "function": {"name": "send", "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}}
        ],
    }
    reply = demo_responder(RecordedRequest("/v1/chat/completions", {}, body, 0.0))
    call = reply.message()["tool_calls"][0]["function"]
    assert call["name"] == "send" and json.loads(call["arguments"]) == {"message": "please send it"}


def test_demo_responder_carries_on_after_the_resume_notice_and_answers_long_when_asked() -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    resumed = {"messages": [
        {"role": "user", "content": "Tell me about the weather, slowly"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Lisbon: 21 °C"},
        {"role": "user", "content": "Resuming from unexpected session interruption."},
    ], "tools": [tool]}
    reply = demo_responder(RecordedRequest("/v1/chat/completions", {}, resumed, 0.0))
    words = "".join("".join(part.pieces) for part in reply.parts if hasattr(part, "pieces"))
    assert words.startswith('I found: "Lisbon:') and "No fact" not in words
    assert sum(1 for part in reply.parts if getattr(part, "ms", None) == 100) == 80
