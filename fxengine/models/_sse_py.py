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
from typing import Any, Callable, Literal

__all__ = ["ChatStreamDecoder", "StreamEvent", "StreamOutcome", "ToolCallOut", "set_chunk_scan", "set_json_loads"]

# What `feed` gives: a text or reasoning delta, or the first sight of a tool call
# (its index, id and name).
StreamEvent = tuple[Literal["text_delta", "reasoning_delta"], str] | tuple[Literal["tool_call"], int, str, str]

# The JSON parser for event payloads. The selector module may install a faster one
# (which must accept what `json.loads` accepts, or raise ValueError so it falls back).
_loads: Callable[[bytes], object] = json.loads
_std_loads: Callable[[bytes], object] = json.loads
# Whether chunks go through `_ChunkScan` before the full parse. Off by default: the scan
# pays only when compiled (a byte loop in Python is slower than `json.loads`), so the
# selector turns it on for the compiled build.
_scan_chunks: bool = False

_BOM = b"\xef\xbb\xbf"
# Deeper JSON is malformed here (see `_parse`).
_MAX_NESTING = 200


def set_json_loads(loads: Callable[[bytes], object]) -> None:
    """Installs the JSON parser used for event payloads (`json.loads` by default)."""
    global _loads
    _loads = loads


def set_chunk_scan(enabled: bool) -> bool:
    """Turns the exact fast scan of common chunks on or off (off by default); returns
    whether it was on.

    Either way the decoder gives the same events and outcome for every input: the scan
    only takes chunks it recognises exactly and leaves all others to the full parse.
    """
    global _scan_chunks
    was = _scan_chunks
    _scan_chunks = bool(enabled)
    return was


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
        finish_reason: the last finish reason of choice 0, or None; ``"content_filter"``
            when the model refused (it sent a `refusal`, whose text came as text deltas).
        tool_calls: the calls assembled by index, in index order.
        usage: camelCase token counts (only the keys the provider sent), or None.
        done: whether `data: [DONE]` arrived.
        error: the payload of an in-stream ``{"error": ...}`` event, or None.
        model: the first `model` named by a chunk, or None.
        events: events of a final event that was not followed by a blank line
            (normally empty); emit them after the ones `feed` returned.
        malformed_chunks: how many events were not JSON objects, or nested deeper than
            200 (they were skipped).
    """

    __slots__ = ("finish_reason", "tool_calls", "usage", "done", "error", "model", "events", "malformed_chunks")

    def __init__(
        self,
        finish_reason: str | None,
        tool_calls: list[ToolCallOut],
        usage: dict[str, int] | None,
        done: bool,
        error: object,
        model: str | None,
        events: list[StreamEvent],
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

    Only choice 0 is read (the one whose `index` is 0, or the first with no index; the
    engine never asks for more). Its `delta` (or a whole `message`) may carry `content` as
    a string or as a list of parts (``text``, ``thinking``/``reasoning``, ``refusal``), and
    a `refusal` string: a refusal's text is given as text and the stream ends refused.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._event: bytes | None = None
        self._pending_lf = False
        self._started = False
        self._calls: dict[int, _ToolCallBuilder] = {}
        self._scan = _ChunkScan()
        self._outcome: StreamOutcome | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, int] | None = None
        self.done = False
        self.error: dict[str, object] | None = None
        self.model: str | None = None
        self.malformed_chunks = 0
        self._refused = False

    def feed(self, data: bytes) -> list[StreamEvent]:
        """Decodes the next piece of the body; returns the events it completed."""
        events: list[StreamEvent] = []
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

    def _lines(self, buf: bytes, events: list[StreamEvent]) -> None:
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
                if self._event is None and nl + 1 < end and buf[nl + 1] == 10:
                    # The usual event, one data line and a blank line: no joining to do.
                    pos = nl + 2
                    if not (_scan_chunks and self._scanned(buf, start, nl, events)):
                        self._dispatch(buf[start:nl], events)
                    continue
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

    def _dispatch(self, payload: bytes, events: list[StreamEvent]) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        if not payload:
            return
        if _scan_chunks and self._scanned(payload, 0, len(payload), events):
            return
        obj = _parse(payload)
        if type(obj) is not dict:
            self.malformed_chunks += 1
            return
        self._chunk(obj, events)

    def _scanned(self, buf: bytes, start: int, end: int, events: list[StreamEvent]) -> bool:
        """Decodes the chunk `buf[start:end]` if the fast scan takes it; whether it did."""
        scan = self._scan
        if not scan.scan(buf, start, end, self.model is None):
            return False
        if scan.model is not None:
            self.model = scan.model
        if scan.reasoning:
            events.append(("reasoning_delta", scan.reasoning))
        if scan.content:
            events.append(("text_delta", scan.content))
        if scan.finish is not None:
            self.finish_reason = scan.finish
        return True

    def _chunk(self, obj: dict[str, object], events: list[StreamEvent]) -> None:
        if self.model is None:
            model = obj.get("model")
            if type(model) is str and model:
                self.model = model
        choices = obj.get("choices")
        if type(choices) is list and choices:
            choice = _first_choice(choices)
            if choice is not None:
                delta = choice.get("delta")
                if delta is None:
                    delta = choice.get("message")  # a whole message (a non-streamed reply)
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

    def _delta(self, delta: dict[str, object], events: list[StreamEvent]) -> None:
        text = delta.get("reasoning_content")
        if text is None:
            text = delta.get("reasoning")
        if type(text) is str and text:
            events.append(("reasoning_delta", text))
        text = delta.get("content")
        if type(text) is str:
            if text:
                events.append(("text_delta", text))
        elif type(text) is list:
            self._parts(text, events)
        text = delta.get("refusal")
        if type(text) is str and text:
            self._refused = True
            events.append(("text_delta", text))
        calls = delta.get("tool_calls")
        if type(calls) is list:
            for call in calls:
                if type(call) is dict:
                    self._tool_call(call, events)

    def _parts(self, parts: list[object], events: list[StreamEvent]) -> None:
        """`content` given as a list of parts, in order: text, reasoning, refusals."""
        for part in parts:
            if type(part) is str:
                if part:
                    events.append(("text_delta", part))
                continue
            if type(part) is not dict:
                continue
            kind = part.get("type")
            if kind == "text" or kind == "output_text":
                text = part.get("text")
                if type(text) is str and text:
                    events.append(("text_delta", text))
            elif kind == "thinking" or kind == "reasoning":
                _reasoning(part.get(kind), events)
                if kind not in part:
                    _reasoning(part.get("text"), events)
            elif kind == "refusal":
                text = part.get("refusal")
                if type(text) is str and text:
                    self._refused = True
                    events.append(("text_delta", text))

    def _tool_call(self, call: dict[str, object], events: list[StreamEvent]) -> None:
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
        events: list[StreamEvent] = []
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
        if self._refused and self.finish_reason != "length":
            self.finish_reason = "content_filter"
        self._outcome = StreamOutcome(
            self.finish_reason, calls, self.usage, self.done, self.error, self.model, events, self.malformed_chunks
        )
        return self._outcome

    def __repr__(self) -> str:
        return (
            f"<ChatStreamDecoder calls={len(self._calls)} finish_reason={self.finish_reason!r} "
            f"done={self.done} buffered={len(self._buf)}>"
        )


def _first_choice(choices: list[object]) -> dict[str, object] | None:
    """Choice 0 of a chunk: the one whose `index` is 0, else the first with no integer index."""
    for choice in choices:
        if type(choice) is dict:
            index = choice.get("index")
            if type(index) is not int or index == 0:
                return choice
    return None


def _reasoning(value: object, events: list[StreamEvent]) -> None:
    """A thinking part's text: a string, or a list of strings and ``{"text": ...}`` parts."""
    if type(value) is str:
        if value:
            events.append(("reasoning_delta", value))
    elif type(value) is list:
        for item in value:
            if type(item) is dict:
                item = item.get("text")
            if type(item) is str and item:
                events.append(("reasoning_delta", item))


