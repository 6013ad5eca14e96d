"""The demo agents module (`FX_AGENTS=fxworker.demo`): what `fx dev` and `fx demo` serve.

One agent, `default`, with two tools:

- `lookup` (idempotent, no effects): answers from a small table of facts.
- `send` (not idempotent, so it writes): "sends" a message by appending it to `OUTBOX`
  and to the log. After a crash mid-call it is never run again on its own; the model is
  told the call may have partly run.

With `AI_GATEWAY_API_KEY` set the agent talks to AI Gateway. Without it, importing this
module starts the offline scripted model (`fxengine.testing.demo_responder`) on a loopback
port of this process, so the demo needs no network and no key.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from fxengine.tools import ToolContext, tool
from fxworker.agent import Agent
from fxworker.settings import Settings

__all__ = ["OUTBOX", "agent", "lookup", "send"]

log = logging.getLogger("fxworker.demo")

FACTS = {
    "weather": "Lisbon: 21 °C and sunny; Oslo: 4 °C, light rain; Tokyo: 17 °C, cloudy.",
    "fxworker": "fxworker stores every prompt in Redis before it answers, and every step of a turn as it runs.",
    "lease": "A worker holds a session's lease while it runs a turn and renews it every lease_s / 3.",
    "cursor": "Every stream line has a cursor; reconnect with the last one and nothing is shown twice.",
}

OUTBOX: list[dict[str, Any]] = []
_outbox_lock = threading.Lock()


@tool(idempotent=True)
def lookup(query: str) -> str:
    """Look up a fact (weather, fxworker, lease, cursor) by keywords."""
    words = query.lower()
    found = [fact for key, fact in FACTS.items() if key in words]
    return " ".join(found) or f"No fact matches {query!r}; try weather, lease or cursor."


@tool(idempotent=False)
def send(text: str, ctx: ToolContext) -> str:
    """Send a short message to the team (an effect: it must not happen twice)."""
    entry = {"text": text, "executionId": ctx.execution_id, "sessionId": ctx.session_id, "epoch": ctx.epoch, "atS": time.time()}
    with _outbox_lock:
        OUTBOX.append(entry)
    log.info("send: %r (execution %s, epoch %s)", text, ctx.execution_id, ctx.epoch)
    return f"Sent ({len(OUTBOX)} in the outbox this process)."


def _model() -> tuple[str, dict[str, Any] | None]:
    if Settings.from_env().ai_gateway_api_key:
        return "openai/gpt-4o-mini", None
    from fxengine.testing import ScriptedModel, demo_responder

    model = ScriptedModel().start()
    model.responder = demo_responder
    return model.model_id, model.provider


_model_id, _provider = _model()

agent = Agent(
    "default",
    model=_model_id,
    provider=_provider,
    instructions="You are the fxworker demo agent. Use lookup for facts and send only when asked to send.",
    tools=[lookup, send],
)
