"""The session store's cost per call, against the floor of one Redis round trip.

Starts a throwaway `redis-server` on a free loopback port and measures, in the same run:

- accept, sequential: throughput and p50/p99 latency of `store.sync.accept()` (one
  EVALSHA on a standalone server: the ready mark is inside the accept script) against a
  raw redis-py `EVALSHA` of `return 1` on the same client and connection pool (the floor
  for any one-round-trip call). Rounds of the two interleave, so machine load hits both
  alike. Target: >= 0.7x of raw.
- raw XADD: the same client's `XADD` of one small entry (what an append-only log costs
  without a script), beside the raw EVALSHA.
- accept, concurrent: throughput of `CONCURRENCY` asyncio tasks calling `store.accept()`
  against the same tasks calling the raw `EVALSHA` on the same asyncio client and pool.
- accept, 8 clients: `CLIENTS` processes, each with its own blocking client, calling
  `store.sync.accept()`, against the same processes calling raw `EVALSHA` and raw `XADD`
  (aggregate throughput; rounds interleave).
- a recorded step: one engine record plus its UI lines through the engine `Persistence`
  adapter (`queue_lines` + `append`). Counts Redis commands (`INFO commandstats` deltas)
  and client round trips (writes on the socket) per step. Target: 1 round trip.

Run: ``.venv/bin/python bench/store.py [--json PATH]`` (about 20 s).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fxworker.ids import new_holder_id, new_session_id  # noqa: E402
from fxworker.store import RedisStore, redis_store  # noqa: E402
from fxworker.store._senders import _accept as accept_plan  # noqa: E402
from bench._harness import Row, add_json_arg, print_rows, ratio_row, write_json  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

ROUNDS = 6
PER_ROUND = 1500
SESSIONS = 200
CONCURRENCY = 16
CONCURRENT_PER_TASK = 150
STEPS = 2000
LINES_PER_STEP = 3
TRIVIAL = "return 1"
CLIENTS = 8
CLIENT_CALLS = 1500
CLIENT_ROUNDS = 3

SENDS = {"sync": 0, "async": 0}


class CountingConnection(redis.connection.Connection):
    """Counts socket writes: one per command, or one per pipeline."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        SENDS["sync"] += 1
        super().send_packed_command(command, check_health)


class AsyncCountingConnection(redis.asyncio.connection.Connection):
    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        SENDS["async"] += 1
        await super().send_packed_command(command, check_health)


def commandstats(client: redis.Redis) -> dict[str, int]:
    return {name: int(stat["calls"]) for name, stat in client.info("commandstats").items()}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    out = {k: after[k] - before.get(k, 0) for k in after}
    out.pop("cmdstat_info", None)
    return {k: v for k, v in out.items() if v}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ratio_line(what: str, accept: float, raw: float, *, higher_is_better: bool) -> str:
    ratio = accept / raw if higher_is_better else raw / accept
    return f"  {what:<22} {ratio:5.2f}x of raw (target >= 0.70x)"


