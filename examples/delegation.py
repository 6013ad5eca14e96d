"""Agents that call agents: a triage agent hands billing questions to a billing agent
(the README's example, "The Python API").

    python -m examples.delegation

`billing.as_tool()` is one of triage's tools: when triage's model calls it, billing answers
in a session of its own, on its own workers, and triage's turn waits for that answer
holding nothing, then answers the customer with it. With REDIS_URL set, run
`FX_AGENTS=examples.delegation fx worker` beside it (it serves both agents); without, both
turns run in this process (the embedded mode). With AI_GATEWAY_API_KEY set the agents talk
to AI Gateway; without it, to the offline scripted model (started here, on a loopback port
of this process), which calls each agent's tool and answers from its result.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from fxengine import tool
from fxworker import Agent


def offline_responder(request: Any) -> Any:
    """What the offline model answers: a request that ends with the user's text calls the
    agent's one tool (triage: `billing`, with the question; billing: `get_invoice`, with
    the order's number); one that ends with that tool's result answers from it."""
    from fxengine.testing import Reply, text, tool_call, usage

    messages = request.body["messages"]
    tools = {t["function"]["name"] for t in request.body.get("tools") or []}
    last = messages[-1]
    content = last.get("content")
    content = content if isinstance(content, str) else json.dumps(content)
    spent = usage(sum(len(str(m.get("content") or "").split()) for m in messages), 12)
    if last["role"] == "tool":
        return Reply(text(("Billing says: " if "billing" in tools else "Yes, the ") + content), spent)
    if "billing" in tools:
        return Reply(tool_call(f"call_{len(messages)}", "billing", {"input": content}), spent)
    order = re.search(r"\d+", content)
    return Reply(tool_call(f"call_{len(messages)}", "get_invoice", {"order_id": order.group() if order else "?"}), spent)


def _model() -> tuple[str, dict[str, Any] | None]:
    if os.environ.get("AI_GATEWAY_API_KEY"):
        return "openai/gpt-4o-mini", None
    from fxengine.testing import ScriptedModel

    model = ScriptedModel().start()
    model.responder = offline_responder
    return model.model_id, model.provider


_model_id, _provider = _model()


@tool(idempotent=True)
def get_invoice(order_id: str) -> str:
    """Look up the invoice of an order."""
    return f"invoice of order {order_id}: 42.00 EUR, paid on 3 March"


billing = Agent("billing", model=_model_id, provider=_provider, tools=[get_invoice],
                instructions="Answer billing questions from the invoices, in one sentence.")
triage = Agent("triage", model=_model_id, provider=_provider, tools=[billing.as_tool()],
               instructions="Hand billing questions to billing, then answer the customer with its answer.")


async def main() -> None:
    turn = await triage.session().prompt("Was order 42 paid?")
    async for event in turn:           # triage's events; billing's turn is in its own session
        if event["type"] == "tool_end":
            print(f"[{event['name']}] {event.get('content')}")
        elif event["type"] == "text_delta":
            print(event["delta"], end="", flush=True)
    result = await turn.result()       # the end of triage's turn, after billing's answer
    print(f"\n{result.stop_reason}; billing's turn used {result.delegated_usage}")


if __name__ == "__main__":
    asyncio.run(main())
