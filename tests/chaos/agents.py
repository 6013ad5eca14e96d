"""The `FX_AGENTS` module of the fault tests' worker processes (`tests/durable/test_fault_*`).

One agent, `default`, on the scripted model at `FX_TEST_MODEL_URL`, with the tools of
`tests.chaos.tooling` (which records each tool start in Redis, and tags each model
request with this worker's pid); its `on_event` diagnostics go to a Redis list
(`tests.chaos.tooling.events_key`). Its API key is `FX_TEST_API_KEY` (default `test-key`):
the chaos harness sets a key of its own and checks that no Redis value holds it (§11.8).

The chaos run adds two more of the same kind: `late`, which every worker runs but whose
queue (`fx.late`) none consumes (the run's valve forwards its wakes, `tests.chaos.wakes`),
and `ghost`, declared only where `FX_TEST_GHOST_AGENT=1` (the web process): no worker runs
it, so its sessions wait for none and end `FX_NO_AGENT`.

`typed` (`tests.chaos.tooling.TYPED_AGENT`) is a third of the same kind whose every turn
answers with a `TypedAnswer` (`output_type=`, one refused answer sent back): the chaos
drivers make some of their sessions of it (`typed:<tag>` prompts, `tests.chaos.workload`).

`default` also has the delegating tool `delegate` (`tests.chaos.tooling.delegate`): its
calls prompt turns of `default` itself, each in a child session, on the same workers and
queue as the drivers' sessions (a `delegate:<tag>` prompt, `tests.chaos.workload`).
"""

from __future__ import annotations

import os

from fxworker import Agent
from tests.chaos.tooling import TYPED_AGENT, TYPED_RETRIES, TypedAnswer, delegate, provider, record_event, tools

API_KEY = os.environ.get("FX_TEST_API_KEY", "test-key")


def _agent(name: str) -> Agent:
    extra = [delegate()] if name == "default" else []
    typed = name == TYPED_AGENT
    return Agent(name, model="scripted", provider=provider(), tools=[*tools(), *extra], api_key=API_KEY,
                 on_event=record_event, output_type=TypedAnswer if typed else None, output_retries=TYPED_RETRIES)


AGENTS = {name: _agent(name) for name in ("default", "late", TYPED_AGENT)}
if os.environ.get("FX_TEST_GHOST_AGENT") == "1":
    AGENTS["ghost"] = _agent("ghost")
