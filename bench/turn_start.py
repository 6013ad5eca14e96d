"""Turn start: `prompt()` returning → the first model request, and → the first `text_delta`
a reader sees, against the Celery round trip of a no-op task in the same run.

Starts a throwaway `redis-server`, the scripted model server (its own process) and one
warm Celery worker (bench/_agents.py). Then, interleaved so load on the machine hits both
alike, `--turns` times each:

- a turn: this process prompts a new session (``text:0:…``, one streamed step) and reads
  its lines; the model server records when the request arrived (epoch ms, same clock);
- the floor: `send_task("fxbench.noop")` to the same queue and worker, until this
  process sees the task's push (BLPOP): the least any Celery-driven turn start can cost.

Target (issue 15): p50 and p99 of prompt → first model request within 1.5× the no-op
round trip + 2 ms.

Run: ``.venv/bin/python bench/turn_start.py [--turns 60] [--json PATH]`` (about 20 s).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._harness import (  # noqa: E402
    CeleryNoop,
    ModelProcess,
    Row,
    add_json_arg,
    client_agent,
    new_prefix,
    pct,
    print_rows,
    ratio_row,
    start_worker,
    stop_parts,
    write_json,
)
from tests.support.redis_server import RedisServer  # noqa: E402


async def one_turn(agent: Any, tag: str) -> tuple[float, float]:
    """(epoch s when prompt() returned, epoch s of the first text_delta read)."""
    session = agent.session()
    turn = await session.prompt(f"text:0:{tag}")
    returned = time.time()
    first_delta = None
    async for line in turn:
        if first_delta is None and line.get("type") == "text_delta":
            first_delta = time.time()
    result = await turn.result()
    if result.stop_reason != "end_turn" or first_delta is None:
        raise RuntimeError(f"turn {tag} ended {result}")
    return returned, first_delta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60)
    add_json_arg(parser)
    args = parser.parse_args()
    from fxworker.agent import _loop

    server = RedisServer()
    model = ModelProcess()
    prefix = new_prefix()
    worker = start_worker(server, prefix, model.base_url)
    agent = noop = None
    try:
        agent = client_agent(server.url, prefix, model.base_url)
        noop = CeleryNoop(agent, server.url, prefix)
        for i in range(5):  # warm: the worker's pools, this process's clients
            _loop().run(one_turn(agent, f"warm{i}"), timeout_s=30)
            noop.once()
        turns: dict[str, tuple[float, float]] = {}
        floor_rt: list[float] = []
        floor_start: list[float] = []
        for i in range(args.turns):
            turns[f"t{i}"] = _loop().run(one_turn(agent, f"t{i}"), timeout_s=30)
            rt, start = noop.once()
            floor_rt.append(rt)
            floor_start.append(start)
    finally:
        served = stop_parts(noop=noop, agent=agent, worker=worker, model=model, server=server)

    first_request: dict[str, float] = {}
    for at_ms, prompt, _ in served:
        tag = prompt.rpartition(":")[2]
        if tag in turns and tag not in first_request:
            first_request[tag] = at_ms / 1000
    to_request = [first_request[t] - turns[t][0] for t in turns]
    to_delta = [turns[t][1] - turns[t][0] for t in turns]
    ms = 1000.0
    figures = {
        "prompt_to_request_ms": {"p50": pct(to_request, .5) * ms, "p99": pct(to_request, .99) * ms},
        "prompt_to_text_delta_ms": {"p50": pct(to_delta, .5) * ms, "p99": pct(to_delta, .99) * ms},
        "celery_noop_round_trip_ms": {"p50": pct(floor_rt, .5) * ms, "p99": pct(floor_rt, .99) * ms},
        "celery_noop_send_to_start_ms": {"p50": pct(floor_start, .5) * ms, "p99": pct(floor_start, .99) * ms},
        "turns": args.turns,
    }
    rows: list[Row] = []
    for q in ("p50", "p99"):
        floor = figures["celery_noop_round_trip_ms"][q]
        value = figures["prompt_to_request_ms"][q]
        bound = 1.5 * floor + 2.0
        rows.append(ratio_row("4 turn start", f"prompt -> 1st model request {q}", value, "ms",
                              f"Celery no-op round trip {q}", floor, target=bound / floor, at_most=True,
                              note=f"bound 1.5x floor + 2 ms = {bound:.1f} ms"))
    for q in ("p50", "p99"):
        rows.append(ratio_row("4 turn start", f"prompt -> 1st text_delta read {q}", figures["prompt_to_text_delta_ms"][q],
                              "ms", f"Celery no-op round trip {q}", figures["celery_noop_round_trip_ms"][q]))
    print(f"turn start over {args.turns} turns, warm worker:")
    for name, v in figures.items():
        if isinstance(v, dict):
            print(f"  {name:<30} p50 {v['p50']:7.2f} ms   p99 {v['p99']:7.2f} ms")
    print_rows(rows)
    write_json(args.json, "turn_start", rows, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
