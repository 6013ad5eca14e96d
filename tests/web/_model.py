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


def _tool_name(request: Any) -> str:
    """The name of the call the last message (a tool result) answers."""
    messages = request.body.get("messages") or []
    call_id = messages[-1].get("tool_call_id") if messages else None
    for message in reversed(messages):
        for call in message.get("tool_calls") or []:
            if call.get("id") == call_id:
                return (call.get("function") or {}).get("name", "")
    return ""


def responder(request: Any) -> Reply:
    """`hold:<name>` streams "partial ", waits for release, then "rest"; `holdonce:<name>` does
    that the first time only and answers "after the kill" when asked again (a rerun after a
    crash); `tool:<q>` calls lookup; `refund:<amount>` calls refund (it waits for approval) and
    `pick:<pattern>` calls pick_file (a client gives its result), each answered with
    "result:" + what the call returned; anything else is echoed as "echo:" + the words."""
    role, last = _last(request)
    if role == "tool" and _tool_name(request) in ("refund", "pick_file"):
        return Reply(text("result:", last))
    if role == "tool":
        return Reply(text("looked ", "up"))
    if last.startswith("refund:"):
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "refund", {"amount": int(last[7:])}))
    if last.startswith("pick:"):
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "pick_file", {"pattern": last[5:]}))
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