def bench_accept(store: RedisStore, raw: redis.Redis) -> dict[str, Any]:
    sessions = [new_session_id() for _ in range(SESSIONS)]
    sha = raw.script_load(TRIVIAL)
    # The floor of accept itself: its script through the same raw EVALSHA, arguments
    # built beforehand (other sessions, same shape), so no store code runs in the loop.
    floor_sessions = [new_session_id() for _ in range(SESSIONS)]
    prebuilt = [
        accept_plan(store.core, floor_sessions[i % SESSIONS], agent="default", message_id=f"f{i}",
                    input="hello there").steps[0]
        for i in range(ROUNDS * PER_ROUND)
    ]
    store.sync.accept(floor_sessions[0], agent="default", message_id="load", input="x")  # loads the scripts
    ns: dict[str, list[float]] = {"raw": [], "xadd": [], "accept": [], "floor": []}
    elapsed = {"raw": 0.0, "xadd": 0.0, "accept": 0.0, "floor": 0.0}
    n = 0
    for _ in range(ROUNDS):
        gc.collect()
        start = time.perf_counter()
        for _ in range(PER_ROUND):
            t = time.perf_counter_ns()
            raw.evalsha(sha, 0)
            ns["raw"].append(time.perf_counter_ns() - t)
        elapsed["raw"] += time.perf_counter() - start
        gc.collect()
        start = time.perf_counter()
        for _ in range(PER_ROUND):
            t = time.perf_counter_ns()
            raw.xadd("bench:xadd", {"d": "hello there"}, maxlen=1000, approximate=True)
            ns["xadd"].append(time.perf_counter_ns() - t)
        elapsed["xadd"] += time.perf_counter() - start
        gc.collect()
        start = time.perf_counter()
        for _ in range(PER_ROUND):
            n += 1
            t = time.perf_counter_ns()
            store.sync.accept(sessions[n % SESSIONS], agent="default", message_id=f"m{n}", input="hello there")
            ns["accept"].append(time.perf_counter_ns() - t)
        elapsed["accept"] += time.perf_counter() - start
        gc.collect()
        start = time.perf_counter()
        for call in prebuilt[n - PER_ROUND:n]:
            t = time.perf_counter_ns()
            raw.evalsha(*call.evalsha_args())
            ns["floor"].append(time.perf_counter_ns() - t)
        elapsed["floor"] += time.perf_counter() - start
    total = ROUNDS * PER_ROUND
    rate = {name: total / seconds for name, seconds in elapsed.items()}
    print("sequential (one blocking client, one connection pool):")
    for name, label in (("accept", "accept"), ("raw", "raw EVALSHA"), ("xadd", "raw XADD"), ("floor", "accept.lua raw")):
        print(f"  {label:<14} {rate[name]:9.0f} /s   p50 {pct(ns[name], .5) / 1e3:6.1f} µs   "
              f"p99 {pct(ns[name], .99) / 1e3:6.1f} µs")
    print(ratio_line("throughput", rate["accept"], rate["raw"], higher_is_better=True))
    print(ratio_line("p50 latency", pct(ns["accept"], .5), pct(ns["raw"], .5), higher_is_better=False))
    print(ratio_line("p99 latency", pct(ns["accept"], .99), pct(ns["raw"], .99), higher_is_better=False))
    print(f"  (accept.lua by raw EVALSHA, no store code: {rate['floor'] / rate['raw']:.2f}x throughput, "
          f"{pct(ns['raw'], .5) / pct(ns['floor'], .5):.2f}x p50 of raw)")

    before = commandstats(raw)
    before_sends = SENDS["sync"]
    for i in range(200):
        store.sync.accept(sessions[i % SESSIONS], agent="default", message_id=f"rt{i}", input="x")
    sends = SENDS["sync"] - before_sends
    d = delta(before, commandstats(raw))
    print(f"accept: {d.get('cmdstat_evalsha', 0) / 200:.2f} EVALSHA ({sum(d.values()) / 200:.2f} commands with those "
          f"the script runs), {sends / 200:.2f} round trips each")
    # Where the gap to the floor is: Redis's own time per call (INFO commandstats usec).
    raw.config_resetstat()
    for i in range(1000):
        raw.evalsha(sha, 0)
    trivial_us = float(raw.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
    raw.config_resetstat()
    for i in range(1000):
        store.sync.accept(sessions[i % SESSIONS], agent="default", message_id=f"us{i}", input="x")
    stats = raw.info("commandstats")
    accept_us = float(stats["cmdstat_evalsha"]["usec_per_call"]) * stats["cmdstat_evalsha"]["calls"] / 1000
    print(f"Redis time per call: accept {accept_us:.1f} µs (ready mark included), trivial {trivial_us:.1f} µs")
    return {
        "rate_per_s": rate, "p50_us": {k: pct(v, .5) / 1e3 for k, v in ns.items()},
        "p99_us": {k: pct(v, .99) / 1e3 for k, v in ns.items()},
        "redis_us_per_call": {"accept": accept_us, "trivial": trivial_us},
        "accept_round_trips": sends / 200,
    }


async def bench_concurrent(url: str) -> dict[str, float]:
    client = redis.asyncio.Redis.from_url(url, max_connections=CONCURRENCY)
    store = redis_store(client=client, sync_client=redis.Redis.from_url(url), prefix="bench-concurrent")
    sessions = [new_session_id() for _ in range(SESSIONS)]
    sha = await client.script_load(TRIVIAL)
    counter = iter(range(10**9))

    async def accepts() -> None:
        for _ in range(CONCURRENT_PER_TASK):
            n = next(counter)
            await store.accept(sessions[n % SESSIONS], agent="default", message_id=f"c{n}", input="hello there")

    async def raws() -> None:
        for _ in range(CONCURRENT_PER_TASK):
            await client.evalsha(sha, 0)

    await asyncio.gather(accepts(), raws())  # open the pool's connections, load the scripts
    elapsed = {"accept": 0.0, "raw": 0.0}
    for _ in range(ROUNDS):
        for name, task in (("raw", raws), ("accept", accepts)):
            gc.collect()
            start = time.perf_counter()
            await asyncio.gather(*(task() for _ in range(CONCURRENCY)))
            elapsed[name] += time.perf_counter() - start
    total = ROUNDS * CONCURRENCY * CONCURRENT_PER_TASK
    accept_rate, raw_rate = total / elapsed["accept"], total / elapsed["raw"]
    print(f"concurrent ({CONCURRENCY} asyncio tasks, one asyncio client and pool):")
    print(f"  accept      {accept_rate:9.0f} /s")
    print(f"  raw EVALSHA {raw_rate:9.0f} /s")
    print(ratio_line("throughput", accept_rate, raw_rate, higher_is_better=True))
    await store.aclose()
    return {"accept": accept_rate, "raw": raw_rate}


def client_process(url: str, what: str, calls: int, index: int, go: Any, out: Any) -> None:
    """One of the `CLIENTS` processes: waits for `go`, makes `calls` calls, reports its time."""
    raw = redis.Redis.from_url(url)
    store = redis_store(client=redis.asyncio.Redis.from_url(url), sync_client=raw, prefix="bench-clients")
    sha = raw.script_load(TRIVIAL)
    sessions = [new_session_id() for _ in range(20)]
    store.sync.accept(sessions[0], agent="default", message_id="load", input="x")
    go.wait()
    start = time.perf_counter()
    for i in range(calls):
        if what == "accept":
            store.sync.accept(sessions[i % 20], agent="default", message_id=f"p{index}m{i}", input="hello there")
        elif what == "raw":
            raw.evalsha(sha, 0)
        else:
            raw.xadd(f"bench:xadd:{index}", {"d": "hello there"}, maxlen=1000, approximate=True)
    out.put(time.perf_counter() - start)
    raw.close()


def bench_clients(url: str) -> dict[str, float]:
    """Aggregate calls/s of `CLIENTS` processes at once, for accept, raw EVALSHA and raw XADD."""
    ctx = multiprocessing.get_context("fork")
    elapsed = {"raw": 0.0, "xadd": 0.0, "accept": 0.0}
    for _ in range(CLIENT_ROUNDS):
        for what in elapsed:
            go, out = ctx.Event(), ctx.Queue()
            procs = [ctx.Process(target=client_process, args=(url, what, CLIENT_CALLS, i, go, out))
                     for i in range(CLIENTS)]
            for p in procs:
                p.start()
            time.sleep(0.5)  # every process connected and loaded its scripts
            start = time.perf_counter()
            go.set()
            for _ in procs:
                out.get(timeout=120)
            elapsed[what] += time.perf_counter() - start
            for p in procs:
                p.join(10)
    total = CLIENT_ROUNDS * CLIENTS * CLIENT_CALLS
    rate = {k: total / v for k, v in elapsed.items()}
    print(f"{CLIENTS} client processes at once (one blocking client each):")
    for name, label in (("accept", "accept"), ("raw", "raw EVALSHA"), ("xadd", "raw XADD")):
        print(f"  {label:<12} {rate[name]:9.0f} /s")
    print(ratio_line("throughput", rate["accept"], rate["raw"], higher_is_better=True))
    return rate


async def bench_steps(url: str, raw: redis.Redis) -> dict[str, float]:
    pool = redis.asyncio.ConnectionPool.from_url(url, connection_class=AsyncCountingConnection)
    client = redis.asyncio.Redis(connection_pool=pool)
    store = redis_store(client=client, sync_client=raw, prefix="bench-steps")
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="go")
    claim = await store.claim(sid, holder=new_holder_id(), lease_ms=600_000)
    assert claim is not None
    journal = store.persistence(sid, claim.epoch, claim)
    head: str | None = None
    record = b"x" * 300
    before, before_sends = commandstats(raw), SENDS["async"]
    start = time.perf_counter()
    for i in range(STEPS):
        journal.queue_lines(
            {"type": "text_delta", "messageId": "m1", "delta": f"word {i}.{j} "} for j in range(LINES_PER_STEP)
        )
        marks = [{"start": "m1"}] if i == 0 else []
        head = await journal.append(expected=head, idempotency_key=f"e:{i}", data=record, barrier=False, marks=marks)
    elapsed = time.perf_counter() - start
    d = delta(before, commandstats(raw))
    sends = SENDS["async"] - before_sends
    lines = await store.read_lines(sid, 0, count=STEPS * LINES_PER_STEP)  # one page of them all
    assert len(lines) == STEPS * LINES_PER_STEP and head == str(STEPS)
    print(f"recorded step (1 record + {LINES_PER_STEP} UI lines): {sum(d.values()) / STEPS:.2f} Redis commands, "
          f"{sends / STEPS:.2f} round trips, {elapsed / STEPS * 1e6:.0f} µs each (target: 1 round trip)")
    print(f"  commands: {', '.join(f'{k[8:]}={v}' for k, v in sorted(d.items()))}")
    await client.aclose()
    return {"commands": sum(d.values()) / STEPS, "round_trips": sends / STEPS, "us": elapsed / STEPS * 1e6}


