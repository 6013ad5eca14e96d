"""Parked turns (docs/design.md §6 "Paused turns"): what a session waiting for an approval
costs Redis and the workers, and how soon an approval runs its call.

Starts, each in its own process: a throwaway `redis-server`, the scripted model server
(``--serve-model``: prompt ``refund:<n>`` asks for the ``refund`` tool with amount n, a tool
result is answered ``"done"``, anything else ``"ok"``) and one Celery worker (`-P threads
-c 100`, deployment defaults) whose agents module is this file: agent ``default`` with the
tools of tests/durable/tooling.py, ``refund`` (``approval=True``) replaced by one that
pushes ``<amount>|<time.time()>`` to a Redis list the moment it runs. This process is the
client. In the same run:

1. ``--sessions`` idle sessions (one plain prompt each, followed to its end, at rest),
   then as many parked ones (``refund:<n>``, followed to its ``paused`` end, the store's
   state ``paused``). Redis bytes per session both ways: the ``used_memory`` delta over
   each phase divided by the sessions (the index entries and every allocation included),
   and ``MEMORY USAGE <key> SAMPLES 0`` of each of a session's keys summed, by key kind
   (fxworker/keys.py), with what each kind would take rewritten to its size
   (DUMP/RESTORE of a sample, as a release at rest does to ``ui``);
2. after parking, the sessions with a live lease (``state.lease_holder``), the worker's
   ``fx_turns_running`` gauge, its busy task threads (Celery ``inspect active``), its
   thread count, and the ready set's size;
3. ``--sample`` approvals against as many prompts, interleaved (approve one parked
   session and follow its turn to its end, then prompt one idle session and follow it):
   from ``session.approve()`` returning to the tool's start (the time it pushed), against
   from ``session.prompt()`` returning to its model request's arrival at the model server;
   p50 and p99 of each, and of both to the turn's end.

Run: ``.venv/bin/python bench/parked.py [--sessions 10000] [--sample 200] [--json PATH]``
(about 3 min at the default 10,000 on 2 cores; ``--sessions 1000`` about 30 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fxworker.keys import SESSION_KEY_NAMES, index_keys, session_keys  # noqa: E402

SESSIONS = 10_000
SAMPLE = 200
CONCURRENCY = 100  # sessions prompted at once while idling and parking them
REWRITE_SAMPLE = 200  # sessions whose keys are rewritten (DUMP/RESTORE) to their size
WORKER_ENV = "FX_BENCH_PARKED_WORKER"  # set in the worker: this module makes its agents


def started_key(prefix: str) -> str:
    """The list the worker's `refund` pushes `<amount>|<epoch s>` to when it runs."""
    return f"{prefix}:bench:refund_started"


# ---------------------------------------------------------------------------- the worker's agent

_started_client: Any = None


async def _refund(input: dict[str, Any], ctx: Any) -> str:
    """`refund`, timed: its start (epoch s) goes to `started_key` before anything else."""
    global _started_client
    at = time.time()
    amount = input.get("amount", 0)
    if _started_client is None:
        import redis.asyncio

        _started_client = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])
    await _started_client.rpush(started_key(os.environ.get("FX_PREFIX", "fx")), f"{amount}|{at!r}")
    return f"refunded {amount}"


def bench_tools() -> list[Any]:
    """tests/durable/tooling.py's tools, `refund` (waits for approval) the timed one."""
    from fxengine.tools import Tool
    from tests.durable.tooling import tools

    others = [t for t in tools() if t.name != "refund"]
    return [*others, Tool("refund", "Refunds an order (a person approves it first).",
                          {"type": "object", "properties": {"amount": {"type": "integer"}}},
                          idempotent=False, execute=_refund, approval=True)]


if os.environ.get(WORKER_ENV):  # imported as the worker's FX_AGENTS
    from fxworker import Agent
    from tests.durable.tooling import provider

    AGENTS = {"default": Agent("default", model="scripted", provider=provider(os.environ["FX_TEST_MODEL_URL"]),
                               tools=bench_tools(), api_key="test-key")}


