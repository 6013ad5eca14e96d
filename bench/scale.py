"""Throughput and scale: turns per second by worker processes and concurrent sessions, turns
carried at once by one worker, and what 1k, 10k, 100k idle sessions cost Redis and the sweeper.

Starts a throwaway `redis-server`, the scripted model server (its own process) and Celery
workers (bench/_agents.py, deployment defaults). Every turn is the scripted two-step tool
turn (the model asks for `lookup`, then answers). In the same run:

1. zero model latency, 1 then 2 worker processes, 1, 10 and 100 sessions at once (each
   runs its turns one after another): turns/s, against the Celery no-op round trips per
   second of as many concurrent senders on the same workers (the floor of a Celery wake);
2. a 200 ms model (each of the turn's two requests waits 200 ms), one worker: 100 turns at
   once; turns carried at once = 100 × (one turn's time alone) / (the burst's time), against
   the 100 it was given (asyncio concurrency inside one process);
3. 1k, 10k, 100k idle sessions, each a clone of one real session at rest after a short
   conversation (every key by DUMP/RESTORE: at rest its streams are as release.lua left
   them, rewritten to their size; the session index entry added; one Lua call per 1,000): Redis memory
   per session (`used_memory` delta), the sweeper's cost per full pass (`Sweeper.sweep_once`
   of fxworker.sweeper, in this process), and turns/s at 10 sessions with them present.

Run: ``.venv/bin/python bench/scale.py [--idle 1000,10000,100000] [--json PATH]`` (about 60 s).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._harness import (  # noqa: E402
    CeleryNoop,
    ModelProcess,
    Row,
    add_json_arg,
    client_agent,
    commandstats,
    new_prefix,
    print_rows,
    ratio_row,
    start_worker,
    write_json,
)
from tests.support.redis_server import RedisServer  # noqa: E402

# Sessions at once -> (turns each, no-op round trips each).
LOADS = {1: (40, 100), 10: (10, 30), 100: (2, 10)}
BURST = 100
BURST_DELAY_MS = 200
SWEEPS = 10
CLONE_BATCH = 1000

CLONE_LUA = """
-- KEYS[1] the session index; ARGV[1] the template's key base, ARGV[2] the prefix,
-- ARGV[3] now ms, ARGV[4..] the new session ids.
local names = {'meta', 'lease', 'inbox', 'log', 'ui', 'msgs', 'pending', 'keys', 'ckpt', 'rest'}
local plan = {}
for _, n in ipairs(names) do
  local src = ARGV[1] .. n
  if redis.call('EXISTS', src) == 1 then table.insert(plan, {n, redis.call('DUMP', src)}) end
end
for i = 4, #ARGV do
  local base = ARGV[2] .. ':{' .. ARGV[i] .. '}:'
  for _, p in ipairs(plan) do redis.call('RESTORE', base .. p[1], 0, p[2]) end
  redis.call('ZADD', KEYS[1], 'NX', ARGV[3], ARGV[i])
