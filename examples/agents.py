"""The agents module the examples share (`FX_AGENTS=examples.agents`).

Create each agent once per process, at module scope; every web and worker process
imports this module, so they all have the same agents.
"""

from __future__ import annotations

from fxengine.tools import tool
from fxworker import Agent


@tool(idempotent=True)
def get_order(order_id: str) -> str:
    """Look up an order by id."""
    return f"order {order_id}: shipped"


support = Agent("support", model="openai/gpt-4o-mini", instructions="Answer order questions briefly.", tools=[get_order])
