"""End to end: many turns at once on one worker process, against the time of one (§7).

Starts, each in its own process: a throwaway `redis-server`, the scripted model server
(every request waits `DELAY_MS`, then answers "ok"), and one Celery worker
(`-P threads -c 100`, agents of `tests.durable.agents`). This process is the client: it
prompts one session and follows its turn to the end (the one-session time, best of a few),
then prompts `SESSIONS` new sessions at once and follows every turn to its end.

Prints the one-session time, the many-session time and their ratio, where the many-session
time goes (when the model requests arrived, relative to the first prompt), and the Redis
commands per turn (`INFO commandstats` deltas over the many-session run, client included).

The worker's CPU per turn is set beside two floors measured on the same worker, each
round of turns followed by a round of each, `SESSIONS` at once: the floor turn
(``fxbench.floor_turn`` of bench/_agents.py: the Celery wake, on the process loop a lease
taken, the same model request on aiohttp read to its end, the reply and an end line
stored and the lease let go, one Lua call each), the same in the task's thread with
blocking clients (``fxbench.floor_turn_sync``: no hop to the loop), and the Celery no-op.

Run: ``.venv/bin/python bench/e2e.py`` (about 20 s); ``--sessions N``, ``--delay-ms MS``;
``--monitor`` also lists every Redis command of one turn, by the process that sent it;
``--profile PATH`` samples the worker with py-spy during the many-session run (the floors
are then left out, so the samples are the turns'); ``--json
PATH`` also writes the summary rows (bench/run_all.py).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._harness import cpu_s, monitor  # noqa: E402
from fxworker.keys import queue_name  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import CeleryWorker  # noqa: E402

SESSIONS = 100
DELAY_MS = 200
ONE_RUNS = 3
ROUNDS = 4


# ---------------------------------------------------------------------------- model server


def serve_model() -> None:
    """The model server process: prints its base URL, serves until stdin closes, then
    prints the arrival times (epoch ms) of the chat requests as one JSON line."""
    from fxengine.testing import Reply, ScriptedModel, delay, text

    def responder(request: Any) -> Reply:
        messages = request.body.get("messages") or []
        last = messages[-1].get("content") if messages else ""
        ms = float(last[5:]) if isinstance(last, str) and last.startswith("slow:") else 0.0
        return Reply(delay(ms), text("ok"))

    with ScriptedModel(responder=responder) as model:
        print(model.base_url, flush=True)
        sys.stdin.read()
        arrivals = [r.at_ms for r in model.requests if r.path.endswith("/chat/completions")]
        print(json.dumps(arrivals), flush=True)


class ModelProcess:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-model"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            raise RuntimeError("the model server did not start")

    def arrivals_ms(self) -> list[float]:
        """Stops the server; the arrival times of every chat request it served."""
        out, _ = self.proc.communicate(timeout=15)
        return json.loads(out.strip().splitlines()[-1])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


# ---------------------------------------------------------------------------- client


def commandstats(client: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in client.info("commandstats").items()}


def extra_env() -> dict[str, str]:
    """`FX_BENCH_AGENTS` (a module on `FX_BENCH_PYTHONPATH`) replaces the worker's agents module."""
    env = {"FX_AGENTS": "bench._agents"}  # tests.durable.agents' agents and the floor tasks
    if os.environ.get("FX_BENCH_AGENTS"):
        env["FX_AGENTS"] = os.environ["FX_BENCH_AGENTS"]
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("FX_BENCH_PYTHONPATH", "")])
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve-model", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=SESSIONS)
    parser.add_argument("--delay-ms", type=int, default=DELAY_MS)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="bursts of new sessions, one after another")
    parser.add_argument("--concurrency", type=int, default=100, help="the worker's -c")
    parser.add_argument("--monitor", action="store_true", help="list the Redis commands of one turn")
    parser.add_argument("--scripts", action="store_true",
                        help="count every Redis command (scripts by name) of the last round, per turn")
    parser.add_argument("--profile", metavar="PATH", help="py-spy the worker during the many-session run "
                        "(collapsed stacks to PATH; needs py-spy installed)")
    parser.add_argument("--json", metavar="PATH", help="also write the summary rows to PATH")
    args = parser.parse_args()
    if args.serve_model:
        serve_model()
        return

    started = time.monotonic()
    server = RedisServer()
    model = ModelProcess()
    prefix = f"fxbench{uuid.uuid4().hex[:8]}"
    worker = CeleryWorker(
        redis_url=server.url, prefix=prefix, queues=("default",), agents=("default",),
        concurrency=args.concurrency,
        env={"FX_TEST_MODEL_URL": model.base_url, "FX_LOG_LEVEL": "WARNING", **extra_env()},
    )
    try:
        worker.start(timeout_s=30)
        print(f"worker pid {worker.pid}, model server pid {model.proc.pid}, redis port {server.port}")
        run(args, server, model, worker, prefix)
    finally:
        worker.close()
        model.close()
        server.stop()
    print(f"bench took {time.monotonic() - started:.1f} s")