# ---------------------------------------------------------------------------- model server


def serve_model() -> None:
    """The model server process: prints its base URL, serves until stdin closes, then
    prints `[arrival epoch ms, last user text, last message's role]` of every chat request
    as one JSON line."""
    from bench._model import last_user_text
    from fxengine.testing import Reply, ScriptedModel, text, tool_call

    def respond(request: Any) -> Reply:
        messages = request.body.get("messages") or []
        if messages and messages[-1].get("role") == "tool":
            return Reply(text("done"))
        prompt = last_user_text(messages)
        if prompt.startswith("refund:"):
            return Reply(tool_call(f"call_{uuid.uuid4().hex[:24]}", "refund", {"amount": int(prompt[7:])}))
        return Reply(text("ok"))

    with ScriptedModel(responder=respond) as model:
        print(model.base_url, flush=True)
        sys.stdin.read()
        served = []
        for r in model.requests:
            if r.path.endswith("/chat/completions"):
                messages = r.body.get("messages") or []
                served.append([r.at_ms, last_user_text(messages), messages[-1].get("role") if messages else ""])
        print(json.dumps(served), flush=True)


# ---------------------------------------------------------------------------- memory


def settled_memory(client: redis.Redis) -> int:
    """`used_memory` less the connections' buffers (`mem_clients_normal`: the client's pool
    grows with the readers following turns), once the worker's last writes and the
    broker's acks are done."""
    time.sleep(1.0)
    info = client.info("memory")
    return int(info["used_memory"]) - int(info["mem_clients_normal"])


def key_bytes(client: redis.Redis, prefix: str, ids: list[str]) -> dict[str, dict[str, float]]:
    """Per key kind: bytes per session (MEMORY USAGE SAMPLES 0, summed, divided by the
    sessions) and how many of the sessions have that key."""
    total: dict[str, int] = defaultdict(int)
    present: dict[str, int] = defaultdict(int)
    for i in range(0, len(ids), 500):
        pipe = client.pipeline(transaction=False)
        for sid in ids[i:i + 500]:
            for name in session_keys(prefix, sid).names:
                pipe.memory_usage(name, samples=0)
        for j, used in enumerate(pipe.execute()):
            kind = SESSION_KEY_NAMES[j % len(SESSION_KEY_NAMES)]
            if used is not None:
                total[kind] += int(used)
                present[kind] += 1
    return {kind: {"bytes": total[kind] / len(ids), "present": present[kind] / len(ids)} for kind in SESSION_KEY_NAMES}


def rewritten_bytes(client: redis.Redis, prefix: str, ids: list[str]) -> dict[str, float]:
    """Per key kind: bytes per session had each key been rewritten to its size (DUMP, then
    RESTORE to a scratch key, MEMORY USAGE of that), over `ids`."""
    scratch = f"{prefix}:bench:scratch"
    total: dict[str, int] = defaultdict(int)
    for sid in ids:
        for kind, name in zip(SESSION_KEY_NAMES, session_keys(prefix, sid).names):
            dumped = client.dump(name)
            if dumped is None:
                continue
            client.restore(scratch, 0, dumped, replace=True)
            total[kind] += int(client.memory_usage(scratch, samples=0) or 0)
    client.delete(scratch)
    return {kind: total[kind] / len(ids) for kind in SESSION_KEY_NAMES}


