"""The decoder's fast chunk scan decides exactly as the full JSON parse, on every input.

Each stream is decoded four ways: pure and compiled build, each with the scan on and off.
The pure build with the scan off (`json.loads` on every chunk) is the reference; the other
three must give the same events and outcome, byte for byte, on generated chunks (any key
order, repeated keys, whitespace, escapes, lone surrogates, extra values) and on real
chunks with bytes deleted, inserted or replaced.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fxengine.models import _sse_py

try:
    _sse_c: ModuleType | None = importlib.import_module("fxengine.models._sse_c")
except ImportError:
    _sse_c = None

# (module, scan on?) for every way of decoding; the first is the reference.
WAYS: list[tuple[ModuleType, bool]] = [(_sse_py, False), (_sse_py, True)]
if _sse_c is not None:
    WAYS += [(_sse_c, False), (_sse_c, True)]

BASE = (
    b'{"id":"chatcmpl-B2x9kQeVq7Yz3NfLmR8sTuWv1AbC","object":"chat.completion.chunk","created":1733000000,'
    b'"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_6f2eabb9a5",'
)
REAL_CHUNKS = [
    BASE + b'"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,'
    b'"finish_reason":null}],"usage":null}',
    BASE + b'"choices":[{"index":0,"delta":{"content":" stream chunk"},"logprobs":null,"finish_reason":null}],"usage":null}',
    BASE + b'"choices":[{"index":0,"delta":{"content":"H\xc3\xa9 \\"q\\"\\n\\ud83d\\ude00 \\u00e9"},"finish_reason":null}]}',
    BASE + b'"choices":[{"index":0,"delta":{"reasoning_content":" think"},"logprobs":null,"finish_reason":null}],"usage":null}',
    b'{"choices":[{"delta":{"reasoning":"r","content":null}}],"model":"m2","obfuscation":"a1B2"}',
    BASE + b'"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":'
    b'{"name":"lookup","arguments":"{\\"q\\":"}}]},"logprobs":null,"finish_reason":null}],"usage":null}',
    BASE + b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}',
    BASE + b'"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":2}}}',
    b'{"error":{"message":"overloaded","code":529}}',
    b'{"id":"f1","object":"chat.completion.chunk","model":"magistral-medium-2506","choices":[{"index":0,"delta":'
    b'{"content":[{"type":"thinking","thinking":[{"type":"text","text":"Hm"}]},{"type":"text","text":"ok"}]},'
    b'"finish_reason":null}]}',
    BASE + b'"choices":[{"index":0,"delta":{"refusal":"I can\\u2019t help."},"logprobs":null,"finish_reason":null}]}',
    b'{"model":"m","choices":[{"index":1,"delta":{"content":"B"}},{"index":0,"delta":{"content":"A"}}]}',
]


@contextlib.contextmanager
def scanning(module: ModuleType, on: bool) -> Iterator[None]:
    was = module.set_chunk_scan(on)
    try:
        yield
    finally:
        module.set_chunk_scan(was)


def frame(payload: bytes) -> bytes:
    """One SSE event carrying `payload` (a payload with line ends spans several data lines)."""
    lines = payload.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


def decode(module: ModuleType, scan: bool, body: bytes) -> str:
    with scanning(module, scan):
        dec = module.ChatStreamDecoder()
        events = dec.feed(body)
        outcome = dec.finish()
    calls = [(c.id, c.name, c.arguments) for c in outcome.tool_calls]
    seen = (
        events + outcome.events, outcome.finish_reason, calls, outcome.usage, outcome.done,
        outcome.error, outcome.model, outcome.malformed_chunks,
    )
    return repr(seen)  # repr: a NaN in an error payload compares equal to itself


def assert_one_behaviour(payloads: list[bytes]) -> None:
    body = b"".join(frame(p) for p in payloads) + b"data: [DONE]\n\n"
    reference = decode(*WAYS[0], body)
    for module, scan in WAYS[1:]:
        assert decode(module, scan, body) == reference, (module.__name__, scan, payloads)


# -- generated chunks ------------------------------------------------------------------


class Obj:
    """A JSON object as a list of members, so keys may repeat and come in any order."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def encode(value: Any, ascii_only: bool, comma: str, colon: str) -> str:
    if isinstance(value, Obj):
        inner = comma.join(json.dumps(k, ensure_ascii=ascii_only) + colon + encode(v, ascii_only, comma, colon)
                           for k, v in value.pairs)
        return "{" + inner + "}"
    if isinstance(value, list):
        return "[" + comma.join(encode(v, ascii_only, comma, colon) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


# Text with lone surrogates, control characters, quotes, backslashes and astral characters.
texts = st.one_of(
    st.text(st.characters(codec=None, exclude_categories=()), max_size=12),
    st.sampled_from(["", " the", "\n\n", 'a "q"', "\\", "é", "🌍", "\ud800", "\udc00x", "\x00", "\x1f", "/"]),
)
json_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), texts
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(st.tuples(texts, inner), max_size=3).map(Obj),
    ),
    max_leaves=6,
)
delta_members = st.one_of(
    st.tuples(st.sampled_from(["content", "reasoning_content", "reasoning"]), st.one_of(st.none(), texts, json_values)),
    st.tuples(st.just("role"), st.sampled_from(["assistant", None])),
    st.tuples(st.just("refusal"), st.one_of(st.none(), texts)),
    st.tuples(st.just("content"), st.lists(st.one_of(
        st.tuples(st.sampled_from(["text", "thinking", "reasoning", "refusal", "image_url"]),
                  st.sampled_from(["text", "thinking", "reasoning", "refusal"]), st.one_of(texts, st.lists(texts, max_size=2)))
        .map(lambda t: Obj([("type", t[0]), (t[1], t[2])])),
        texts, json_values), max_size=3)),
    st.tuples(st.just("tool_calls"), st.one_of(st.none(), st.just([Obj([("index", 0), ("id", "c"), ("function", Obj([("name", "f"), ("arguments", "{}")]))])]))),
    st.tuples(texts, json_values),
)
choice_members = st.one_of(
    st.tuples(st.just("delta"), st.one_of(st.lists(delta_members, max_size=4).map(Obj), json_values)),
    st.tuples(st.just("finish_reason"), st.one_of(st.none(), st.sampled_from(["stop", "tool_calls", "length", ""]), json_values)),
    st.tuples(st.sampled_from(["index", "logprobs"]), st.one_of(st.sampled_from([0, 1, 2, -0, 0.0]), st.none())),
    st.tuples(st.just("message"), st.lists(delta_members, max_size=3).map(Obj)),
    st.tuples(texts, json_values),
)
choices = st.lists(st.one_of(st.lists(choice_members, max_size=5).map(Obj), json_values), max_size=2)
top_members = st.one_of(
    st.tuples(st.just("choices"), st.one_of(choices, json_values)),
    st.tuples(st.just("model"), st.one_of(texts, json_values)),
    st.tuples(st.sampled_from(["usage", "error"]), st.one_of(st.none(), json_values)),
    st.tuples(st.sampled_from(["id", "object", "created", "service_tier", "system_fingerprint"]), json_leaves),
    st.tuples(texts, json_values),
)
chunks = st.builds(
    encode,
    st.lists(top_members, max_size=7).map(Obj),
    st.booleans(),
    st.sampled_from([",", ", ", " ,\t", ",\n"]),
    st.sampled_from([":", ": ", " :\r\n "]),
).map(lambda text: text.encode("utf-8", "surrogatepass"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(chunks, min_size=1, max_size=4))
def test_generated_chunks_decode_the_same_on_every_path(payloads: list[bytes]) -> None:
    assert_one_behaviour(payloads)


# -- real chunks, mutated --------------------------------------------------------------

NASTY = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b" ", b"\x00", b"\x1f", b"\x80", b"\xff", b"\xed\xa0\x80",
         b"\\u", b"\\ud800", b"\\uDC00", b"0", b"-", b"1e", b".", b"null", b"NaN", b"-Infinity", b"\xef\xbb\xbf"]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(REAL_CHUNKS)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "repeat"]))
        if kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "repeat":
            data[at:at] = data[at : at + draw(st.integers(1, 40))]
        else:
            piece = draw(st.one_of(st.sampled_from(NASTY), st.binary(min_size=1, max_size=3)))
            data[at : at + (len(piece) if kind == "replace" else 0)] = piece
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(mutated(), st.sampled_from(REAL_CHUNKS)), min_size=1, max_size=4))
def test_mutated_real_chunks_decode_the_same_on_every_path(payloads: list[bytes]) -> None:
    assert_one_behaviour(payloads)


