"""The agents module the examples share (`FX_AGENTS=examples.agents`).

Create each agent once per process, at module scope; every web and worker process
imports this module, so they all have the same agents. With `AI_GATEWAY_API_KEY` set the
agent talks to AI Gateway; without it, to the offline scripted model (started here, on a
loopback port of this process), so every example runs as written with no key.
"""

from __future__ import annotations

import os
from typing import Any

from fxengine.tools import tool
from fxworker import Agent


@tool(idempotent=True)
def get_order(order_id: str) -> str:
    """Look up an order by id."""
    return f"order {order_id}: shipped"


def _model() -> tuple[str, dict[str, Any] | None]:
    if os.environ.get("AI_GATEWAY_API_KEY"):
        return "openai/gpt-4o-mini", None
    from fxengine.testing import ScriptedModel, demo_responder

    model = ScriptedModel().start()
    model.responder = demo_responder
    return model.model_id, model.provider


_model_id, _provider = _model()
support = Agent("support", model=_model_id, provider=_provider, instructions="Answer order questions briefly.",
                tools=[get_order])