def as_at_rest(client: redis.Redis, prefix: str, ids: list[str]) -> dict[str, float]:
    """Per key kind: bytes per parked session had its park laid it out as a release at
    rest does (lua/_rest.lua, append.lua's packing): the log as one `rest` string (three
    `<length>:<bytes>` items a record), the lines as packed chunks (store/_packed.py), the
    consumed inbox gone; the other keys as they are, rewritten to their size."""
    from fxworker.store._packed import pack_lines

    scratch = f"{prefix}:bench:scratch"
    total: dict[str, int] = defaultdict(int)

    def rewritten(name: str) -> int:
        dumped = client.dump(name)
        if dumped is None:
            return 0
        client.restore(scratch, 0, dumped, replace=True)
        return int(client.memory_usage(scratch, samples=0) or 0)

    for sid in ids:
        keys = session_keys(prefix, sid)
        for kind in ("meta", "lease", "msgs", "pending", "keys", "ckpt"):
            total[kind] += rewritten(getattr(keys, kind))
        items = []
        for entry_id, fields in client.xrange(keys.log):
            for value in (entry_id.split(b"-")[0], fields.get(b"d", b""), fields.get(b"e", b"")):
                items.append(str(len(value)).encode() + b":" + value)
        if items:
            client.set(scratch, b"".join(items))
            total["rest"] += int(client.memory_usage(scratch, samples=0) or 0)
        lines = client.xrange(keys.ui)
        client.delete(scratch)
        if lines:
            texts = [fields[b"l"].decode().rsplit(',"epoch":', 1)[0] for _, fields in lines]
            epoch = int(json.loads(lines[0][1][b"l"])["epoch"])
            first = int(lines[0][0].split(b"-")[0])
            for mark in pack_lines(sid, epoch, first, texts):
                start, last, sha, _, z = mark.split(b":", 4)
                client.xadd(scratch, {"f": start, "z": z, "s": sha}, id=f"{last.decode()}-0")
            total["ui"] += rewritten(scratch)
    client.delete(scratch)
    return {kind: total[kind] / len(ids) for kind in SESSION_KEY_NAMES}


def layout(client: redis.Redis, prefix: str, sid: str) -> list[dict[str, Any]]:
    """One session's keys: kind, type, entries and bytes."""
    out = []
    for kind, name in zip(SESSION_KEY_NAMES, session_keys(prefix, sid).names):
        kind_type = client.type(name).decode()
        if kind_type == "none":
            continue
        entries = {"stream": client.xlen, "hash": client.hlen, "zset": client.zcard, "string": client.strlen,
                   "list": client.llen}[kind_type](name)
        out.append({"kind": kind, "type": kind_type, "entries": int(entries),
                    "bytes": int(client.memory_usage(name, samples=0) or 0)})
    return out


def index_bytes(client: redis.Redis, prefix: str) -> int:
    return sum(int(client.memory_usage(k, samples=0) or 0) for k in index_keys(prefix).names)


# ---------------------------------------------------------------------------- client


def client_agent(redis_url: str, prefix: str, model_url: str, concurrency: int) -> Any:
    """This process's agent `default` (the worker's tools): it prompts, decides and reads."""
    from fxworker import Agent, Settings
    from fxworker.celery_app import make_celery_app
    from fxworker.store import redis_store
    from fxworker.wakers import CeleryWaker
    from tests.durable.tooling import provider

    settings = Settings(redis_url=redis_url, prefix=prefix, lease_s=15.0)
    return Agent(
        "default", model="scripted", provider=provider(model_url), tools=bench_tools(), api_key="test-key",
        store=redis_store(redis_url, prefix=prefix, max_connections=2 * concurrency + 20),
        waker=CeleryWaker(make_celery_app(settings)), settings=settings,
    )


async def in_turn(items: list[Any], concurrency: int, one: Any) -> list[Any]:
    """`one(item)` for every item, `concurrency` at a time; the results in order."""
    out: list[Any] = [None] * len(items)
    queue = list(enumerate(items))[::-1]

    async def lane() -> None:
        while queue:
            i, item = queue.pop()
            out[i] = await one(item)

    await asyncio.gather(*(lane() for _ in range(min(concurrency, len(items)))))
    return out


async def make_idle(agent: Any, n: int, concurrency: int) -> list[str]:
    async def one(i: int) -> str:
        session = agent.session()
        result = await (await session.prompt(f"plain:{i}")).result()
        if result.stop_reason != "end_turn":
            raise RuntimeError(f"idle session {session.id}: its turn ended {result}")
        return str(session.id)

    return await in_turn(list(range(n)), concurrency, one)