def _parse(payload: bytes) -> object:
    """The full parse of one event's JSON; None where it is not JSON.

    JSON nested deeper than `_MAX_NESTING` counts as not JSON, so that no parser's own
    limit (orjson's, or the recursion limit `json.loads` runs into) decides. Valid JSON
    that deep takes two bytes a level, so shorter payloads need no look.
    """
    if (
        len(payload) > 2 * _MAX_NESTING
        and payload.count(b"[") + payload.count(b"{") > _MAX_NESTING
        and _nesting(payload) > _MAX_NESTING
    ):
        return None
    if _loads is not _std_loads:
        try:
            obj = _loads(payload)
        except ValueError:
            pass
        else:
            if type(obj) is not dict or not _may_differ(obj):
                return obj
    try:
        return _std_loads(payload)
    except (ValueError, RecursionError):  # RecursionError: unclosed brackets, on a deep stack
        return None


def _may_differ(obj: dict[str, object]) -> bool:
    """Whether orjson's parse may differ from `json.loads`'s in what the decoder reads.

    orjson makes a float of an integer beyond 64 bits, `json.loads` keeps it exact; the
    decoder reads numbers only from `usage`, `error` and the tool calls' `index`, so a
    float there sends the payload to `json.loads` again.
    """
    usage = obj.get("usage")
    if usage is not None and _holds_float(usage):
        return True
    error = obj.get("error")
    if error is not None and _holds_float(error):
        return True
    choices = obj.get("choices")
    if type(choices) is list and choices:
        choice = _first_choice(choices)
        if choice is not None:
            delta = choice.get("delta")
            if delta is None:
                delta = choice.get("message")
            if type(delta) is dict:
                calls = delta.get("tool_calls")
                if type(calls) is list:
                    for call in calls:
                        if type(call) is dict and type(call.get("index")) is float:
                            return True
    return False


