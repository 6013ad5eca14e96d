"""OpenTelemetry traces that survive a crash: a turn whose worker is killed mid-tool and
resumed by another is one trace, with both deliveries, the takeover, and the tool's span
once (rerun, for an idempotent tool) or its "may have partly run" answer; a Celery worker
set up from `OTEL_*` and killed 100 ms into its delivery has exported its `fx.delivery`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fxengine.testing import Reply, ScriptedModel, text, tool_call
from tests.support.otlp import OtlpReceiver
from tests.support.workers import Workers

ROOT = Path(__file__).resolve().parents[2]


def traced_kill(idempotent: bool, *, mode: str | None = None) -> dict[str, Any]:
    with ScriptedModel() as model:
        model.script(Reply(tool_call("c1", "lookup", {"city": "Oslo"})), Reply(text("Sunny in Oslo.")))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FX_", "OTEL_")) and k != "REDIS_URL"}
        done = subprocess.run([sys.executable, "-m", "tests.durable._traced_kill", model.base_url,
                               mode or ("1" if idempotent else "0")], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_turn_resumed_after_its_worker_died_is_one_trace(idempotent: bool) -> None:
    out = traced_kill(idempotent)
    spans = out["spans"]
    assert out["stop_reason"] == "end_turn"
    assert len({s["trace"] for s in spans}) == 1, "one trace, from the accept to the end"
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"].split(" ")[0], []).append(span)
    (accept,) = by_name["fx.accept"]
    deliveries = by_name["fx.delivery"]
    assert [d["attributes"]["fx.epoch"] for d in deliveries] == [1, 2], "both workers' deliveries"
    assert all(d["parent"] == accept["span"] for d in deliveries)
    first, second = deliveries
    assert first["attributes"]["fx.turn.resumed"] is False and first["events"] == []
    takeover = second["events"]
    assert [e["name"] for e in takeover] == ["session.takeover"] and second["attributes"]["fx.turn.resumed"] is True
    # The dead worker's turn span never ended; the resuming one's did, over what it ran.
    (turn,) = by_name["fx.turn"]
    assert turn["parent"] == second["span"] and turn["attributes"]["fx.outcome"] == "ended"
    under_turn = [s for s in spans if s["parent"] == turn["span"]]
    tools = by_name.get("execute_tool", [])
    if idempotent:
        assert out["tool_calls"] == 2  # started once before the kill, run again after it
        (rerun,) = tools  # the killed call's span died with its worker: the tool's span once
        assert rerun["attributes"]["fx.tool.rerun"] is True and rerun["attributes"]["fx.tool.idempotent"] is True
        assert rerun in under_turn
    else:
        assert out["tool_calls"] == 1 and tools == []  # never run again: answered "may have partly run"
        assert [e["name"] for e in turn["events"]] == ["tool.ambiguous"]
    # Two model requests: the dead worker's (ended before its tool started, so exported,
    # under that worker's turn span, which died with it) and the resuming worker's.
    first_chat, last_chat = by_name["chat"]
    assert first_chat["parent"] not in {s["span"] for s in spans} and last_chat in under_turn
    assert list(first_chat["attributes"]["gen_ai.response.finish_reasons"]) == ["tool_calls"]
    assert list(last_chat["attributes"]["gen_ai.response.finish_reasons"]) == ["stop"]
    assert last_chat["attributes"]["gen_ai.request.model"] == "scripted"


KILL_AFTER_S = 0.1  # after the prompt is accepted, so at most this long after the delivery starts
BATCH_DELAY_S = 5.0  # the SDK's batch schedule (OTEL_BSP_SCHEDULE_DELAY): what the delivery span must beat


@pytest.mark.redis
@pytest.mark.celery
def test_a_turn_parked_for_an_approval_is_one_trace_across_the_wait() -> None:
    """The delivery that parked the turn and the one its approval woke are both in the
    prompt's trace, under its accept; the first says it paused, the second that it resumed
    with a decision (by whom)."""
    out = traced_kill(False, mode="pause")
    spans = out["spans"]
    assert out["stop_reason"] == "end_turn" and out["tool_calls"] == 1
    assert len({s["trace"] for s in spans}) == 1, "one trace, from the accept across the wait to the end"
    (accept,) = [s for s in spans if s["name"].startswith("fx.accept")]
    deliveries = [s for s in spans if s["name"].startswith("fx.delivery")]
    assert len(deliveries) == 2 and all(d["parent"] == accept["span"] for d in deliveries)
    turns = sorted((s for s in spans if s["name"] == "fx.turn"), key=lambda s: s["attributes"]["fx.epoch"])
    assert [t["attributes"]["fx.outcome"] for t in turns] == ["paused", "ended"]
    assert turns[1]["attributes"]["fx.turn.resumed"] is True and turns[1]["attributes"]["fx.turn.decisions"] == 1


def test_a_worker_killed_100_ms_into_its_delivery_has_exported_its_delivery_span(
    workers: Workers, client: Any, model: ScriptedModel
) -> None:
    with OtlpReceiver() as receiver:
        unset = {name: "" for name in os.environ if name.startswith("OTEL_")}  # only the receiver below
        worker = workers.start(queues=("default",), concurrency=2, env={
            **unset, "FX_TEST_MODEL_URL": model.base_url,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "fx-killed"})
        session = client.agents["default"].blocking_session()
        accepted_ns = time.time_ns()
        session.prompt("hold:killed-early")  # held: the turn is under way, in its model request, when killed
        try:
            model.wait_held("killed-early", timeout_s=15)  # the delivery has started
            time.sleep(max(0.0, KILL_AFTER_S - (time.time_ns() - accepted_ns) / 1e9))  # the crash's timing, not a wait
            worker.kill()
            killed_ns = time.time_ns()
        finally:
            model.release("killed-early")
        # Whatever the dead process sent is in (or being read); nothing more can come.
        deliveries = receiver.wait_for(lambda s: s["name"] == "fx.delivery", timeout_s=2)
    assert deliveries, f"no fx.delivery of the killed worker reached the collector: {receiver}"
    (delivery,) = deliveries
    assert delivery["attributes"]["fx.session.id"] == session.id and delivery["attributes"]["fx.epoch"] == 1
    assert delivery["resource"]["service.name"] == "fx-killed"
    into_delivery_s = (killed_ns - delivery["start_ns"]) / 1e9
    assert into_delivery_s < BATCH_DELAY_S / 5, f"killed {into_delivery_s:.3f} s into the delivery: not a quick crash"
    # The spans it had not ended (its turn, its model request) died with it.
    assert not [s for s in receiver.spans if s["name"] != "fx.delivery"], receiver.spans


CONFIGURE = """
import asyncio, sys
from fxengine.testing import ScriptedModel, Reply, text
from fxworker import tracing, Agent, embedded
from fxworker.embedded import InProcessWaker
from fxworker.store import embedded_store

print(tracing.configure_from_env("fx-test"), tracing.enabled(), file=sys.stderr)

async def main():
    with ScriptedModel() as model:
        model.script(Reply(text("hi")))
        agent = Agent("a", model=model.model_id, provider=model.provider, store=embedded_store(prefix="fxcfg"),
                      waker=InProcessWaker())
        turn = await agent.session().prompt("hello")
        print((await turn.result()).stop_reason, file=sys.stderr)
        embedded.stop_embedded_workers()
asyncio.run(main())
"""


@pytest.mark.parametrize(("env", "configured"), [
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "fx-svc"}, True),
    ({}, False),
])
def test_the_standard_variables_set_tracing_up(env: dict[str, str], configured: bool) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FX_", "OTEL_")) and k != "REDIS_URL"}
    done = subprocess.run([sys.executable, "-c", CONFIGURE], cwd=ROOT, env={**base, **env}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.splitlines()[0] == f"{configured} {configured}" and "end_turn" in done.stderr
    if configured:  # the console exporter printed the turn's spans, with the service name
        assert '"name": "fx.accept"' in done.stdout and '"name": "fx.delivery"' in done.stdout
        assert '"service.name": "fx-svc"' in done.stdout
    else:
        assert done.stdout == ""
