"""An offline scripted model for demos: looks things up, then answers from the result."""

from __future__ import annotations

from typing import Any

from .script import Reply, delay, text, tool_call, usage

__all__ = ["demo_responder"]

_WORD_DELAY_MS = 15


def demo_responder(request: Any) -> Reply:
    """Answers a Chat Completions request the way a small tool-using model would.

    When the last message is the user's, it calls `lookup` with ``{"query": <user text>}``
    (or `send`, when the request offers a `send` tool and the text says "send"). After a
    tool result it streams a short answer quoting that result, word by word.
    """
    body = request.body if hasattr(request, "body") else request
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    user_text = _last_user_text(messages)
    in_tokens = sum(len(_content_text(m.get("content")).split()) for m in messages)
    if last.get("role") == "tool":
        result = _content_text(last.get("content")).strip()
        words = f'I found: "{result}".'.split() if result else ["I", "found", "nothing."]
        parts: list[Any] = []
        for i, word in enumerate(words):
            parts += [text(word if i == 0 else " " + word), delay(_WORD_DELAY_MS)]
        return Reply(*parts, usage(in_tokens, len(words)))
    tool_names = {(t.get("function") or {}).get("name") for t in body.get("tools") or []}
    n = len(messages)
    if "send" in tool_names and "send" in user_text.lower():
        args = _send_arguments(body, user_text)
        return Reply(text("Sending it now."), tool_call(f"call_send_{n}", "send", args, pieces=2), usage(in_tokens, 8))
    return Reply(
        text("Let me look that up."), tool_call(f"call_lookup_{n}", "lookup", {"query": user_text}, pieces=2), usage(in_tokens, 9)
    )


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _content_text(message.get("content"))
    return ""


def _send_arguments(body: dict[str, Any], user_text: str) -> dict[str, Any]:
    """Fills every required string field of the `send` tool's schema with the user's text."""
    for tool in body.get("tools") or []:
        function = tool.get("function") or {}
        if function.get("name") == "send":
            schema = function.get("parameters") or {}
            props = schema.get("properties") or {}
            required = schema.get("required") or list(props)[:1]
            args = {name: user_text for name in required if (props.get(name) or {}).get("type", "string") == "string"}
            return args or {"text": user_text}
    return {"text": user_text}