async def make_parked(agent: Any, n: int, concurrency: int, first: int) -> list[tuple[str, str]]:
    """`n` parked sessions, prompted `refund:<first + i>`: (session id, the call waiting)."""
    async def one(i: int) -> tuple[str, str]:
        session = agent.session()
        result = await (await session.prompt(f"refund:{first + i}")).result()
        if result.stop_reason != "paused" or len(result.pending_calls) != 1:
            raise RuntimeError(f"session {session.id}: its turn ended {result}")
        return str(session.id), str(result.pending_calls[0]["id"])

    return await in_turn(list(range(n)), concurrency, one)


async def states(agent: Any, ids: list[str]) -> list[Any]:
    return await in_turn(ids, 100, agent.store.state)


async def wait_status(agent: Any, ids: list[str], status: str, timeout_s: float = 60.0) -> list[Any]:
    """The sessions' states once every one says `status` with no lease held."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await states(agent, ids)
        off = [s for s in got if s is None or s.status != status or s.lease_holder is not None]
        if not off:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(off)} of {len(ids)} sessions are not {status} after {timeout_s} s: {off[0]}")
        await asyncio.sleep(0.5)


def worker_held(worker: Any, metrics_port: int, app: Any) -> dict[str, Any]:
    """What the worker holds now: its `fx_turns_running` gauge, busy task threads
    (Celery inspect active; None when it did not answer) and its threads."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    running = next(float(line.split()[-1]) for line in body.splitlines() if line.startswith("fx_turns_running "))
    try:
        active = app.control.inspect(timeout=3.0).active()
        busy = None if not active else sum(len(tasks) for tasks in active.values())
    except Exception:  # noqa: BLE001 - the remote control is optional here
        busy = None
    threads = None
    for line in Path(f"/proc/{worker.pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            threads = int(line.split()[1])
    return {"turns_running": running, "busy_task_threads": busy, "threads": threads}


async def latencies(agent: Any, parked: list[tuple[str, str]], idle: list[str], tag: str = "lat"
                    ) -> list[dict[str, Any]]:
    """One approval then one prompt, each followed to its end, `len(parked)` times: the
    epoch seconds each call returned and its turn ended."""
    out = []
    for i, ((sid, call), idle_id) in enumerate(zip(parked, idle)):
        session = agent.session(sid)
        accepted = await session.approve(call)
        approved = time.time()
        result = await session.follow(accepted).result()
        approved_end = time.time()
        if result.stop_reason != "end_turn":
            raise RuntimeError(f"the approved turn of {sid} ended {result}")
        turn = await agent.session(idle_id).prompt(f"plain:{tag}{i}")
        prompted = time.time()
        result = await turn.result()
        prompted_end = time.time()
        if result.stop_reason != "end_turn":
            raise RuntimeError(f"the prompt of {idle_id} ended {result}")
        out.append({"session": sid, "approved": approved, "approved_end": approved_end, "idle": idle_id,
                    "prompt": f"plain:{tag}{i}", "prompted": prompted, "prompted_end": prompted_end})
    return out


# ---------------------------------------------------------------------------- the run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve-model", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=SESSIONS, help="idle sessions, and as many parked")
    parser.add_argument("--sample", type=int, default=SAMPLE, help="approvals (and as many prompts) timed")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="sessions prompted at once")
    parser.add_argument("--json", metavar="PATH", help="also write the figures and summary rows to PATH")
    args = parser.parse_args()
    if args.serve_model:
        serve_model()
        return 0
    if args.sample > args.sessions:
        parser.error("--sample is at most --sessions")

    from bench._harness import ModelProcess, new_prefix, start_worker
    from tests.support.redis_server import RedisServer, free_port

    started = time.monotonic()
    server = RedisServer()
    model = ModelProcess([__file__, "--serve-model"])
    prefix = new_prefix()
    metrics_port = free_port()
    worker = None
    agent = None
    try:
        worker = start_worker(server, prefix, model.base_url, env={
            "FX_AGENTS": "bench.parked", WORKER_ENV: "1", "FX_METRICS_PORT": str(metrics_port),
            "FX_METRICS_HOST": "127.0.0.1"})
        print(f"worker pid {worker.pid}, model server pid {model.proc.pid}, redis port {server.port}", flush=True)
        agent = client_agent(server.url, prefix, model.base_url, args.concurrency)
        data = run(args, server, agent, worker, metrics_port, prefix)
        agent.close()
        agent = None
        served = [(float(at), str(p), str(role)) for at, p, role in model.rows(60)]  # see `serve_model`
    finally:
        if agent is not None:
            agent.close()
        if worker is not None:
            worker.close()
        model.close()
        server.close()
    data["latency"] = latency_figures(data.pop("timed"), data.pop("tool_started"), served)
    data["s"] = time.monotonic() - started
    rows = report(args, data)
    from bench._harness import write_json

    write_json(args.json, "parked", rows, data)
    print(f"bench took {data['s']:.1f} s")
    return 0