def run(args: Any, server: RedisServer, model: ModelProcess, worker: CeleryWorker, prefix: str) -> None:
    from fxworker import Agent, Settings
    from fxworker.agent import _loop
    from fxworker.celery_app import make_celery_app
    from fxworker.store import redis_store
    from fxworker.wakers import CeleryWaker
    from tests.durable.tooling import provider, tools

    settings = Settings(redis_url=server.url, prefix=prefix, lease_s=3.0, reserve_s=4.0)
    agent = Agent(
        "default", model="scripted", provider=provider(model.base_url), tools=tools(), api_key="test-key",
        store=redis_store(server.url, prefix=prefix), waker=CeleryWaker(make_celery_app(settings)), settings=settings,
    )
    prompt = f"slow:{args.delay_ms}"
    stats = redis.Redis.from_url(server.url)

    def one() -> float:
        t0 = time.monotonic()
        result = agent.blocking_session().prompt(prompt).result()
        assert result.stop_reason == "end_turn", result
        return time.monotonic() - t0

    one()  # warm up the worker and this process
    one_s = min(one() for _ in range(ONE_RUNS))

    if args.monitor:
        seen = monitor(server.url, one)
        by_client: dict[str, list[str]] = {}
        for addr, command in seen:
            by_client.setdefault(addr, []).append(command)
        print("Redis commands of one turn, by connection:")
        for addr, commands in by_client.items():
            print(f"  {addr}: {len(commands)}: {', '.join(commands)}")

    async def many() -> tuple[list[Any], float]:
        sessions = [agent.session() for _ in range(args.sessions)]
        turns = await asyncio.gather(*[s.prompt(prompt) for s in sessions])
        accepted_s = time.monotonic()
        # Followed one after the other, as the test does: a turn that ended is read at once.
        return [await t.result() for t in turns], accepted_s

    spy = None
    if args.profile:
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(worker.pid), "-r", "400",
                                "--format", "raw", "-o", args.profile, "--nonblocking", "--gil", "--threads"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attaches
    pids = {"worker": worker.pid, "model server": model.proc.pid, "redis": server.proc.pid if server.proc else None,
            "client": os.getpid()}
    rounds: list[dict[str, Any]] = []
    floor_tasks = {} if args.profile else FLOOR_TASKS
    floors: dict[str, list[float]] = {name: [] for name in floor_tasks}
    floor_walls: dict[str, list[float]] = {name: [] for name in floor_tasks}
    # The floor turns' own one-alone times, to set their bursts beside the turns'.
    floor_one_s = {name: min(sent_all(agent.waker.app, stats, 1, task, prompt, prefix) for _ in range(ONE_RUNS))
                   for name, task in floor_tasks.items() if task != "fxbench.noop"}
    script_calls: collections.Counter[str] = collections.Counter()
    for i in range(args.rounds):
        for name, task in floor_tasks.items():
            before_s = cpu_s(worker.pid)
            floor_walls[name].append(sent_all(agent.waker.app, stats, args.sessions, task, prompt, prefix))
            floors[name].append((cpu_s(worker.pid) - before_s) * 1000 / args.sessions)
        cpu_before = {name: cpu_s(pid) for name, pid in pids.items()}
        before = commandstats(stats)
        t0_wall_ms = time.time() * 1000
        t0 = time.monotonic()
        if args.scripts and i == args.rounds - 1:
            box: list[Any] = []
            seen = monitor(server.url, lambda: box.append(_loop().run(many(), timeout_s=120)))
            results, accepted_s = box[0]
            script_calls.update(command for _, command in seen)
        else:
            results, accepted_s = _loop().run(many(), timeout_s=120)
        many_s = time.monotonic() - t0
        after = commandstats(stats)
        assert [r.stop_reason for r in results] == ["end_turn"] * args.sessions, results[:3]
        rounds.append({
            "s": many_s, "accepted_s": accepted_s - t0, "t0_wall_ms": t0_wall_ms, "end_wall_ms": time.time() * 1000,
            "cpu": {name: cpu_s(pid) - cpu_before[name] for name, pid in pids.items()},
            "commands": {k: after[k] - before.get(k, 0) for k in after},
        })
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
    arrivals_ms = model.arrivals_ms()

    n = args.sessions
    print(f"one session: {one_s * 1000:.0f} ms (best of {ONE_RUNS}), model delay {args.delay_ms} ms")
    for i, r in enumerate(rounds, 1):
        arrivals = sorted(a - r["t0_wall_ms"] for a in arrivals_ms if r["t0_wall_ms"] <= a <= r["end_wall_ms"])
        print(f"round {i}{' (cold pools)' if i == 1 else ''}: {n} sessions at once on one worker: "
              f"{r['s'] * 1000:.0f} ms ({r['s'] / one_s:.1f}x)")
        print(f"  prompts accepted and woken by {r['accepted_s'] * 1000:.0f} ms; model requests arrived "
              f"{arrivals[0]:.0f} ms (first) to {arrivals[-1]:.0f} ms (last); after the last delay "
              f"{r['s'] * 1000 - arrivals[-1] - args.delay_ms:.0f} ms to the end")
        print("  CPU: " + ", ".join(f"{name} {v * 1000:.0f} ms" for name, v in r["cpu"].items())
              + f" ({os.cpu_count()} cores)")
    per_turn = {k: v / n for k, v in rounds[-1]["commands"].items() if k != "info"}
    print("Redis commands per turn, client and worker (last round): "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_turn.items(), key=lambda kv: -kv[1]) if v >= 0.05))
    if script_calls:
        print("Redis commands per turn by name, scripts by theirs (last round, MONITOR, client and worker): "
              + ", ".join(f"{k} {v / n:.2f}" for k, v in script_calls.most_common() if v / n >= 0.05))
    times = sorted(r["s"] for r in rounds)
    median_s = times[len(times) // 2]
    print(f"RESULT one session {one_s * 1000:.0f} ms; {n} at once: first round {rounds[0]['s'] * 1000:.0f} ms "
          f"({rounds[0]['s'] / one_s:.1f}x), median of {len(rounds)} {median_s * 1000:.0f} ms ({median_s / one_s:.1f}x)")
    cpu_ms = sorted(r["cpu"]["worker"] * 1000 / n for r in rounds)[len(rounds) // 2]
    print(f"RESULT worker CPU per turn {cpu_ms:.1f} ms (median of {len(rounds)} rounds)")
    floor_ms = {name: sorted(v)[len(v) // 2] for name, v in floors.items()}
    if floor_ms:
        print("RESULT worker CPU per task, " + ", ".join(f"{name} {v:.2f} ms" for name, v in floor_ms.items())
              + f" (medians of {len(rounds)} rounds of {n} at once, interleaved with the turns'); a turn "
              + ", ".join(f"{cpu_ms / v:.2f}x the {name}" for name, v in floor_ms.items()))
    # The floor turns' bursts: (median seconds of `n` at once, seconds of one alone).
    floor_bursts = {name: (sorted(floor_walls[name])[len(rounds) // 2], one) for name, one in floor_one_s.items()}
    if floor_bursts:
        print(f"RESULT {n} at once against one alone (medians of {len(rounds)} rounds): a turn {median_s / one_s:.2f}x; "
              + "; ".join(f"the {name} {many * 1000:.0f} ms / {one * 1000:.0f} ms = {many / one:.2f}x"
                          for name, (many, one) in floor_bursts.items()))
    agent.close()
    write_rows(args.json, n, one_s, median_s, cpu_ms, args.delay_ms, rounds, floor_ms, floor_bursts)


# The floors' Celery tasks (bench/_agents.py), by their names here.
FLOOR_TASKS = {"floor turn": "fxbench.floor_turn", "floor turn in the task thread": "fxbench.floor_turn_sync",
               "Celery no-op": "fxbench.noop"}


def sent_all(app: Any, client: redis.Redis, n: int, task: str, prompt: str, prefix: str) -> float:
    """Sends `n` tasks `task` at once and waits until each has pushed to their list; the
    seconds that took."""
    key = f"{prefix}:bench:floor:{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    for i in range(n):
        args = [key] if task == "fxbench.noop" else [f"{key}:{i}", prompt, key]
        app.send_task(task, args=args, queue=queue_name("default"))
    for _ in range(n):
        if client.blpop([key], timeout=30) is None:
            raise RuntimeError(f"a {task} task did not end within 30 s")
    return time.monotonic() - t0


def write_rows(path: str | None, n: int, one_s: float, median_s: float, cpu_ms: float, delay_ms: int,
               rounds: list[dict[str, Any]], floor_ms: dict[str, float],
               floor_bursts: dict[str, tuple[float, float]]) -> None:
    """The issue-11 figures as summary rows (bench/_harness.py), when --json is given."""
    if not path:
        return
    from bench._harness import Row, ratio_row, write_json

    item = "5 burst (issue 11)"
    rows: list[Row] = [
        ratio_row(item, f"{n} sessions at once on 1 worker ({delay_ms} ms model)", median_s * 1000, "ms",
                  "one session alone", one_s * 1000, target=2.0, at_most=True, note="bench/e2e.py, median of rounds"),
        ratio_row(item, "worker CPU per turn (e2e burst)", cpu_ms, "ms", "5 ms target", 5.0, target=1.0, at_most=True),
        ratio_row("streaming (issue 25)", "worker CPU per one-step turn (e2e burst)", cpu_ms, "ms", "2 ms target", 2.0,
                  target=1.0, at_most=True),
        *(ratio_row("streaming (issue 25)", "worker CPU per one-step turn (e2e burst)", cpu_ms, "ms",
                    f"{name}, same worker", ms, note=note)
          for (name, ms), note in zip(floor_ms.items(), (
              "Celery wake, lease, aiohttp model request, 1 write, release (bench/_agents.py)",
              "the same with blocking clients in the Celery thread, no loop", ""))),
        *(ratio_row("streaming (issue 25)", f"{name}: {n} at once on 1 worker ({delay_ms} ms model)", many * 1000,
                    "ms", "one alone", one * 1000, note="the floor of the 100-at-once row")
          for name, (many, one) in floor_bursts.items()),
    ]
    write_json(path, "e2e", rows, {"one_s": one_s, "median_s": median_s, "cpu_ms_per_turn": cpu_ms,
                                   "cpu_ms_per_floor_task": floor_ms,
                                   "rounds": [{k: v for k, v in r.items() if k != "commands"} for r in rounds]})


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
