"""Chat Completions SSE decoding: bytes in any split, out come normalized events.

The single readable source of the decoder. `setup.py` compiles this same file as
`fxengine.models._sse_c`, with the C types of `_sse_c.pxd`; `fxengine.models.sse` picks
the build. Keep it free of `import cython` so it runs unchanged as plain Python.

Framing follows the SSE specification: lines end in ``\\n``, ``\\r\\n`` or ``\\r``; an
empty line ends an event; ``data:`` lines (one optional space after the colon) are joined
with ``\\n``; comments (``:``) and other fields (``event:``, ``id:``, ``retry:``) are
ignored. A partial line is carried to the next `feed`; since lines stay bytes until a
whole event is parsed, a UTF-8 character split across feeds needs no special care.
"""

from __future__ import annotations

import json
from typing import Any, Callable

__all__ = ["ChatStreamDecoder", "StreamOutcome", "ToolCallOut", "set_json_loads"]

# The JSON parser for event payloads. The selector module may install a faster one
# (which must accept what `json.loads` accepts, or raise ValueError so it falls back).
_loads: Callable[[bytes], Any] = json.loads
_std_loads: Callable[[bytes], Any] = json.loads

_BOM = b"\xef\xbb\xbf"


def set_json_loads(loads: Callable[[bytes], Any]) -> None:
    """Installs the JSON parser used for event payloads (`json.loads` by default)."""
    global _loads
    _loads = loads


class ToolCallOut:
    """One assembled tool call: its id, its name and its arguments JSON text."""

    __slots__ = ("id", "name", "arguments")

    def __init__(self, id: str, name: str, arguments: str) -> None:
        self.id = id
        self.name = name
        self.arguments = arguments

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolCallOut):
            return NotImplemented
        return (self.id, self.name, self.arguments) == (other.id, other.name, other.arguments)

    def __repr__(self) -> str:
        return f"ToolCallOut(id={self.id!r}, name={self.name!r}, arguments={self.arguments!r})"


class StreamOutcome:
    """What a finished stream said, beyond its deltas.

    Attributes:
        finish_reason: the last `choices[0].finish_reason` sent, or None.
        tool_calls: the calls assembled by index, in index order.
        usage: camelCase token counts (only the keys the provider sent), or None.
        done: whether `data: [DONE]` arrived.
        error: the payload of an in-stream ``{"error": ...}`` event, or None.
        model: the first `model` named by a chunk, or None.
        events: events of a final event that was not followed by a blank line
            (normally empty); emit them after the ones `feed` returned.
        malformed_chunks: how many events were not JSON objects (they were skipped).
    """

    __slots__ = ("finish_reason", "tool_calls", "usage", "done", "error", "model", "events", "malformed_chunks")

    def __init__(
        self,
        finish_reason: str | None,
        tool_calls: list[ToolCallOut],
        usage: dict[str, int] | None,
        done: bool,
        error: dict[str, Any] | None,
        model: str | None,
        events: list[tuple[Any, ...]],
        malformed_chunks: int,
    ) -> None:
        self.finish_reason = finish_reason
        self.tool_calls = tool_calls
        self.usage = usage
        self.done = done
        self.error = error
        self.model = model
        self.events = events
        self.malformed_chunks = malformed_chunks

    def __repr__(self) -> str:
        return (
            f"StreamOutcome(finish_reason={self.finish_reason!r}, tool_calls={self.tool_calls!r}, "
            f"usage={self.usage!r}, done={self.done!r}, error={self.error!r}, model={self.model!r})"
        )