def run(args: Any, server: Any, agent: Any, worker: Any, metrics_port: int, prefix: str) -> dict[str, Any]:
    from fxworker.agent import _loop

    loop = _loop()
    admin = redis.Redis.from_url(server.url)
    n = args.sessions
    data: dict[str, Any] = {"sessions": n, "sample": args.sample}
    # Warm up the worker and this process (its connection pool at full size too): plain
    # turns, parked ones approved to their end.
    warm = loop.run(make_parked(agent, 3, 3, 0), timeout_s=60)
    loop.run(latencies(agent, warm, loop.run(make_idle(agent, args.concurrency, args.concurrency), timeout_s=120),
                       tag="warm"), timeout_s=60)
    admin.delete(started_key(prefix))

    phases: dict[str, Any] = {}
    for phase in ("idle", "parked"):
        before = settled_memory(admin)
        index_before = index_bytes(admin, prefix)
        t0 = time.monotonic()
        if phase == "idle":
            ids = loop.run(make_idle(agent, n, args.concurrency), timeout_s=30 + n)
            calls: list[tuple[str, str]] = []
        else:
            calls = loop.run(make_parked(agent, n, args.concurrency, 1), timeout_s=30 + n)
            ids = [sid for sid, _ in calls]
        made_s = time.monotonic() - t0
        got = loop.run(wait_status(agent, ids, phase if phase == "idle" else "paused"), timeout_s=600)
        after = settled_memory(admin)
        held = worker_held(worker, metrics_port, agent.waker.app)
        index_after = index_bytes(admin, prefix)
        phases[phase] = {
            "ids": ids, "calls": calls, "made_s": made_s,
            "used_memory_per_session": (after - before) / n,
            "index_per_session": (index_after - index_before) / n,
            "keys": key_bytes(admin, prefix, ids),
            "rewritten": rewritten_bytes(admin, prefix, ids[:REWRITE_SAMPLE]),
            "as_at_rest": as_at_rest(admin, prefix, ids[:REWRITE_SAMPLE]) if phase == "parked" else None,
            "layout": layout(admin, prefix, ids[0]),
            "leases_held": sum(1 for s in got if s.lease_holder is not None),
            "statuses": dict(sorted(_count(s.status for s in got).items())),
            "paused_calls": sum(len(s.paused_calls) for s in got),
            "ready": int(admin.zcard(index_keys(prefix).ready)),
            "worker": held,
        }
        print(f"{phase}: {n:,} sessions made in {made_s:.1f} s ({n / made_s:.0f}/s); "
              f"used_memory {(after - before) / n:,.0f} B each", flush=True)

    data["phases"] = {k: {kk: vv for kk, vv in v.items() if kk not in ("ids", "calls")} for k, v in phases.items()}
    sample = args.sample
    t0 = time.monotonic()
    data["timed"] = loop.run(latencies(agent, phases["parked"]["calls"][:sample], phases["idle"]["ids"][:sample]),
                             timeout_s=60 + 5 * sample)
    data["timed_s"] = time.monotonic() - t0
    data["tool_started"] = [x.decode() for x in admin.lrange(started_key(prefix), 0, -1)]
    # The amount each timed session's refund carries: its index among the parked, from 1.
    data["amounts"] = {sid: i + 1 for i, (sid, _) in enumerate(phases["parked"]["calls"][:sample])}
    for row in data["timed"]:
        row["amount"] = data["amounts"][row["session"]]
    del data["amounts"]
    admin.close()
    return data


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for v in values:
        out[str(v)] += 1
    return out