def _holds_float(value: Any) -> bool:
    """Whether a float is in `value`, at any depth (bounded by `_MAX_NESTING`)."""
    kind = type(value)
    if kind is float:
        return True
    if kind is dict:
        value = value.values()
    elif kind is not list:
        return False
    for item in value:
        if _holds_float(item):
            return True
    return False


def _nesting(s: bytes) -> int:
    """How deep the brackets of `s` nest, outside JSON strings (for any bytes, JSON or not)."""
    depth = deepest = 0
    in_string = False
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if in_string:
            if c == 92:
                i += 1
            elif c == 34:
                in_string = False
        elif c == 34:
            in_string = True
        elif c == 123 or c == 91:
            depth += 1
            if depth > deepest:
                deepest = depth
        elif c == 125 or c == 93:
            depth -= 1
        i += 1
    return deepest


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


# -- The exact fast scan of common chunks ----------------------------------------------
#
# Almost every chunk of a stream has one shape: a flat object of ids and numbers whose
# `choices[0].delta` holds one short string. `_ChunkScan` walks such a chunk once,
# validating all of it as JSON, and keeps only the strings the decoder reads, without
# building the dicts of a full parse. It gives up (returns False, having kept nothing) on
# anything it does not recognise exactly: a non-null `usage` or `error`, tool calls, a
# refusal, content that is not a string, a first choice whose `index` is not 0 or that
# carries a `message`, a
# repeated key the decoder reads, a key written with escapes, a value of an unexpected
# type, NaN or Infinity, nesting deeper than `_MAX_DEPTH`, a lone surrogate, text that is
# not strict UTF-8, malformed JSON. The full parse then decides, so the decoder's result
# is the same either way (tests/engine/test_sse_scan.py compares the two paths).

_MAX_DEPTH = 32
# Kinds of JSON string for `_string`: an object key (no escapes: the scan compares keys
# byte for byte), a skipped value (escapes and UTF-8 checked here), a kept value (escapes
# checked here, UTF-8 when `_text` decodes it).
_KEY = 0
_SKIP = 1
_KEEP = 2
# 1 for the bytes a string may hold as they are, with nothing to check.
_PLAIN = bytes(1 if 32 <= c < 128 and c not in (34, 92) else 0 for c in range(256))
_ESCAPED = {34: '"', 92: "\\", 47: "/", 98: "\b", 102: "\f", 110: "\n", 114: "\r", 116: "\t"}


def _ws(s: bytes, i: int, n: int) -> int:
    """The index of the first non-whitespace byte at or after `i` (JSON whitespace)."""
    while i < n:
        c = s[i]
        if c == 32 or c == 10 or c == 13 or c == 9:
            i += 1
        else:
            break
    return i


