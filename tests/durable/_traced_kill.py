"""Run by tests/durable/test_tracing.py in its own process (the tracer provider is global):
a turn on the embedded store whose worker is killed mid-tool and resumed by its
replacement, traced with the SDK's in-memory exporter; prints the finished spans as JSON.
Every span is exported as it ends here (`SimpleSpanProcessor`), so what the trace shows is
what the runtime recorded; what `fx worker`'s batches lose to a kill -9 is the concern of
`test_a_worker_killed_100_ms_into_its_delivery_has_exported_its_delivery_span`.

    python -m tests.durable._traced_kill MODEL_BASE_URL IDEMPOTENT(0|1)
    python -m tests.durable._traced_kill MODEL_BASE_URL pause

`pause`: the tool waits for approval instead; its turn parks, is approved, and ends.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import uuid
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))  # exported as each span ends
trace.set_tracer_provider(provider)

from fxengine import tool  # noqa: E402 - after the provider, as an application would
from fxworker import Agent, Settings, embedded  # noqa: E402
from fxworker.embedded import InProcessWaker  # noqa: E402
from fxworker.store import embedded_store  # noqa: E402

started = threading.Event()
unblock = threading.Event()
calls: list[int] = []


def lookup(city: str) -> str:
    """Looks a city up; the first call hangs until its worker is killed."""
    calls.append(1)
    if len(calls) == 1:
        started.set()
        unblock.wait(30)  # the worker running it is killed meanwhile
    return f"{city}: sunny"


async def main(base_url: str, mode: str) -> None:
    model_provider = {"name": "scripted", "base_url": base_url, "models": {"scripted": {}}}
    waits = mode == "pause"
    agent = Agent("traced", model="scripted", provider=model_provider, api_key="k",
                  tools=[tool(lookup, idempotent=False, approval=True) if waits else tool(lookup, idempotent=mode == "1")],
                  store=embedded_store(prefix=f"fxt{uuid.uuid4().hex[:8]}"), waker=InProcessWaker(),
                  settings=Settings(lease_s=1.0, reserve_s=4.0, sweep_s=0.2))
    embedded.start_embedded_workers(1)
    session = agent.session()
    turn = await session.prompt("weather in Oslo?")
    if waits:
        unblock.set()
        paused = await asyncio.wait_for(turn.result(), 30)
        accepted = await session.approve(paused.pending_calls[0]["id"], by="alice")
        result = await asyncio.wait_for(session.follow(accepted).result(), 30)
    else:
        await asyncio.wait_for(asyncio.to_thread(started.wait, 10), 15)
        embedded.kill_embedded_worker(0)  # abruptly, mid-tool; a fresh worker takes its place
        result = await asyncio.wait_for(turn.result(), 30)
        unblock.set()  # the killed call's thread may finish: its loop is gone, nothing of it is stored
    # The turn's end reaches the reader before its worker has ended the span around it.
    for _ in range(200):
        if sum(s.name == "fx.turn" for s in exporter.get_finished_spans()) >= (2 if waits else 1):
            break
        await asyncio.sleep(0.05)
    spans: list[dict[str, Any]] = [{
        "name": s.name, "trace": format(s.context.trace_id, "032x"), "span": format(s.context.span_id, "016x"),
        "parent": format(s.parent.span_id, "016x") if s.parent is not None else None,
        "attributes": dict(s.attributes or {}), "events": [{"name": e.name, "attributes": dict(e.attributes or {})}
                                                          for e in s.events],
    } for s in exporter.get_finished_spans()]
    print(json.dumps({"stop_reason": result.stop_reason, "tool_calls": len(calls), "spans": spans}, default=str))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