def latency_figures(timed: list[dict[str, Any]], tool_started: list[str],
                    served: list[tuple[float, str, str]]) -> dict[str, Any]:
    """Per timed pair: approve() returned → the tool started, and prompt() returned → its
    model request arrived (ms), and each to its turn's end."""
    from bench._harness import pct

    started: dict[int, float] = {}
    for item in tool_started:
        amount, _, at = item.partition("|")
        started.setdefault(int(amount), float(at))
    arrived: dict[str, float] = {}
    for at_ms, prompt, role in served:
        if role == "user":
            arrived.setdefault(prompt, at_ms / 1000)
    approve_ms, prompt_ms, approve_end_ms, prompt_end_ms = [], [], [], []
    for row in timed:
        approve_ms.append((started[row["amount"]] - row["approved"]) * 1000)
        prompt_ms.append((arrived[row["prompt"]] - row["prompted"]) * 1000)
        approve_end_ms.append((row["approved_end"] - row["approved"]) * 1000)
        prompt_end_ms.append((row["prompted_end"] - row["prompted"]) * 1000)
    series = {"approve_to_tool_start": approve_ms, "prompt_to_model_request": prompt_ms,
              "approve_to_turn_end": approve_end_ms, "prompt_to_turn_end": prompt_end_ms}
    return {name: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "mean": sum(v) / len(v), "max": max(v), "n": len(v)}
            for name, v in series.items()}


