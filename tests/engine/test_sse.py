"""The Chat Completions SSE decoder, on both builds."""

from __future__ import annotations

import importlib
import json
from types import ModuleType
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fxengine.models import _sse_py
from fxengine.testing import Reply, ScriptedModel, reasoning, text, tool_call, usage


def _builds() -> list[Any]:
    params: list[Any] = [pytest.param(_sse_py, id="pure")]
    try:
        params.append(pytest.param(importlib.import_module("fxengine.models._sse_c"), id="compiled"))
    except ImportError:
        params.append(pytest.param(None, id="compiled", marks=pytest.mark.skip(reason="extension not built")))
    return params


BUILDS = _builds()


@pytest.fixture(params=BUILDS)
def sse(request: pytest.FixtureRequest) -> ModuleType:
    return request.param  # type: ignore[no-any-return]


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> bytes:
    body: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m-1"}
    body["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body.update(top)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def decode(sse: ModuleType, *pieces: bytes) -> tuple[list[tuple[Any, ...]], Any]:
    dec = sse.ChatStreamDecoder()
    events: list[tuple[Any, ...]] = []
    for piece in pieces:
        events += dec.feed(piece)
    outcome = dec.finish()
    return events + outcome.events, outcome


STREAM = b"".join(
    [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "think"}),
        chunk({"content": "Hé"}),
        chunk({"content": "llo 🌍"}),
        chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "send", "arguments": '{"to"'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": "x'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": ': "y"}'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]}),
        chunk({}, "tool_calls"),
        chunk(None, usage={"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}}),
        b"data: [DONE]\n\n",
    ]
)
EXPECTED = [
    ("reasoning_delta", "think"),
    ("text_delta", "Hé"),
    ("text_delta", "llo 🌍"),
    ("tool_call", 0, "call_a", "lookup"),
    ("tool_call", 1, "call_b", "send"),
]


def check_outcome(sse: ModuleType, outcome: Any) -> None:
    assert outcome.finish_reason == "tool_calls"
    assert outcome.tool_calls == [
        sse.ToolCallOut("call_a", "lookup", '{"q": "x"}'),
        sse.ToolCallOut("call_b", "send", '{"to": "y"}'),
    ]
    assert outcome.usage == {"inputTokens": 10, "outputTokens": 4, "cacheReadTokens": 2}
    assert outcome.done is True and outcome.error is None and outcome.model == "m-1"


def test_whole_stream_in_one_feed(sse: ModuleType) -> None:
    events, outcome = decode(sse, STREAM)
    assert events == EXPECTED
    check_outcome(sse, outcome)


def test_every_two_way_split_gives_the_same_events(sse: ModuleType) -> None:
    for cut_at in range(1, len(STREAM)):
        events, outcome = decode(sse, STREAM[:cut_at], STREAM[cut_at:])
        assert events == EXPECTED, cut_at
        assert outcome.done and len(outcome.tool_calls) == 2


def test_byte_at_a_time_with_crlf_and_cr_line_ends(sse: ModuleType) -> None:
    for line_end in (b"\r\n", b"\r"):
        body = STREAM.replace(b"\n", line_end)
        events, outcome = decode(sse, *[body[i : i + 1] for i in range(len(body))])
        assert events == EXPECTED
        check_outcome(sse, outcome)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12), st.sampled_from([b"\n", b"\r\n", b"\r"]))
