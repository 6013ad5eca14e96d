"""Failover time: kill -9 of the worker streaming a turn → the first line of the resumed turn.

Starts a throwaway `redis-server`, the scripted model and two Celery worker processes
(`tests.chaos.agents`, `FX_LEASE_S` as given, `FX_SWEEP_S` at its default of 5 s unless
given). Each run prompts a turn
that streams "partial " and then holds; once that text is in the stream, it kills the
worker named by the model request's `x-fx-pid` header and times until the other worker's
`turn_resume` line is readable; then it lets the turn finish (`end_turn` checked) and
starts a replacement worker. Prints each run, then p50 and max against `lease_s`.

The bound it is held to: lease_s + 1 s (the lease must die; the sweeper looks at a running
session the moment its lease would expire, not at its next sweep), with a sweep interval
below lease_s so the sweeper has seen the session running before its lease can expire.

Run: ``.venv/bin/python bench/failover.py [--runs 10] [--lease-s 6] [--sweep-s 5] [--json PATH]``
(about lease_s + 1.5 s a run). `make bench` runs 30 kills with the 6 s lease and the default
FX_SWEEP_S (bench/run_all.py), to fit its 10 minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._harness import add_json_arg, pct, print_rows, ratio_row, write_json  # noqa: E402
from fxengine.testing import ScriptedModel  # noqa: E402
from tests.chaos.faults import (  # noqa: E402
    Pool,
    fault_env,
    kill_and_time_resume,
    lines_of,
    pid_of,
    requests_for,
    responder,
    wait_line,
)
from tests.chaos.tooling import provider, tools  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import Workers  # noqa: E402


def client_agent(redis_url: str, prefix: str, model: ScriptedModel, lease_s: float) -> Any:
    """This process's agent `default`: it prompts and reads; the workers run the turns."""
    from fxworker import Agent, Settings
    from fxworker.celery_app import make_celery_app
    from fxworker.store import redis_store
    from fxworker.wakers import CeleryWaker

    settings = Settings(redis_url=redis_url, prefix=prefix, lease_s=lease_s)
    return Agent(
        "default", model="scripted", provider=provider(model.base_url), tools=tools(), api_key="bench-key",
        store=redis_store(redis_url, prefix=prefix), waker=CeleryWaker(make_celery_app(settings)), settings=settings,
    )


def one_run(pool: Pool, agent: Any, model: ScriptedModel, n: int) -> float:
    name = f"failover{n}"
    session = agent.blocking_session()
    turn = session.prompt(f"hold:{name}")
    model.wait_held(name, timeout_s=30)
    wait_line(agent, session.id, lambda ln: ln["type"] == "text_delta", 10, what="partial text")
    victim = pool.by_pid(pid_of(requests_for(model, f"hold:{name}")[-1]))
    before = lines_of(agent, session.id)[-1]["cursor"]
    elapsed_s, _ = kill_and_time_resume(victim, agent, session.id, before, 60)
    model.release(name)
    stop = turn.result().stop_reason
    if stop != "end_turn":
        raise RuntimeError(f"run {n}: the resumed turn ended {stop}")
    pool.fill()
    return elapsed_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--lease-s", type=float, default=6.0)
    parser.add_argument("--sweep-s", type=float, default=None, help="FX_SWEEP_S (default: its default)")
    add_json_arg(parser)
    args = parser.parse_args()
    from fxworker import Settings

    sweep_s = Settings().sweep_s if args.sweep_s is None else args.sweep_s
    server = RedisServer()
    prefix = f"fxbench{uuid.uuid4().hex[:8]}"
    with ScriptedModel() as model:
        model.responder = responder
        workers = Workers(redis_url=server.url, prefix=prefix)
        agent = None
        try:
            pool = Pool(workers, fault_env(model, FX_LEASE_S=str(args.lease_s), FX_SWEEP_S=str(sweep_s)))
            pool.fill()
            agent = client_agent(server.url, prefix, model, args.lease_s)
            times = []
            for n in range(args.runs):
                t = one_run(pool, agent, model, n)
                times.append(t)
                print(f"run {n + 1}: kill -9 → turn_resume {t:.2f} s")
            p50, p99 = pct(times, .5), pct(times, .99)
            print(
                f"failover over {args.runs} runs: p50 {p50:.2f} s, p99 {p99:.2f} s, max {max(times):.2f} s "
                f"(lease_s {args.lease_s:.1f}, FX_SWEEP_S {sweep_s:.1f}; bound lease_s + 1 = {args.lease_s + 1:.1f} s; "
                f"max / bound {max(times) / (args.lease_s + 1):.2f})"
            )
            item = "6 failover"
            bound = args.lease_s + 1
            settings = f"lease_s {args.lease_s:g}, FX_SWEEP_S {sweep_s:g}, {args.runs} kills"
            rows = [
                ratio_row(item, "kill -9 -> turn_resume p50", p50, "s", "lease_s (the lease must die)", args.lease_s,
                          note=settings),
                ratio_row(item, "kill -9 -> turn_resume p99", p99, "s", "bound lease_s + 1 s", bound, target=1.0,
                          at_most=True),
                ratio_row(item, "kill -9 -> turn_resume max", max(times), "s", "bound lease_s + 1 s", bound,
                          target=1.0, at_most=True),
            ]
            print_rows(rows)
            write_json(args.json, "failover", rows, {"times_s": times, "lease_s": args.lease_s, "sweep_s": sweep_s,
                                                     "p50_s": p50, "p99_s": p99, "max_s": max(times)})
        finally:
            if agent is not None:
                agent.close()
            workers.close()
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
