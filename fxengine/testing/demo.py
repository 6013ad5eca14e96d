"""An offline scripted model for demos: looks things up, then answers from the result."""

from __future__ import annotations

from typing import Any

from .script import Reply, delay, text, tool_call, usage

__all__ = ["demo_responder"]

_WORD_DELAY_MS = 15
# A prompt that asks for a long or slow answer streams this many words, this far apart: a
# turn of several seconds, long enough to reload the page or kill a worker in the middle.
_LONG_WORDS, _LONG_DELAY_MS = 80, 100
# What a resumed turn's request ends with (fxengine.models.openai_chat.RESUME_NOTICE).
_RESUME_NOTICE = "Resuming from unexpected session interruption."


def demo_responder(request: Any) -> Reply:
    """Answers a Chat Completions request the way a small tool-using model would.

    When the last message is the user's, it calls `lookup` with ``{"query": <user text>}``
    (or `send`, when the request offers a `send` tool and the text says "send"). After a
    tool result it streams a short answer quoting that result, word by word; when the prompt
    says "long" or "slow", 80 words 100 ms apart (8 s: time to reload the page or kill a
    worker mid-answer). A resumed turn's notice is skipped, so the answer carries on.
    """
    body = request.body if hasattr(request, "body") else request
    # A resumed turn ends with the resume notice: carry on from what came before it.
    messages = [m for m in body.get("messages") or []
                if not (m.get("role") == "user" and _content_text(m.get("content")).strip() == _RESUME_NOTICE)]
    last = messages[-1] if messages else {}
    user_text = _last_user_text(messages)
    in_tokens = sum(len(_content_text(m.get("content")).split()) for m in messages)
    if last.get("role") == "tool":
        result = _content_text(last.get("content")).strip()
        words = f'I found: "{result}".'.split() if result else ["I", "found", "nothing."]
        pause = _WORD_DELAY_MS
        if any(w in user_text.lower() for w in ("long", "slow")):
            words = (words * (_LONG_WORDS // max(1, len(words)) + 1))[:_LONG_WORDS]
            pause = _LONG_DELAY_MS
        parts: list[Any] = []
        for i, word in enumerate(words):
            parts += [text(word if i == 0 else " " + word), delay(pause)]
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