def test_real_chunks_decode_the_same_on_every_path() -> None:
    assert_one_behaviour(REAL_CHUNKS)
    for i in range(len(REAL_CHUNKS)):
        assert_one_behaviour(REAL_CHUNKS[i:] + REAL_CHUNKS[:i])


# -- which chunks the scan takes ---------------------------------------------------------


@pytest.mark.parametrize("module", [w[0] for w in WAYS if w[1]], ids=lambda m: m.__name__.rsplit("_", 1)[-1])
def test_the_scan_takes_common_chunks_and_leaves_the_rest(module: ModuleType) -> None:
    scan = module._ChunkScan()
    taken = {i for i, chunk in enumerate(REAL_CHUNKS) if scan.scan(chunk, 0, len(chunk), True)}
    assert taken == {0, 1, 2, 3, 4, 6}  # not tool calls, usage, an error, list content, a refusal, choice 1 first
    assert scan.scan(REAL_CHUNKS[2], 0, len(REAL_CHUNKS[2]), True)
    assert (scan.model, scan.reasoning, scan.content, scan.finish) == ("gpt-4.1-mini-2025-04-14", None, 'Hé "q"\n😀 é', None)
    assert scan.scan(REAL_CHUNKS[4], 0, len(REAL_CHUNKS[4]), False)
    assert (scan.model, scan.reasoning, scan.content) == (None, "r", None)
    assert scan.scan(REAL_CHUNKS[6], 0, len(REAL_CHUNKS[6]), True) and scan.finish == "tool_calls"
    for left in (
        b'{"choices":[{"delta":{"content":"a","content":"b"}}]}',  # a repeated key the decoder reads
        b'{"choices":[{"delta":{"con\\u0074ent":"a"}}]}',  # a key written with an escape
        b'{"choices":[{"delta":{"content":"\\ud800"}}]}',  # a lone surrogate
        b'{"choices":[{"delta":{"content":"\xed\xa0\x80"}}]}',  # not strict UTF-8
        b'{"choices":[{"delta":{"content":"a"}}],"created":NaN}',
        b'{"choices":[{"delta":{"content":"a"}}]}}',
        b'{"choices":[{"index":1,"delta":{"content":"a"}}]}',  # not choice 0
        b'{"choices":[{"index":0.0,"delta":{"content":"a"}}]}',
        b'{"choices":[{"index":0,"message":{"content":"a"}}]}',  # a whole message
        b'{"choices":[{"delta":{"refusal":"no"}}]}',
        b'{"choices":[{"delta":{"content":[]}}]}',
        b'{"choices":[{"delta":{"content":"a"}},]}',
        b"[]",
    ):
        assert not scan.scan(left, 0, len(left), True), left
    # Only the given range counts, whatever the bytes after it would make of the chunk.
    whole = b'{"choices":[{"delta":{"content":"ab"},"finish_reason":null}]}'
    assert scan.scan(whole, 0, len(whole), True)
    assert not any(scan.scan(whole, 0, end, True) for end in range(len(whole)))
    assert scan.scan(b"xx" + whole + b"yy", 2, 2 + len(whole), True) and scan.content == "ab"
