"""The benches' scripted model server, run in its own process (so its threads do not share
the client's GIL): prints its base URL, serves until stdin closes, then prints every chat
request it served as one JSON line of ``[arrival epoch ms, last user text, bytes of its
messages as compact JSON]``.

What it answers is read from the prompt (the last user message), ``<kind>:<delay ms>:<tag>``:

- ``tool:MS:TAG`` - the scripted two-step tool turn: asks for ``lookup`` (q=TAG), and once
  the tool's result is in the request, answers ``"done"``; each request waits MS first;
- ``text:MS:TAG`` - one step: waits MS, then streams ``"hello"``, ``" world"``;
- ``typed:MS:TAG`` - a typed answer (bench/typed.py): a `final_result` call when the request
  offers that tool, else the object as text (a `response_format` request); ``typedbad:MS:TAG``
  answers the first request with an object missing a field, then as ``typed``;
- ``hold:NAME`` - the first time, the second step holds until the server stops (the peers'
  kill -9 run kills its client while held); after that it answers ``"done"``;
- anything else (``slow:MS`` too, as bench/e2e.py sends) - waits MS if given, answers ``"ok"``.

Run by the benches through `ModelProcess` (bench/_harness.py); ``python bench/_model.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fxengine.testing import Reply, ScriptedModel, delay, hold, text, tool_call  # noqa: E402


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
            return str(content or "")
    return ""


def has_tool_result(messages: list[dict[str, Any]]) -> bool:
    return bool(messages) and messages[-1].get("role") == "tool"


HELD: set[str] = set()


def respond(request: Any) -> Reply:
    messages = request.body.get("messages") or []
    prompt = last_user_text(messages)
    kind, _, rest = prompt.partition(":")
    ms_text, _, tag = rest.partition(":")
    try:
        ms = float(ms_text)
    except ValueError:
        ms = 0.0
    if kind == "tool":
        if has_tool_result(messages):
            return Reply(delay(ms), text("done"))
        return Reply(delay(ms), tool_call("call_1", "lookup", {"q": tag or "x"}))
    if kind == "hold":
        if has_tool_result(messages):
            if rest in HELD:
                return Reply(text("done"))
            HELD.add(rest)
            return Reply(hold(rest), text("done"))
        return Reply(tool_call("call_1", "lookup", {"q": rest}))
    if kind == "text":
        return Reply(delay(ms), text("hello", " world"))
    if kind in ("typed", "typedbad"):
        answer: dict[str, Any] = {"tag": tag, "n": 1}
        if kind == "typedbad" and not has_tool_result(messages) and messages[-1].get("role") == "user" \
                and not str(messages[-1].get("content") or "").startswith("Your answer did not"):
            answer = {"tag": tag}
        offered = {t["function"]["name"] for t in request.body.get("tools") or []}
        if "final_result" in offered:
            return Reply(delay(ms), tool_call("call_f", "final_result", answer))
        return Reply(delay(ms), text(json.dumps(answer)))
    return Reply(delay(ms), text("ok"))


def main() -> None:
    with ScriptedModel(responder=respond) as model:
        print(model.base_url, flush=True)
        sys.stdin.read()
        served = [
            [r.at_ms, last_user_text(r.body.get("messages") or []),
             len(json.dumps(r.body.get("messages") or [], separators=(",", ":")))]
            for r in model.requests if r.path.endswith("/chat/completions")
        ]
        print(json.dumps(served), flush=True)


if __name__ == "__main__":
    main()
