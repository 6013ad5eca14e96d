"""The scripted model of the web, dev-mode and browser tests, driven by the prompt text."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

from fxengine.testing import Reply, hold, text, tool_call

_asked: Counter[str] = Counter()
_asked_lock = threading.Lock()


def _last(request: Any) -> tuple[str, str]:
    messages = request.body.get("messages") or []
    if not messages:
        return "", ""
    content = messages[-1].get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return messages[-1].get("role", ""), content or ""


def _user_texts(request: Any) -> list[str]:
    out = []
    for message in request.body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if message.get("role") == "user" and content:
            out.append(content)
    return out


def responder(request: Any) -> Reply:
    """`hold:<name>` streams "partial ", waits for release, then "rest"; `holdonce:<name>` does
    that the first time only and answers "after the kill" when asked again (a rerun after a
    crash); `tool:<q>` calls lookup; anything else is echoed as "echo:" + the words."""
    role, last = _last(request)
    if role == "tool":
        return Reply(text("looked ", "up"))
    once = [t for t in _user_texts(request) if t.startswith("holdonce:")]
    if once:  # after a crash the model is also told the turn was interrupted: look at the prompt
        with _asked_lock:
            _asked[once[0]] += 1
            first = _asked[once[0]] == 1
        if first:
            return Reply(text("partial "), hold(once[0][9:]), text("rest"))
        return Reply(text("after ", "the ", "kill"))
    if last.startswith("hold:"):
        return Reply(text("partial "), hold(last[5:]), text("rest"))
    if last.startswith("tool:"):
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "lookup", {"q": last[5:]}))
    return Reply(text("echo:", *[w + " " for w in last.split()]))