def summary(seq: dict[str, Any], conc: dict[str, float], clients: dict[str, float], steps: dict[str, float]) -> list[Row]:
    rate, p50 = seq["rate_per_s"], seq["p50_us"]
    item = "1 acceptance"
    return [
        ratio_row(item, "accept, 1 client", rate["accept"], "/s", "raw EVALSHA", rate["raw"], target=0.7),
        ratio_row(item, "accept p50, 1 client", p50["accept"], "µs", "raw EVALSHA p50", p50["raw"], invert=True,
                  target=0.7, note="ratio = raw / accept"),
        ratio_row(item, "accept, 1 client", rate["accept"], "/s", "raw XADD", rate["xadd"]),
        ratio_row(item, f"accept, {CONCURRENCY} asyncio tasks", conc["accept"], "/s", "raw EVALSHA", conc["raw"],
                  target=0.7),
        ratio_row(item, f"accept, {CLIENTS} client processes", clients["accept"], "/s", "raw EVALSHA",
                  clients["raw"], target=0.7),
        ratio_row(item, f"accept, {CLIENTS} client processes", clients["accept"], "/s", "raw XADD", clients["xadd"]),
        ratio_row("2 cost per step", f"round trips per step record + {LINES_PER_STEP} UI lines (store API)",
                  steps["round_trips"], "round trips", "one round trip", 1.0, target=1.0, at_most=True,
                  note=f"{steps['commands']:.1f} Redis commands inside it"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_arg(parser)
    args = parser.parse_args()
    server = RedisServer()
    try:
        print(f"redis-server {redis.Redis.from_url(server.url).info('server')['redis_version']} on port {server.port}")
        pool = redis.ConnectionPool.from_url(server.url, connection_class=CountingConnection)
        raw = redis.Redis(connection_pool=pool)
        store = redis_store(client=redis.asyncio.Redis.from_url(server.url), sync_client=raw, prefix="bench")
        seq = bench_accept(store, raw)
        conc = asyncio.run(bench_concurrent(server.url))
        clients = bench_clients(server.url)
        steps = asyncio.run(bench_steps(server.url, raw))
        raw.close()
    finally:
        server.close()
    rows = summary(seq, conc, clients, steps)
    print_rows(rows)
    write_json(args.json, "store", rows, {"sequential": seq, "concurrent": conc, "clients": clients, "steps": steps})


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.1f} s)")