def _colon(s: bytes, i: int, n: int) -> int:
    """After a key: skips `ws : ws`; the index of the value, or -1."""
    i = _ws(s, i, n)
    if i >= n or s[i] != 58:
        return -1
    i = _ws(s, i + 1, n)
    return i if i < n else -1


def _string(s: bytes, i: int, n: int, kind: int) -> int:
    """A JSON string whose opening quote is at `i - 1`; the index after its closing quote, or -1."""
    start = i
    high = False
    while i < n:
        c = s[i]
        if _PLAIN[c]:
            i += 1
            continue
        if c == 34:
            if high and kind != _KEEP:
                try:
                    s[start:i].decode("utf-8")
                except UnicodeDecodeError:
                    return -1
            return i + 1
        if c == 92:
            if kind == _KEY or i + 1 >= n:
                return -1
            i += 1
            c = s[i]
            if c == 117:
                if i + 4 >= n:
                    return -1
                for j in range(i + 1, i + 5):
                    c = s[j]
                    if not (48 <= c <= 57 or 97 <= c <= 102 or 65 <= c <= 70):
                        return -1
                i += 4
            elif c not in (34, 92, 47, 98, 102, 110, 114, 116):
                return -1
        elif c < 32:
            return -1
        elif c >= 128:
            high = True
        i += 1
    return -1


def _number(s: bytes, i: int, n: int) -> int:
    """A JSON number starting at `i`; the index after it, or -1."""
    if s[i] == 45:
        i += 1
        if i >= n:
            return -1
    c = s[i]
    if c == 48:
        i += 1
    elif 49 <= c <= 57:
        i += 1
        while i < n and 48 <= s[i] <= 57:
            i += 1
    else:
        return -1
    if i < n and s[i] == 46:
        i += 1
        if i >= n or not 48 <= s[i] <= 57:
            return -1
        while i < n and 48 <= s[i] <= 57:
            i += 1
    if i < n and (s[i] == 101 or s[i] == 69):
        i += 1
        if i < n and (s[i] == 43 or s[i] == 45):
            i += 1
        if i >= n or not 48 <= s[i] <= 57:
            return -1
        while i < n and 48 <= s[i] <= 57:
            i += 1
    return i


def _null(s: bytes, i: int, n: int) -> int:
    """The index after a `null` at `i`, or -1."""
    return i + 4 if i + 4 <= n and s.startswith(b"null", i) else -1


def _value(s: bytes, i: int, n: int, depth: int) -> int:
    """Validates (and skips) the JSON value at `i`; the index after it, or -1."""
    c = s[i]
    if c == 34:
        return _string(s, i + 1, n, _SKIP)
    if c == 123 or c == 91:
        if depth >= _MAX_DEPTH:
            return -1
        close = c + 2  # "}" follows "{", "]" follows "["
        i = _ws(s, i + 1, n)
        if i < n and s[i] == close:
            return i + 1
        while True:
            if i >= n:
                return -1
            if c == 123:
                if s[i] != 34:
                    return -1
                i = _string(s, i + 1, n, _SKIP)
                if i < 0:
                    return -1
                i = _colon(s, i, n)
                if i < 0:
                    return -1
            i = _value(s, i, n, depth + 1)
            if i < 0:
                return -1
            i = _ws(s, i, n)
            if i >= n:
                return -1
            if s[i] == close:
                return i + 1
            if s[i] != 44:
                return -1
            i = _ws(s, i + 1, n)
    if c == 110:
        return _null(s, i, n)
    if c == 116:
        return i + 4 if i + 4 <= n and s.startswith(b"true", i) else -1
    if c == 102:
        return i + 5 if i + 5 <= n and s.startswith(b"false", i) else -1
    if c == 45 or 48 <= c <= 57:
        return _number(s, i, n)
    return -1


def _next_member(s: bytes, i: int, n: int) -> int:
    """After a member's value: the index of the next key's quote or of the closing brace, or -1."""
    i = _ws(s, i, n)
    if i >= n:
        return -1
    c = s[i]
    if c == 125:
        return i
    if c != 44:
        return -1
    i = _ws(s, i + 1, n)
    return i if i < n and s[i] == 34 else -1