end
return #ARGV - 3
"""


async def session_loop(agent: Any, turns: int, tag: str, delay_ms: int = 0) -> None:
    session = agent.session()
    for i in range(turns):
        result = await (await session.prompt(f"tool:{delay_ms}:{tag}t{i}")).result()
        if result.stop_reason != "end_turn":
            raise RuntimeError(f"{tag} turn {i} ended {result}")


def turns_per_s(agent: Any, sessions: int, turns: int, tag: str, delay_ms: int = 0) -> tuple[float, float]:
    """(turns/s, wall s) of `sessions` sessions at once, `turns` each."""
    from fxworker.agent import _loop

    async def all_of() -> None:
        await asyncio.gather(*(session_loop(agent, turns, f"{tag}s{i}", delay_ms) for i in range(sessions)))

    start = time.monotonic()
    _loop().run(all_of(), timeout_s=300)
    wall = time.monotonic() - start
    return sessions * turns / wall, wall


def noops_per_s(agent: Any, redis_url: str, prefix: str, senders: int, each: int) -> float:
    """No-op round trips per second of `senders` threads at once, `each` one after another."""
    noops = [CeleryNoop(agent, redis_url, prefix) for _ in range(senders)]
    try:
        for n in noops[:5]:
            n.once()

        def run(n: CeleryNoop) -> None:
            for _ in range(each):
                n.once()

        start = time.monotonic()
        with ThreadPoolExecutor(senders) as pool:
            list(pool.map(run, noops))
        return senders * each / (time.monotonic() - start)
    finally:
        for n in noops:
            n.close()


def throughput(agent: Any, server: RedisServer, prefix: str, workers: int) -> dict[str, Any]:
    out = {}
    for sessions, (turns, noops) in LOADS.items():
        rate, wall = turns_per_s(agent, sessions, turns, f"w{workers}c{sessions}")
        floor = noops_per_s(agent, server.url, prefix, sessions, noops)
        out[str(sessions)] = {"turns_per_s": rate, "noop_per_s": floor, "s": wall}
        print(f"  {workers} worker(s), {sessions:>3} sessions at once: {rate:7.1f} turns/s "
              f"({sessions * turns} turns in {wall:.1f} s); Celery no-op {floor:7.1f} /s")
    return out


def burst(agent: Any) -> dict[str, float]:
    """One worker, BURST_DELAY_MS model: one turn alone (best of 3), then BURST at once."""
    one = min(turns_per_s(agent, 1, 1, f"one{i}", BURST_DELAY_MS)[1] for i in range(3))
    _, wall = turns_per_s(agent, BURST, 1, "burst", BURST_DELAY_MS)
    carried = BURST * one / wall
    print(f"  {BURST_DELAY_MS} ms model, one worker: one turn {one * 1000:.0f} ms, {BURST} at once "
          f"{wall * 1000:.0f} ms: {carried:.0f} turns carried at once")
    return {"one_s": one, "burst_s": wall, "carried": carried}


def clone_idle(client: redis.Redis, prefix: str, template: str, n: int) -> list[str]:
    """`n` new idle sessions, clones of `template`, by CLONE_BATCH in one Lua call each."""
    from fxworker.ids import new_session_id
    from fxworker.keys import index_keys, session_keys

    clone = client.register_script(CLONE_LUA)
    base = session_keys(prefix, template).meta.removesuffix("meta")
    index = index_keys(prefix).sessions
    ids: list[str] = []
    while len(ids) < n:
        batch = [new_session_id() for _ in range(min(CLONE_BATCH, n - len(ids)))]
        clone(keys=[index], args=[base, prefix, int(time.time() * 1000), *batch])
        ids += batch
    return ids


def sweeper_pass(redis_url: str, prefix: str) -> dict[str, float]:
    """Mean and max wall ms of SWEEPS full sweeps, and Redis µs per sweep."""
    from fxworker.store import redis_store
    from fxworker.sweeper import Sweeper

    woken: list[str] = []

    async def guard(px_ms: int) -> bool:
        return True

    async def sweeps() -> list[float]:
        store = redis_store(redis_url, prefix=prefix)
        sweeper = Sweeper(store, interval_s=5.0, guard=guard, wake=lambda sid, agent: woken.append(sid))
        await sweeper.sweep_once()  # connect
        times = []
        for _ in range(SWEEPS):
            start = time.perf_counter()
            await sweeper.sweep_once()
            times.append(time.perf_counter() - start)
        await store.aclose()
        return times

    stats = redis.Redis.from_url(redis_url)
    before = commandstats(stats)
    times = asyncio.run(sweeps())
    after = commandstats(stats)
    usec = sum(float(v["usec"]) - float(before.get(k, {}).get("usec", 0)) for k, v in after.items() if k != "info")
    stats.close()
    return {"ms": statistics.mean(times) * 1000, "max_ms": max(times) * 1000, "redis_us": usec / (SWEEPS + 1),
            "woken": len(woken)}


def idle_scale(agent: Any, server: RedisServer, prefix: str, template: str, levels: list[int]) -> dict[str, Any]:
    client = redis.Redis.from_url(server.url)
    out: dict[str, Any] = {}
    try:
        made = 0
        base_memory = int(client.info("memory")["used_memory"])
        base = {"sweep": sweeper_pass(server.url, prefix), "turns_per_s": turns_per_s(agent, 10, 6, "idle0")[0]}
        out["0"] = base
        for level in levels:
            start = time.monotonic()
            clones = clone_idle(client, prefix, template, level - made)
            made = level
            made_s = time.monotonic() - start
            state = agent.blocking_session(clones[-1]).state()
            if state.get("status") != "idle":
                raise RuntimeError(f"a cloned session is not at rest: {state}")
            memory = int(client.info("memory")["used_memory"])
            sweep = sweeper_pass(server.url, prefix)
            rate = turns_per_s(agent, 10, 6, f"idle{level}")[0]
            out[str(level)] = {"sessions": level, "bytes_per_session": (memory - base_memory) / level,
                               "sweep": sweep, "turns_per_s": rate, "made_s": made_s}
            print(f"  {level:>7,} idle sessions (made in {made_s:.1f} s): {(memory - base_memory) / level:7.0f} B each; "
                  f"sweep pass {sweep['ms']:.2f} ms ({sweep['redis_us']:.0f} µs in Redis); "
                  f"10 sessions at once {rate:.1f} turns/s")
    finally:
        client.close()
    return out


def rows_of(data: dict[str, Any], levels: list[int]) -> list[Row]:
    item = "5 throughput/scale"
    rows = []
    for workers in ("1", "2"):
        for sessions, fig in data["throughput"][workers].items():
            rows.append(ratio_row(item, f"turns/s, {workers} worker(s), {sessions} sessions at once", fig["turns_per_s"],
                                  "turns/s", f"Celery no-op/s, {sessions} senders", fig["noop_per_s"],
                                  baseline_unit="/s"))
    one, two = data["throughput"]["1"]["100"], data["throughput"]["2"]["100"]
    rows.append(ratio_row(item, "turns/s, 2 workers, 100 sessions", two["turns_per_s"], "turns/s",
                          "1 worker, 100 sessions", one["turns_per_s"], note="2 cores shared with Redis, model, client"))
    b = data["burst"]
    rows.append(ratio_row(item, f"turns carried at once by 1 worker ({BURST_DELAY_MS} ms model)", b["carried"], "turns",
                          "turns given at once", BURST, note=f"{BURST} at once {b['burst_s'] * 1000:.0f} ms, "
                          f"one alone {b['one_s'] * 1000:.0f} ms"))
    idle = data["idle"]
    low, high = str(levels[0]), str(levels[-1])
    rows.append(ratio_row(item, f"Redis bytes per idle session at {int(high):,}", idle[high]["bytes_per_session"], "B",
                          f"at {int(low):,}", idle[low]["bytes_per_session"]))
    rows.append(ratio_row(item, f"sweeper pass with {int(high):,} idle sessions", idle[high]["sweep"]["ms"], "ms",
                          "with none", idle["0"]["sweep"]["ms"]))
    rows.append(ratio_row(item, f"turns/s, 10 sessions, {int(high):,} idle present", idle[high]["turns_per_s"],
                          "turns/s", "with none", idle["0"]["turns_per_s"]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", default="1000,10000,100000", help="idle session counts, comma-separated")
    add_json_arg(parser)
    args = parser.parse_args()
    levels = [int(x) for x in args.idle.split(",") if x]
    from fxworker.agent import _loop
    from tests.support.workers import CeleryWorker

    server = RedisServer()
    model = ModelProcess()
    prefix = new_prefix()
    workers: list[CeleryWorker] = [start_worker(server, prefix, model.base_url)]
    agent = None
    data: dict[str, Any] = {"throughput": {}}
    try:
        agent = client_agent(server.url, prefix, model.base_url)
        turns_per_s(agent, 5, 2, "warm")
        print("zero model latency:")
        data["throughput"]["1"] = throughput(agent, server, prefix, 1)
        data["burst"] = burst(agent)
        template = agent.session()
        _loop().run(template_turn(template), timeout_s=30)
        time.sleep(0.3)  # its release is done: at rest
        print("idle sessions (clones of one at rest after a two-step tool turn):")
        data["idle"] = idle_scale(agent, server, prefix, template.id, levels)
        workers.append(start_worker(server, prefix, model.base_url))
        turns_per_s(agent, 5, 2, "warm2")
        print("zero model latency, 2 workers:")
        data["throughput"]["2"] = throughput(agent, server, prefix, 2)
    finally:
        if agent is not None:
            agent.close()
        for w in workers:
            w.close()
        model.close()
        server.close()
    rows = rows_of(data, levels)
    print_rows(rows)
    write_json(args.json, "scale", rows, data)
    return 0


async def template_turn(session: Any) -> None:
    result = await (await session.prompt("tool:0:template")).result()
    if result.stop_reason != "end_turn":
        raise RuntimeError(f"the template turn ended {result}")


if __name__ == "__main__":
    sys.exit(main())