def test_random_splits_and_line_ends(cuts: list[int], line_end: bytes) -> None:
    body = STREAM.replace(b"\n", line_end)
    bounds = [0, *sorted({min(c, len(body) - 1) for c in cuts}), len(body)]
    pieces = [body[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    for build in BUILDS:
        if build.values[0] is None:
            continue
        events, _ = decode(build.values[0], *pieces)
        assert events == EXPECTED


def test_framing_details(sse: ModuleType) -> None:
    body = (
        b"\xef\xbb\xbf: a comment\n"
        b"event: message\nid: 7\nretry: 100\n"
        b'data:{"choices":[{"delta":{"content":"no space"}}]}\n\n'
        # one JSON value over two data lines, joined with "\n"
        b'data: {"choices":[{"delta":\ndata: {"content":"two lines"}}]}\n\n'
        b"data:\n\n"  # an empty event is ignored, not malformed
        b"\n\n\n"
    )
    events, outcome = decode(sse, body[:2], body[2:])
    assert events == [("text_delta", "no space"), ("text_delta", "two lines")]
    assert outcome.malformed_chunks == 0 and outcome.done is False


def test_reasoning_field_and_empty_deltas(sse: ModuleType) -> None:
    events, outcome = decode(
        sse, chunk({"reasoning": "r1"}), chunk({"content": None}), chunk({"content": "", "reasoning_content": ""}), chunk({}, "stop")
    )
    assert events == [("reasoning_delta", "r1")]
    assert outcome.finish_reason == "stop" and outcome.tool_calls == []


def test_usage_keeps_only_sent_keys(sse: ModuleType) -> None:
    full = {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 60},
        "completion_tokens_details": {"reasoning_tokens": 7},
        "cache_creation_input_tokens": 5,
    }
    _, outcome = decode(sse, chunk(None, usage=full))
    assert outcome.usage == {
        "inputTokens": 100,
        "outputTokens": 20,
        "cacheReadTokens": 60,
        "cacheWriteTokens": 5,
        "reasoningTokens": 7,
    }
    _, outcome = decode(sse, chunk(None, usage={"prompt_tokens": 3, "completion_tokens_details": None}))
    assert outcome.usage == {"inputTokens": 3}
    _, outcome = decode(sse, chunk({"content": "x"}, usage=None))
    assert outcome.usage is None


def test_error_payload_and_malformed_chunks(sse: ModuleType) -> None:
    events, outcome = decode(
        sse,
        b"data: {not json\n\n",
        b"data: [1, 2]\n\n",
        chunk({"content": "before"}),
        b'data: {"error": {"message": "overloaded", "code": 529}}\n\n',
    )
    assert events == [("text_delta", "before")]
    assert outcome.error == {"message": "overloaded", "code": 529}
    assert outcome.malformed_chunks == 2 and outcome.done is False


def test_a_last_event_without_blank_line_still_counts(sse: ModuleType) -> None:
    dec = sse.ChatStreamDecoder()
    assert dec.feed(b'data: {"choices":[{"delta":{"content":"tail"},"finish_reason":"stop"}]}') == []
    outcome = dec.finish()
    assert outcome.events == [("text_delta", "tail")] and outcome.finish_reason == "stop"
    assert dec.finish() is outcome
    _, outcome = decode(sse, b"data: [DONE]")
    assert outcome.done is True


def test_tool_calls_without_index_or_id(sse: ModuleType) -> None:
    events, outcome = decode(
        sse,
        chunk({"tool_calls": [{"id": "c1", "function": {"name": "a", "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"id": "c2", "function": {"name": "b", "arguments": '{"k"'}}]}),
        chunk({"tool_calls": [{"function": {"arguments": ":1}"}}]}),
        chunk({"tool_calls": [{"index": 5, "function": {"name": "c", "arguments": "[]"}}]}),
    )
    assert events == [("tool_call", 0, "c1", "a"), ("tool_call", 1, "c2", "b"), ("tool_call", 5, "call_5", "c")]
    assert [(c.id, c.name, c.arguments) for c in outcome.tool_calls] == [
        ("c1", "a", "{}"),
        ("c2", "b", '{"k":1}'),
        ("call_5", "c", "[]"),
    ]


def test_accepts_bytearray_and_memoryview(sse: ModuleType) -> None:
    events, _ = decode(sse, bytearray(chunk({"content": "a"})), memoryview(chunk({"content": "b"})))
    assert events == [("text_delta", "a"), ("text_delta", "b")]


def test_decodes_a_real_http_stream_from_the_scripted_server(sse: ModuleType) -> None:
    reply = Reply(
        reasoning("hm"),
        text("Hello", " world"),
        tool_call("call_1", "lookup", {"query": "ünïcode ✓"}, pieces=5),
        tool_call("call_2", "send", {"to": "x"}, pieces=2),
        usage(12, 8, reasoning_tokens=3),
        interleave_tool_calls=True,
    )
    with ScriptedModel() as model, httpx.Client() as client:
        model.script(reply)
        dec = sse.ChatStreamDecoder()
        events: list[tuple[Any, ...]] = []
        with client.stream("POST", f"{model.base_url}/chat/completions", json={"stream": True}) as response:
            for piece in response.iter_raw(7):
                events += dec.feed(piece)
    outcome = dec.finish()
    assert events == [
        ("reasoning_delta", "hm"),
        ("text_delta", "Hello"),
        ("text_delta", " world"),
        ("tool_call", 0, "call_1", "lookup"),
        ("tool_call", 1, "call_2", "send"),
    ]
    assert [json.loads(c.arguments) for c in outcome.tool_calls] == [{"query": "ünïcode ✓"}, {"to": "x"}]
    assert outcome.usage == {"inputTokens": 12, "outputTokens": 8, "reasoningTokens": 3}
    assert outcome.finish_reason == "tool_calls" and outcome.done and outcome.model == "scripted"


def test_integers_beyond_64_bits_stay_exact(sse: ModuleType) -> None:
    big = 2**64 + 1
    _, outcome = decode(sse, chunk(None, usage={"prompt_tokens": big, "completion_tokens": -(2**63) - 1}))
    assert outcome.usage == {"inputTokens": big, "outputTokens": -(2**63) - 1}
    _, outcome = decode(sse, b'data: {"error": {"code": 123456789012345678901}}\n\n')
    assert outcome.error == {"code": 123456789012345678901}


def test_json_nested_deeper_than_200_is_malformed(sse: ModuleType) -> None:
    def nested(depth: int) -> bytes:
        inner = b"[" * (depth - 1) + b"]" * (depth - 1)
        return b'data: {"x": ' + inner + b', "choices": [{"delta": {"content": "deep"}}]}\n\n'

    events, outcome = decode(sse, nested(200), nested(201), b"data: " + b"[" * 100_000 + b"\n\n")
    assert events == [("text_delta", "deep")]
    assert outcome.malformed_chunks == 2
