"""Provider streams as providers send them, through the engine over real HTTP: content as a
list of parts (Mistral's reasoning models), refusals on both wires, several choices, and a
whole (non-streamed) reply. `make test` runs this file on both decoder builds."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from fxengine import create_engine
from fxengine.models.sse import BUILD
from fxengine.providers import Provider
from fxengine.providers.base import WIRE_CHAT, WIRE_RESPONSES

from .conftest import run, text_of


class RawModel:
    """Answers each POST with the next queued raw body, written one piece per event (each
    flushed) so the client reads it across many reads, as a real stream arrives."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, list[bytes]]] = []
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                owner.requests.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                content_type, pieces = owner.bodies.pop(0)
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(sum(map(len, pieces))))
                self.end_headers()
                for piece in pieces:
                    self.wfile.write(piece)
                    self.wfile.flush()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def provider(self, wire: str = WIRE_CHAT) -> Provider:
        return Provider("raw", f"http://127.0.0.1:{self._server.server_address[1]}/v1", api_key="k", wire=wire)

    def sse(self, *events: dict[str, Any] | str, split: int = 7) -> None:
        """Queues an SSE body; each event is also cut in two at byte `split` (mid-JSON)."""
        pieces: list[bytes] = []
        for event in events:
            data = (event if isinstance(event, str) else json.dumps(event)).encode()
            frame = b"data: " + data + b"\n\n"
            pieces += [frame[:split], frame[split:]]
        self.bodies.append(("text/event-stream", pieces))

    def json(self, body: dict[str, Any]) -> None:
        self.bodies.append(("application/json", [json.dumps(body, indent=2).encode()]))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def raw() -> Iterator[RawModel]:
    server = RawModel()
    yield server
    server.close()


async def _turn(raw: RawModel, wire: str = WIRE_CHAT) -> tuple[str, str, str]:
    """(text, reasoning, stop reason) of one turn against the queued body."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
        engine = await create_engine("raw-model", provider=raw.provider(wire), http_client=client)
        try:
            events, result = await run(engine.prompt("q"))
        finally:
            await engine.close()
    reasoning = "".join(e["delta"] for e in events if e["type"] == "reasoning_delta")
    assert result.error is None, result.error
    return text_of(events), reasoning, result.stop_reason


def _chunk(delta: dict[str, Any], finish: str | None = None, *, index: int = 0, **top: Any) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "chat.completion.chunk", "created": 1733400000, "model": "magistral-medium-2506",
            "choices": [{"index": index, "delta": delta, "finish_reason": finish}], **top}


async def test_content_as_a_list_of_thinking_and_text_parts_split_over_chunks(raw: RawModel) -> None:
    """Mistral's reasoning models: `thinking` parts holding lists of text parts, then text
    parts, then plain string content, each event cut mid-JSON."""
    raw.sse(
        _chunk({"role": "assistant", "content": [{"type": "thinking", "thinking": [{"type": "text", "text": "The user "}]}]}),
        _chunk({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "asks for 2+2."}], "closed": True}]}),
        _chunk({"content": [{"type": "text", "text": "It is "}]}),
        _chunk({"content": [{"type": "thinking", "thinking": "checked"}, {"type": "text", "text": "4"}]}),
        _chunk({"content": "."}),
        _chunk({"content": ""}, "stop", usage={"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21}),
        "[DONE]",
    )
    assert await _turn(raw) == ("It is 4.", "The user asks for 2+2.checked", "end_turn")


async def test_a_chat_completions_refusal_is_its_text_and_ends_refused(raw: RawModel) -> None:
    """OpenAI's structured-output refusal: `content: null`, then `refusal` deltas, finish `stop`."""
    raw.sse(
        _chunk({"role": "assistant", "content": None, "refusal": ""}),
        _chunk({"refusal": "I'm sorry, "}),
        _chunk({"refusal": "I can't help with that."}),
        _chunk({}, "stop"),
        "[DONE]",
    )
    assert await _turn(raw) == ("I'm sorry, I can't help with that.", "", "refused")


async def test_a_refusal_content_part_ends_refused(raw: RawModel) -> None:
    raw.sse(_chunk({"content": [{"type": "refusal", "refusal": "No."}]}, "stop"), "[DONE]")
    assert await _turn(raw) == ("No.", "", "refused")


async def test_a_responses_refusal_is_its_text_and_ends_refused(raw: RawModel) -> None:
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "refusal", "refusal": "I can't help with that."}]}
    raw.sse(
        {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": [], "status": "in_progress"}},
        {"type": "response.content_part.added", "output_index": 0, "content_index": 0, "part": {"type": "refusal", "refusal": ""}},
        {"type": "response.refusal.delta", "output_index": 0, "content_index": 0, "delta": "I can't "},
        {"type": "response.refusal.delta", "output_index": 0, "content_index": 0, "delta": "help with that."},
        {"type": "response.refusal.done", "output_index": 0, "content_index": 0, "refusal": "I can't help with that."},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "model": "gpt-5", "output": [item],
                                                    "usage": {"input_tokens": 5, "output_tokens": 7}}},
    )
    assert await _turn(raw, WIRE_RESPONSES) == ("I can't help with that.", "", "refused")


async def test_a_responses_refusal_sent_only_whole_is_read(raw: RawModel) -> None:
    raw.sse(
        {"type": "response.refusal.done", "output_index": 0, "content_index": 0, "refusal": "No."},
        {"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "model": "gpt-5"}},
    )
    assert await _turn(raw, WIRE_RESPONSES) == ("No.", "", "refused")


async def test_only_choice_0_of_a_multi_choice_stream_is_read(raw: RawModel) -> None:
    two = {"id": "cmpl-2", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 1, "delta": {"content": "[one]"}, "finish_reason": None},
                       {"index": 0, "delta": {"content": "B"}, "finish_reason": None}]}
    raw.sse(
        _chunk({"role": "assistant", "content": "A"}),
        _chunk({"role": "assistant", "content": "[other]"}, index=1),
        two,
        _chunk({"tool_calls": [{"index": 0, "id": "c9", "function": {"name": "nope", "arguments": "{}"}}]}, index=1),
        _chunk({"content": "C"}),
        _chunk({"content": "[late]"}, "length", index=1),
        _chunk({}, "stop"),
        "[DONE]",
    )
    assert await _turn(raw) == ("ABC", "", "end_turn")


async def test_a_whole_json_reply_reads_as_a_stream(raw: RawModel) -> None:
    """A provider that answers a streamed request with one `chat.completion` object,
    pretty-printed, its content as parts."""
    raw.json({"id": "cmpl-3", "object": "chat.completion", "model": "magistral-small-2506",
              "choices": [{"index": 0, "finish_reason": "stop",
                           "message": {"role": "assistant", "content": [
                               {"type": "thinking", "thinking": [{"type": "text", "text": "short\nthought"}]},
                               {"type": "text", "text": "Line one\nline two"}]}}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    assert await _turn(raw) == ("Line one\nline two", "short\nthought", "end_turn")


def test_the_build_under_test_is_named() -> None:
    """`make test` runs this file twice: compiled, then FXENGINE_NO_EXTENSIONS=1 (pure)."""
    assert BUILD in ("compiled", "pure")