def _first_member(s: bytes, i: int, n: int) -> int:
    """After an object's brace: the index of its first key's quote or of its closing brace, or -1."""
    i = _ws(s, i, n)
    return i if i < n and (s[i] == 34 or s[i] == 125) else -1


def _text(s: bytes, a: int, b: int) -> str:
    """The string value of the JSON string body `s[a:b]` (validated by `_string`).

    Raises ValueError for what the full parse may read otherwise: UTF-8 that is not
    strict, or a lone surrogate escape.
    """
    j = a
    while j < b:
        if s[j] == 92:
            break
        j += 1
    if j == b:
        return s[a:b].decode("utf-8")
    parts = []
    while True:
        parts.append(s[a:j].decode("utf-8"))
        if j == b:
            return "".join(parts)
        c = s[j + 1]
        if c == 117:
            code = int(s[j + 2 : j + 6], 16)
            j += 6
            if 0xD800 <= code <= 0xDBFF:
                if not (j + 6 <= b and s[j] == 92 and s[j + 1] == 117):
                    raise ValueError("lone surrogate")
                low = int(s[j + 2 : j + 6], 16)
                if not 0xDC00 <= low <= 0xDFFF:
                    raise ValueError("lone surrogate")
                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                j += 6
            elif 0xDC00 <= code <= 0xDFFF:
                raise ValueError("lone surrogate")
            parts.append(chr(code))
        else:
            parts.append(_ESCAPED[c])
            j += 2
        a = j
        while j < b:
            if s[j] == 92:
                break
            j += 1