def report(args: Any, data: dict[str, Any]) -> list[Any]:
    from bench._harness import Row, print_rows, ratio_row

    n = data["sessions"]
    idle, parked = data["phases"]["idle"], data["phases"]["parked"]
    idle_sum = sum(k["bytes"] for k in idle["keys"].values())
    parked_sum = sum(k["bytes"] for k in parked["keys"].values())
    idle_rw = sum(idle["rewritten"].values())
    parked_rw = sum(parked["rewritten"].values())
    parked_rest = sum(parked["as_at_rest"].values())

    print(f"\nRedis bytes per session, {n:,} idle then {n:,} parked (one Redis, same run):")
    print(f"  {'key':<8} {'idle':>9} {'(has)':>6} {'parked':>9} {'(has)':>6} {'parked-idle':>12}"
          f" {'idle rewritten':>15} {'parked rewritten':>17} {'parked as at rest':>18}")
    for kind in SESSION_KEY_NAMES:
        i, p = idle["keys"][kind], parked["keys"][kind]
        if not i["present"] and not p["present"] and not parked["as_at_rest"][kind]:
            continue
        print(f"  {kind:<8} {i['bytes']:>9,.0f} {i['present']:>6.0%} {p['bytes']:>9,.0f} {p['present']:>6.0%} "
              f"{p['bytes'] - i['bytes']:>12,.0f} {idle['rewritten'][kind]:>15,.0f} {parked['rewritten'][kind]:>17,.0f}"
              f" {parked['as_at_rest'][kind]:>18,.0f}")
    print(f"  {'keys':<8} {idle_sum:>9,.0f} {'':>6} {parked_sum:>9,.0f} {'':>6} {parked_sum - idle_sum:>12,.0f}"
          f" {idle_rw:>15,.0f} {parked_rw:>17,.0f} {parked_rest:>18,.0f}")
    print("  (has: the share of sessions with that key; rewritten: DUMP/RESTORE, each stream to its size;"
          " as at rest: the log as one `rest` string, the lines packed, the consumed inbox gone;"
          f" both over {min(REWRITE_SAMPLE, n)} sessions)")
    print(f"  index entries (ready, sessions): idle {idle['index_per_session']:,.0f} B, "
          f"parked {parked['index_per_session']:,.0f} B")
    print(f"  used_memory delta less client buffers / sessions: idle {idle['used_memory_per_session']:,.0f} B, "
          f"parked {parked['used_memory_per_session']:,.0f} B")
    for phase, p in (("idle", idle), ("parked", parked)):
        print(f"  one {phase} session: " + ", ".join(
            f"{k['kind']} {k['type']} {k['entries']} entries {k['bytes']:,} B" for k in p["layout"]))

    w = parked["worker"]
    print(f"\nafter parking {n:,}: statuses {parked['statuses']}, {parked['paused_calls']:,} calls waiting; "
          f"{parked['leases_held']} live leases; worker: fx_turns_running {w['turns_running']:.0f}, "
          f"busy task threads {w['busy_task_threads'] if w['busy_task_threads'] is not None else 'no answer'}, "
          f"{w['threads']} threads (after idling {n:,}: {idle['worker']['threads']}); "
          f"ready set {parked['ready']} sessions")

    lat = data["latency"]
    print(f"\nlatency, {args.sample} approvals interleaved with {args.sample} prompts of idle sessions (ms):")
    for name, v in lat.items():
        print(f"  {name:<26} p50 {v['p50']:7.1f}  p99 {v['p99']:7.1f}  mean {v['mean']:7.1f}  max {v['max']:7.1f}")

    item = "parked turns"
    rows: list[Row] = [
        ratio_row(item, "Redis bytes per parked session (used_memory delta / N)", parked["used_memory_per_session"],
                  "B", "idle session at rest, same run", idle["used_memory_per_session"], target=1.5, at_most=True,
                  note=f"{n:,} of each on one Redis"),
        ratio_row(item, "Redis bytes per parked session (MEMORY USAGE of its keys)", parked_sum, "B",
                  "idle session at rest, same run", idle_sum, target=1.5, at_most=True,
                  note="largest parked-idle: " + ", ".join(
                      f"{k} +{parked['keys'][k]['bytes'] - idle['keys'][k]['bytes']:,.0f} B" for k in sorted(
                          SESSION_KEY_NAMES, key=lambda k: idle["keys"][k]["bytes"] - parked["keys"][k]["bytes"])[:3])),
        ratio_row(item, "the same, each key rewritten to its size (DUMP/RESTORE)", parked_rw, "B",
                  "idle session rewritten", idle_rw, note=f"{min(REWRITE_SAMPLE, n)} sessions of each"),
        ratio_row(item, "the same, parked keys laid out as at rest (estimate)", parked_rest, "B",
                  "idle session rewritten", idle_rw,
                  note="log as a `rest` string, lines packed, consumed inbox gone; meta, lease, msgs, keys kept"),
        Row(item, f"live leases with {n:,} parked", parked["leases_held"], "leases", target="0",
            met=parked["leases_held"] == 0),
        Row(item, f"turns running in the worker with {n:,} parked", w["turns_running"], "turns", target="0",
            met=w["turns_running"] == 0,
            note=f"busy task threads {w['busy_task_threads']}, {w['threads']} threads, ready set {parked['ready']}"),
        ratio_row(item, "approve() returned to the tool's start, p50", lat["approve_to_tool_start"]["p50"], "ms",
                  "prompt() returned to its model request, p50", lat["prompt_to_model_request"]["p50"], target=2.0,
                  at_most=True, note=f"{args.sample} each, interleaved"),
        ratio_row(item, "approve() returned to the tool's start, p99", lat["approve_to_tool_start"]["p99"], "ms",
                  "prompt() returned to its model request, p99", lat["prompt_to_model_request"]["p99"]),
        ratio_row(item, "approve() returned to the turn's end, p50", lat["approve_to_turn_end"]["p50"], "ms",
                  "prompt() returned to the turn's end, p50", lat["prompt_to_turn_end"]["p50"],
                  note="the resumed turn: tool, then one model request"),
    ]
    print()
    print_rows(rows)
    return rows


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