class _ToolCallBuilder:
    """A tool call being assembled from its streamed pieces."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.id = ""
        self.name = ""
        self.pieces: list[str] = []
        self.announced = False


class ChatStreamDecoder:
    """Turns a Chat Completions SSE body into events, one `feed` at a time.

    `feed(data)` returns a list (maybe empty) of ``("text_delta", str)``,
    ``("reasoning_delta", str)`` and ``("tool_call", index, id, name)`` (the first sight
    of a call). `finish()` returns the `StreamOutcome`.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._event: bytes | None = None
        self._pending_lf = False
        self._started = False
        self._calls: dict[int, _ToolCallBuilder] = {}
        self._outcome: StreamOutcome | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, int] | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.model: str | None = None
        self.malformed_chunks = 0

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        """Decodes the next piece of the body; returns the events it completed."""
        events: list[tuple[Any, ...]] = []
        if type(data) is not bytes:
            data = bytes(data)
        if not data:
            return events
        if self._pending_lf:
            # The previous piece ended on "\r": a "\n" starting this one is the same line end.
            self._pending_lf = False
            if data[0] == 10:
                data = data[1:]
        buf = self._buf + data if self._buf else data
        if not self._started:
            if len(buf) < 3 and _BOM.startswith(buf):
                self._buf = buf
                return events
            self._started = True
            if buf.startswith(_BOM):
                buf = buf[3:]
        if b"\r" in buf:
            if buf[len(buf) - 1] == 13:
                self._pending_lf = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        self._lines(buf, events)
        return events

    def _lines(self, buf: bytes, events: list[tuple[Any, ...]]) -> None:
        pos = 0
        end = len(buf)
        while pos < end:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            if nl == pos:
                if self._event is not None:
                    payload = self._event
                    self._event = None
                    self._dispatch(payload, events)
            elif buf.startswith(b"data:", pos):
                start = pos + 5
                if start < nl and buf[start] == 32:
                    start += 1
                self._data_line(buf[start:nl])
            elif nl - pos == 4 and buf.startswith(b"data", pos):
                self._data_line(b"")
            pos = nl + 1
        self._buf = buf[pos:] if pos < end else b""

    def _data_line(self, line: bytes) -> None:
        if self._event is None:
            self._event = line
        else:
            self._event = self._event + b"\n" + line

    def _dispatch(self, payload: bytes, events: list[tuple[Any, ...]]) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        if not payload:
            return
        try:
            obj = _loads(payload)
        except ValueError:
            try:
                obj = _std_loads(payload)
            except ValueError:
                self.malformed_chunks += 1
                return
        if type(obj) is not dict:
            self.malformed_chunks += 1
            return
        self._chunk(obj, events)

    def _chunk(self, obj: dict[str, Any], events: list[tuple[Any, ...]]) -> None:
        if self.model is None:
            model = obj.get("model")
            if type(model) is str and model:
                self.model = model
        choices = obj.get("choices")
        if type(choices) is list and choices:
            choice = choices[0]
            if type(choice) is dict:
                delta = choice.get("delta")
                if type(delta) is dict and delta:
                    self._delta(delta, events)
                finish = choice.get("finish_reason")
                if finish is not None and type(finish) is str:
                    self.finish_reason = finish
        usage = obj.get("usage")
        if usage is not None and type(usage) is dict:
            self.usage = _usage(usage)
        error = obj.get("error")
        if error is not None:
            self.error = error if type(error) is dict else {"message": str(error)}

    def _delta(self, delta: dict[str, Any], events: list[tuple[Any, ...]]) -> None:
        text = delta.get("reasoning_content")
        if text is None:
            text = delta.get("reasoning")
        if type(text) is str and text:
            events.append(("reasoning_delta", text))
        text = delta.get("content")
        if type(text) is str and text:
            events.append(("text_delta", text))
        calls = delta.get("tool_calls")
        if type(calls) is list:
            for call in calls:
                if type(call) is dict:
                    self._tool_call(call, events)

    def _tool_call(self, call: dict[str, Any], events: list[tuple[Any, ...]]) -> None:
        index = call.get("index")
        if type(index) is not int:
            # No index: a call with an id starts a new one, anything else continues the last.
            if call.get("id") or not self._calls:
                index = len(self._calls)
            else:
                index = max(self._calls)
        builder = self._calls.get(index)
        if builder is None:
            builder = _ToolCallBuilder(index)
            self._calls[index] = builder
        call_id = call.get("id")
        if type(call_id) is str and call_id and not builder.id:
            builder.id = call_id
        function = call.get("function")
        if type(function) is dict:
            name = function.get("name")
            if type(name) is str and name and not builder.name:
                builder.name = name
            arguments = function.get("arguments")
            if type(arguments) is str and arguments:
                builder.pieces.append(arguments)
        if not builder.announced and builder.name:
            builder.announced = True
            if not builder.id:
                builder.id = f"call_{index}"
            events.append(("tool_call", index, builder.id, builder.name))

    def finish(self) -> StreamOutcome:
        """Ends the stream: decodes what is left and returns the `StreamOutcome`."""
        if self._outcome is not None:
            return self._outcome
        events: list[tuple[Any, ...]] = []
        if self._buf:
            # A last line with no line end, then the event it belongs to.
            self._lines(self._buf + b"\n", events)
        if self._event is not None:
            payload = self._event
            self._event = None
            self._dispatch(payload, events)
        calls = []
        for index in sorted(self._calls):
            builder = self._calls[index]
            if not builder.id:
                builder.id = f"call_{index}"
            calls.append(ToolCallOut(builder.id, builder.name, "".join(builder.pieces)))
        self._outcome = StreamOutcome(
            self.finish_reason, calls, self.usage, self.done, self.error, self.model, events, self.malformed_chunks
        )
        return self._outcome

    def __repr__(self) -> str:
        return (
            f"<ChatStreamDecoder calls={len(self._calls)} finish_reason={self.finish_reason!r} "
            f"done={self.done} buffered={len(self._buf)}>"
        )


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    """Maps Chat Completions usage to camelCase counts, keeping only keys that were sent."""
    out: dict[str, int] = {}
    value = usage.get("prompt_tokens")
    if value is not None:
        out["inputTokens"] = value
    value = usage.get("completion_tokens")
    if value is not None:
        out["outputTokens"] = value
    details = usage.get("prompt_tokens_details")
    if type(details) is dict:
        value = details.get("cached_tokens")
        if value is not None:
            out["cacheReadTokens"] = value
    if "cacheReadTokens" not in out:
        value = usage.get("cache_read_input_tokens")
        if value is not None:
            out["cacheReadTokens"] = value
    value = usage.get("cache_creation_input_tokens")
    if value is not None:
        out["cacheWriteTokens"] = value
    details = usage.get("completion_tokens_details")
    if type(details) is dict:
        value = details.get("reasoning_tokens")
        if value is not None:
            out["reasoningTokens"] = value
    return out