class _ChunkScan:
    """One chunk's kept strings, found by `scan`; reused by its decoder from chunk to chunk.

    After a successful `scan`: `model` (non-empty, and only when asked for), `reasoning`
    (`reasoning_content`, else `reasoning`), `content` and `finish` are the strings the
    full parse would have read, or None where it would have read nothing.
    """

    def __init__(self) -> None:
        self.model: str | None = None
        self.reasoning: str | None = None
        self.content: str | None = None
        self.finish: str | None = None
        self._want_model = True
        self._reset()

    def _reset(self) -> None:
        # Spans [a, b) of kept string bodies; -1 where absent or null.
        self.model_a = self.model_b = self.finish_a = self.finish_b = -1
        self.content_a = self.content_b = self.rc_a = self.rc_b = self.r_a = self.r_b = -1

    def scan(self, s: bytes, start: int, end: int, want_model: bool) -> bool:
        """True when `s[start:end]` is a chunk of the common shape, its strings now read;
        else False."""
        self._reset()
        self._want_model = want_model
        n = end
        i = _ws(s, start, n)
        if i >= n or s[i] != 123:
            return False
        i = self._top(s, i + 1, n)
        if i < 0 or _ws(s, i, n) != n:
            return False
        try:
            model = None
            if self.model_b > self.model_a:
                model = _text(s, self.model_a, self.model_b)
            if self.rc_a >= 0:
                reasoning = _text(s, self.rc_a, self.rc_b)
            elif self.r_a >= 0:
                reasoning = _text(s, self.r_a, self.r_b)
            else:
                reasoning = None
            content = _text(s, self.content_a, self.content_b) if self.content_a >= 0 else None
            finish = _text(s, self.finish_a, self.finish_b) if self.finish_a >= 0 else None
        except ValueError:
            return False
        self.model = model
        self.reasoning = reasoning
        self.content = content
        self.finish = finish
        return True

    def _top(self, s: bytes, i: int, n: int) -> int:
        """The chunk object, `i` after its brace: the index after it, or -1."""
        seen = 0
        i = _first_member(s, i, n)
        while i >= 0 and s[i] == 34:
            key = i + 1
            i = _string(s, key, n, _KEY)
            if i < 0:
                return -1
            size = i - 1 - key
            i = _colon(s, i, n)
            if i < 0:
                return -1
            c = s[i]
            if size == 7 and s.startswith(b"choices", key):
                if seen & 1 or c != 91:
                    return -1
                seen |= 1
                i = self._choices(s, i + 1, n)
            elif size == 5 and s.startswith(b"model", key):
                if seen & 2 or c != 34:
                    return -1
                seen |= 2
                if self._want_model:
                    self.model_a = i + 1
                    i = _string(s, i + 1, n, _KEEP)
                    self.model_b = i - 1
                else:
                    i = _string(s, i + 1, n, _SKIP)
            elif size == 5 and (s.startswith(b"usage", key) or s.startswith(b"error", key)):
                # Only null here: a usage or an error is left to the full parse.
                i = _null(s, i, n)
            else:
                i = _value(s, i, n, 1)
            if i < 0:
                return -1
            i = _next_member(s, i, n)
        return i + 1 if i >= 0 else -1

    def _choices(self, s: bytes, i: int, n: int) -> int:
        """The `choices` array, `i` after its bracket: the first element read, the others
        only validated; the index after the array, or -1."""
        i = _ws(s, i, n)
        if i >= n:
            return -1
        if s[i] == 93:
            return i + 1
        if s[i] != 123:
            return -1
        i = self._choice(s, i + 1, n)
        while i >= 0:
            i = _ws(s, i, n)
            if i >= n:
                return -1
            if s[i] == 93:
                return i + 1
            if s[i] != 44:
                return -1
            i = _ws(s, i + 1, n)
            if i >= n:
                return -1
            i = _value(s, i, n, 2)
        return -1

    def _choice(self, s: bytes, i: int, n: int) -> int:
        """`choices[0]`, `i` after its brace: the index after it, or -1."""
        seen = 0
        i = _first_member(s, i, n)
        while i >= 0 and s[i] == 34:
            key = i + 1
            i = _string(s, key, n, _KEY)
            if i < 0:
                return -1
            size = i - 1 - key
            i = _colon(s, i, n)
            if i < 0:
                return -1
            c = s[i]
            if size == 5 and s.startswith(b"delta", key):
                if seen & 1 or c != 123:
                    return -1
                seen |= 1
                i = self._delta(s, i + 1, n)
            elif size == 5 and s.startswith(b"index", key):
                # Choice 0 first, as providers send it; any other order goes to the full parse.
                if c != 48 or _number(s, i, n) != i + 1:
                    return -1
                i += 1
            elif size == 7 and s.startswith(b"message", key):
                return -1
            elif size == 13 and s.startswith(b"finish_reason", key):
                if seen & 2:
                    return -1
                seen |= 2
                if c == 34:
                    self.finish_a = i + 1
                    i = _string(s, i + 1, n, _KEEP)
                    self.finish_b = i - 1
                else:
                    i = _null(s, i, n)
            else:
                i = _value(s, i, n, 3)
            if i < 0:
                return -1
            i = _next_member(s, i, n)
        return i + 1 if i >= 0 else -1

    def _delta(self, s: bytes, i: int, n: int) -> int:
        """`choices[0].delta`, `i` after its brace: the index after it, or -1."""
        seen = 0
        i = _first_member(s, i, n)
        while i >= 0 and s[i] == 34:
            key = i + 1
            i = _string(s, key, n, _KEY)
            if i < 0:
                return -1
            size = i - 1 - key
            i = _colon(s, i, n)
            if i < 0:
                return -1
            # Which kept string this key is: 1 content, 2 reasoning_content, 4 reasoning.
            field = 0
            if size == 7 and s.startswith(b"content", key):
                field = 1
            elif size == 17 and s.startswith(b"reasoning_content", key):
                field = 2
            elif size == 9 and s.startswith(b"reasoning", key):
                field = 4
            elif size == 10 and s.startswith(b"tool_calls", key):
                # Only null here: tool calls are left to the full parse.
                if _null(s, i, n) < 0:
                    return -1
                field = 8
            elif size == 7 and s.startswith(b"refusal", key):
                # Only null here: a refusal is left to the full parse.
                if _null(s, i, n) < 0:
                    return -1
                field = 16
            if field:
                if seen & field:
                    return -1
                seen |= field
                if s[i] == 34:
                    a = i + 1
                    i = _string(s, a, n, _KEEP)
                    if field == 1:
                        self.content_a, self.content_b = a, i - 1
                    elif field == 2:
                        self.rc_a, self.rc_b = a, i - 1
                    else:
                        self.r_a, self.r_b = a, i - 1
                else:
                    i = _null(s, i, n)
            else:
                i = _value(s, i, n, 4)
            if i < 0:
                return -1
            i = _next_member(s, i, n)
        return i + 1 if i >= 0 else -1
