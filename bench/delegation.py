"""Delegated calls (docs/design.md §6 "Delegated turns"): what a tool call that another
agent's turn answers (`Agent.as_tool()`) costs a turn, against the same call answered by a
local tool, in the same run.

Starts, each in its own process: a throwaway `redis-server`, the scripted model server
(``--serve-model``) and Celery workers (`-P threads -c 100`, deployment defaults) whose
agents module is this file:

- `billing`, no tools: its model answers ``billed <prompt>`` at once;
- `triage`, two tools its model calls the same way (``{input}``): `billing`
  (`billing.as_tool()`: a call parks the turn and prompts a `billing` turn in a session of
  its own, whose end answers it; the parent resumes on whichever worker takes its wake) and
  `billing_local` (idempotent, runs in the worker, answers ``billed <input>`` at once). Its
  model reads the prompt: ``d1:…`` calls `billing` once, ``l1:…`` `billing_local` once,
  ``d2:…`` / ``l2:…`` twice in one response (the two children run at once); once the
  results are in, it answers ``answer: <results>``.

This process is the client. Two shapes, one after the other, each with a key prefix and
workers of its own: `one`, one worker process consuming fx.triage and fx.billing; `split`,
one consuming fx.triage and another fx.billing (the production shape: the children run on
their agent's own workers). In each, after a warm-up:

1. ``--sample`` rounds of four turns, each in a new session and followed to its end
   (``d1``, ``l1``, ``d2``, ``l2``; the delegated and the local turn swap places every other
   round): from ``session.prompt()`` returning to ``turn.result()`` returning (the turn's
   ``turn_end`` read), p50 and p99, the delegated against the local; and where the time
   goes, from the model server's arrival times (the parent's first and second model
   request, each child's) and the parent's ``turn_pause`` (its ``atMs``, the worker's clock,
   when the engine parked). Each turn's lines are checked afterwards (the answer's text,
   one ``delegate_start`` a delegated call, none for a local one);
2. ``--count`` turns of each kind one after another, under MONITOR: the Redis commands
   per turn that clients sent (every process's: this one's prompt and follow, the
   workers' store calls, the broker's; a pipeline's commands each, a script one EVALSHA)
   and the commands Redis ran (INFO commandstats: the scripts' inner calls too), and the
   workers' CPU per turn, each less what as long idle costs (kombu's polls, the sweeper:
   ``IDLE_S`` measured the same way).

Run: ``.venv/bin/python bench/delegation.py [--sample 200] [--count 30] [--shapes one,split]
[--json PATH]`` (about 55 s at the defaults on 2 cores; ``--sample 50 --count 20``, as
bench/run_all.py runs it, about 30 s).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SAMPLE = 200
COUNT = 30
WARM = 10  # untimed rounds first, in each shape
IDLE_S = 5.0  # the idle window whose commands and CPU are taken off the counted batches (one sweep)
WORKER_ENV = "FX_BENCH_DELEGATION_WORKER"  # set in the workers: this module makes their agents
KINDS = ("d1", "l1", "d2", "l2")
SWAPPED = ("l1", "d1", "l2", "d2")
SHAPES = {"one": (("triage", "billing"),), "split": (("triage",), ("billing",))}
SHAPE_NOTES = {"one": "one worker process, fx.triage and fx.billing",
               "split": "billing on a second worker process"}
BILLING = "You are billing."
TRIAGE = "You are triage."


# ---------------------------------------------------------------------------- the agents


async def _billing_local(input: dict[str, Any], ctx: Any) -> str:
    """`billing_local`: what a `billing` turn would answer, at once, in the worker."""
    return f"billed {input.get('input', '')}"


def make_agents(model_url: str, **common: Any) -> dict[str, Any]:
    """`billing` and `triage` (see the module's docstring); `common`: the client's store,
    waker and settings (a worker's come from its environment)."""
    from fxengine.tools import Tool
    from fxworker import Agent
    from tests.durable.tooling import provider

    kw: dict[str, Any] = dict(model="scripted", provider=provider(model_url), api_key="test-key", **common)
    billing = Agent("billing", instructions=BILLING, **kw)
    delegated = billing.as_tool()
    local = Tool("billing_local", "Hands a task to billing's code and returns its answer.",
                 dict(delegated.input_schema), idempotent=True, execute=_billing_local)
    triage = Agent("triage", instructions=TRIAGE, tools=[delegated, local], **kw)
    return {"triage": triage, "billing": billing}


if os.environ.get(WORKER_ENV):  # imported as the workers' FX_AGENTS
    AGENTS = make_agents(os.environ["FX_TEST_MODEL_URL"])


# ---------------------------------------------------------------------------- model server


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return str(content or "")


def _read(messages: list[dict[str, Any]]) -> tuple[str, str, list[str]]:
    """(the agent, the turn's prompt, the tool results after it) of a chat request."""
    system = next((_content(m) for m in messages if m.get("role") == "system"), "")
    who = "billing" if BILLING in system else "triage"
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return who, _content(messages[i]), [_content(m) for m in messages[i + 1:] if m.get("role") == "tool"]
    return who, "", []


def serve_model() -> None:
    """The model server process: prints its base URL, serves until stdin closes, then
    prints `[arrival epoch ms, agent, prompt, tool results shown]` of every chat request as
    one JSON line."""
    from fxengine.testing import Reply, ScriptedModel, text, tool_call

    def respond(request: Any) -> Reply:
        who, prompt, results = _read(request.body.get("messages") or [])
        if who == "billing":
            return Reply(text(f"billed {prompt}"))
        if results:
            return Reply(text("answer: " + " + ".join(results)))
        kind = prompt.partition(":")[0]
        tool = "billing" if kind.startswith("d") else "billing_local"
        return Reply(*[tool_call(f"call_{uuid.uuid4().hex[:24]}", tool, {"input": f"{prompt}/{x}"})
                       for x in "ab"[:2 if kind.endswith("2") else 1]])

    with ScriptedModel(responder=respond) as model:
        print(model.base_url, flush=True)
        sys.stdin.read()
        served = []
        for r in model.requests:
            if r.path.endswith("/chat/completions"):
                who, prompt, results = _read(r.body.get("messages") or [])
                served.append([r.at_ms, who, prompt, len(results)])
        print(json.dumps(served), flush=True)


# ---------------------------------------------------------------------------- client


def client_agents(redis_url: str, prefix: str, model_url: str) -> dict[str, Any]:
    """This process's `triage` and `billing` on the shape's prefix: it prompts and reads."""
    from fxworker import Settings
    from fxworker.celery_app import make_celery_app
    from fxworker.store import redis_store
    from fxworker.wakers import CeleryWaker

    settings = Settings(redis_url=redis_url, prefix=prefix, lease_s=15.0)
    return make_agents(model_url, store=redis_store(redis_url, prefix=prefix),
                       waker=CeleryWaker(make_celery_app(settings)), settings=settings)


async def one_turn(agent: Any, prompt: str) -> dict[str, Any]:
    """A new session prompted `prompt`, followed to its end: the epoch seconds its prompt()
    returned and its result() did."""
    session = agent.session()
    turn = await session.prompt(prompt)
    prompted = time.time()
    result = await turn.result()
    ended = time.time()
    if result.stop_reason != "end_turn":
        raise RuntimeError(f"{prompt} ({session.id}) ended {result}")
    return {"kind": prompt.partition(":")[0], "prompt": prompt, "session": str(session.id), "prompted": prompted,
            "ended": ended}


async def rounds(agent: Any, n: int, tag: str) -> list[dict[str, Any]]:
    """`n` rounds of the four kinds, one turn at a time."""
    out = []
    for i in range(n):
        for kind in KINDS if i % 2 == 0 else SWAPPED:
            out.append(await one_turn(agent, f"{kind}:{tag}:{i}"))
    return out


async def batch(agent: Any, kind: str, n: int, tag: str) -> None:
    for i in range(n):
        await one_turn(agent, f"{kind}:{tag}:{i}")


async def check_lines(agent: Any, rows: list[dict[str, Any]]) -> None:
    """Each timed turn's lines, read back: its pause's `atMs` (delegated), and that it did
    what its kind says (the answer's text; a `delegate_start` per delegated call)."""
    for row in rows:
        kinds: dict[str, int] = defaultdict(int)
        text = ""
        row["pause_at"] = None
        async for line in agent.session(row["session"]).stream(0, follow=False):
            kinds[line["type"]] += 1
            if line["type"] == "turn_pause" and row["pause_at"] is None and line.get("atMs"):
                row["pause_at"] = line["atMs"] / 1000
            elif line["type"] == "text_delta":
                text += line["delta"]
        calls = 2 if row["kind"].endswith("2") else 1
        answered = text.startswith("answer: ") and all(f"billed {row['prompt']}/{x}" in text for x in "ab"[:calls])
        delegated = row["kind"].startswith("d")
        if not answered or kinds["delegate_start"] != (calls if delegated else 0) or kinds["turn_end"] != 1:
            raise RuntimeError(f"{row['prompt']} ({row['session']}): text {text!r}, lines {dict(kinds)}")


# ---------------------------------------------------------------------------- counts


def counted(redis_url: str, run: Any, workers: list[Any]) -> dict[str, Any]:
    """While `run()` runs (and the monitor's tail): the commands clients sent, by name
    (MONITOR, scripts' inner calls apart), the commands Redis ran (commandstats), the
    workers' CPU seconds, and how long it took."""
    from bench._harness import calls_delta, commandstats, cpu_s, monitor

    admin = redis.Redis.from_url(redis_url)
    stats = commandstats(admin)
    cpu = sum(cpu_s(w.pid) for w in workers)
    t0 = time.monotonic()
    seen = monitor(redis_url, run)
    took = time.monotonic() - t0
    cpu = sum(cpu_s(w.pid) for w in workers) - cpu
    ran = calls_delta(stats, commandstats(admin))
    admin.close()
    sent: dict[str, int] = defaultdict(int)
    for address, command in seen:
        if not address.startswith("lua"):
            sent[command.upper()] += 1
    return {"s": took, "sent": dict(sent), "ran": ran, "cpu_s": cpu}


def per_turn(got: dict[str, Any], idle: dict[str, Any], n: int) -> dict[str, Any]:
    """A counted batch of `n` turns, per turn, less the idle rate over as long."""
    share = got["s"] / idle["s"]

    def net(a: dict[str, int], b: dict[str, int]) -> dict[str, float]:
        return {k: (a.get(k, 0) - share * b.get(k, 0)) / n for k in sorted(set(a) | set(b))}

    sent, ran = net(got["sent"], idle["sent"]), net(got["ran"], idle["ran"])
    return {"sent": sum(sent.values()), "ran": sum(ran.values()),
            "cpu_ms": (got["cpu_s"] - share * idle["cpu_s"]) / n * 1000, "sent_by_command": sent,
            "ran_by_command": ran, "s_per_turn": got["s"] / n}


# ---------------------------------------------------------------------------- the run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve-model", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sample", type=int, default=SAMPLE, help="rounds timed (a turn of each kind a round)")
    parser.add_argument("--count", type=int, default=COUNT, help="turns of each kind counted under MONITOR (0: none)")
    parser.add_argument("--shapes", default="one,split", help="comma-separated: " + ",".join(SHAPES))
    parser.add_argument("--json", metavar="PATH", help="also write the figures and summary rows to PATH")
    args = parser.parse_args()
    if args.serve_model:
        serve_model()
        return 0
    shapes = [s for s in args.shapes.split(",") if s]
    if not shapes or any(s not in SHAPES for s in shapes):
        parser.error(f"--shapes: some of {', '.join(SHAPES)}")

    from bench._harness import ModelProcess
    from tests.support.redis_server import RedisServer

    started = time.monotonic()
    server = RedisServer()
    model = ModelProcess([__file__, "--serve-model"])
    data: dict[str, Any] = {"sample": args.sample, "count": args.count, "shapes": {}}
    try:
        print(f"model server pid {model.proc.pid}, redis port {server.port}", flush=True)
        for shape in shapes:
            data["shapes"][shape] = run_shape(shape, args, server, model.base_url)
        served = [(float(at), str(who), str(p), int(n)) for at, who, p, n in model.rows(60)]  # see `serve_model`
    finally:
        model.close()
        server.close()
    for shape in shapes:
        got = data["shapes"][shape]
        got["latency"] = latency_figures(got.pop("timed"), served)
    data["s"] = time.monotonic() - started
    rows = report(args, data)
    from bench._harness import write_json

    write_json(args.json, "delegation", rows, data)
    print(f"bench took {data['s']:.1f} s")
    return 0


def run_shape(shape: str, args: Any, server: Any, model_url: str) -> dict[str, Any]:
    from bench._harness import new_prefix, start_worker
    from fxworker.agent import _loop

    loop = _loop()
    prefix = new_prefix()
    workers: list[Any] = []
    agents: dict[str, Any] = {}
    out: dict[str, Any] = {}
    try:
        for queues in SHAPES[shape]:
            workers.append(start_worker(server, prefix, model_url, queues=queues,
                                        env={"FX_AGENTS": "bench.delegation", WORKER_ENV: "1"}))
        print(f"{shape}: workers " + ", ".join(f"pid {w.pid} ({'+'.join(w.queues)})" for w in workers), flush=True)
        agents = client_agents(server.url, prefix, model_url)
        triage = agents["triage"]
        loop.run(rounds(triage, WARM, f"{shape}-warm"), timeout_s=120)
        t0 = time.monotonic()
        timed = loop.run(rounds(triage, args.sample, shape), timeout_s=60 + 4 * args.sample)
        out["timed_s"] = time.monotonic() - t0
        loop.run(check_lines(triage, timed), timeout_s=60 + args.sample)
        out["timed"] = timed
        print(f"{shape}: {args.sample} rounds of {len(KINDS)} turns in {out['timed_s']:.1f} s", flush=True)
        if args.count:
            time.sleep(0.5)  # the last turn's release
            idle = counted(server.url, lambda: time.sleep(IDLE_S), workers)
            out["idle"] = {"s": idle["s"], "sent_per_s": sum(idle["sent"].values()) / idle["s"],
                           "ran_per_s": sum(idle["ran"].values()) / idle["s"], "cpu_per_s": idle["cpu_s"] / idle["s"]}
            out["counts"] = {}
            for kind in KINDS:
                got = counted(server.url, lambda k=kind: loop.run(batch(triage, k, args.count, f"{shape}-count"),
                                                                    timeout_s=60 + 2 * args.count), workers)
                out["counts"][kind] = per_turn(got, idle, args.count)
    finally:
        for agent in agents.values():
            agent.close()
        for w in workers:
            w.close()
    return out


def latency_figures(timed: list[dict[str, Any]], served: list[tuple[float, str, str, int]]) -> dict[str, Any]:
    """Per kind, ms: prompt() returned → the turn's end, and its segments (the model
    server's arrival times; a delegated turn's pause)."""
    from bench._harness import pct

    first: dict[str, float] = {}
    second: dict[str, float] = {}
    child: dict[str, float] = {}
    for at_ms, who, prompt, results in served:
        at = at_ms / 1000
        if who == "billing":
            child.setdefault(prompt, at)
        else:
            (second if results else first).setdefault(prompt, at)
    series: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in timed:
        p, s = row["prompt"], series[row["kind"]]
        t1, t2 = first[p], second[p]
        s["prompt_to_end"].append((row["ended"] - row["prompted"]) * 1000)
        s["prompt_to_first_request"].append((t1 - row["prompted"]) * 1000)
        if row["kind"].startswith("d"):
            children = [child[f"{p}/{x}"] for x in "ab"[:2 if row["kind"].endswith("2") else 1]]
            pause = row["pause_at"]
            s["first_request_to_pause"].append((pause - t1) * 1000)
            s["pause_to_child_request"].append((min(children) - pause) * 1000)
            if len(children) > 1:
                s["child_request_spread"].append((max(children) - min(children)) * 1000)
            s["child_request_to_second_request"].append((t2 - max(children)) * 1000)
        else:
            s["first_request_to_second_request"].append((t2 - t1) * 1000)
        s["second_request_to_end"].append((row["ended"] - t2) * 1000)
    return {kind: {name: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "mean": sum(v) / len(v), "max": max(v),
                          "n": len(v)} for name, v in s.items()} for kind, s in series.items()}


SEGMENTS = [
    ("prompt_to_first_request", "prompt() returned -> the parent's first model request"),
    ("first_request_to_pause", "  -> the parent parks (turn_pause atMs)"),
    ("pause_to_child_request", "  -> the (first) child's model request"),
    ("child_request_spread", "  the second child's request after the first"),
    ("child_request_to_second_request", "  (last) child's request -> the parent's second request"),
    ("first_request_to_second_request", "  -> the parent's second request (the local tool ran)"),
    ("second_request_to_end", "  -> turn_end read by the client"),
    ("prompt_to_end", "prompt() returned -> the turn's end"),
]


def report(args: Any, data: dict[str, Any]) -> list[Any]:
    from bench._harness import Row, print_rows, ratio_row

    rows: list[Row] = []
    item = "delegation"
    for shape, got in data["shapes"].items():
        lat = got["latency"]
        print(f"\n{shape} ({SHAPE_NOTES[shape]}): {args.sample} rounds, turns interleaved, ms (p50 / p99):")
        print(f"  {'':<58}" + "".join(f"{k:>17}" for k in KINDS))
        for name, label in SEGMENTS:
            cells = [f"{lat[k][name]['p50']:7.1f} /{lat[k][name]['p99']:7.1f}" if name in lat[k] else "" for k in KINDS]
            print(f"  {label:<58}" + "".join(f"{c:>17}" for c in cells))
        for a, b in (("d1", "l1"), ("d2", "l2")):
            print(f"  {a}/{b}: p50 {lat[a]['prompt_to_end']['p50'] / lat[b]['prompt_to_end']['p50']:.2f}x, "
                  f"p99 {lat[a]['prompt_to_end']['p99'] / lat[b]['prompt_to_end']['p99']:.2f}x")
        counts = got.get("counts")
        if counts:
            idle = got["idle"]
            print(f"  per turn, {args.count} turns of each kind, less idle ({idle['sent_per_s']:.1f} commands sent/s, "
                  f"{idle['ran_per_s']:.1f} run/s, {idle['cpu_per_s'] * 1000:.1f} ms CPU/s):")
            print(f"  {'':<58}" + "".join(f"{k:>17}" for k in KINDS))
            for key, label in (("sent", "Redis commands sent (MONITOR)"), ("ran", "Redis commands run (commandstats)"),
                               ("cpu_ms", "workers' CPU ms")):
                print(f"  {label:<58}" + "".join(f"{counts[k][key]:>17.1f}" for k in KINDS))
            extra = {c: counts["d1"]["sent_by_command"].get(c, 0) - counts["l1"]["sent_by_command"].get(c, 0)
                     for c in set(counts["d1"]["sent_by_command"]) | set(counts["l1"]["sent_by_command"])}
            top = sorted(extra.items(), key=lambda kv: -abs(kv[1]))[:8]
            print("  d1 - l1, commands sent per turn: " + ", ".join(f"{c} {v:+.1f}" for c, v in top))
        note = f"{args.sample} each, interleaved; {SHAPE_NOTES[shape]}"
        d1, l1, d2, l2 = (lat[k]["prompt_to_end"] for k in KINDS)
        rows += [
            ratio_row(item, f"{shape}: one delegated call, prompt() to the turn's end, p50", d1["p50"], "ms",
                      "one local call, same turn, p50", l1["p50"], note=note),
            ratio_row(item, f"{shape}: one delegated call, prompt() to the turn's end, p99", d1["p99"], "ms",
                      "one local call, same turn, p99", l1["p99"]),
            ratio_row(item, f"{shape}: two delegated calls at once, prompt() to the turn's end, p50", d2["p50"], "ms",
                      "two local calls, p50", l2["p50"]),
            ratio_row(item, f"{shape}: two delegated calls at once, prompt() to the turn's end, p99", d2["p99"], "ms",
                      "two local calls, p99", l2["p99"]),
        ]
        if counts:
            rows += [
                ratio_row(item, f"{shape}: Redis commands sent per turn, one delegated call", counts["d1"]["sent"],
                          "commands", "one local call", counts["l1"]["sent"],
                          note=f"MONITOR, every process; less idle; {args.count} turns each"),
                ratio_row(item, f"{shape}: Redis commands sent per turn, two delegated calls", counts["d2"]["sent"],
                          "commands", "two local calls", counts["l2"]["sent"]),
                ratio_row(item, f"{shape}: Redis commands run per turn, one delegated call", counts["d1"]["ran"],
                          "commands", "one local call", counts["l1"]["ran"], note="INFO commandstats: scripts' calls too"),
                ratio_row(item, f"{shape}: workers' CPU per turn, one delegated call", counts["d1"]["cpu_ms"], "ms",
                          "one local call", counts["l1"]["cpu_ms"]),
            ]
    print()
    print_rows(rows)
    return rows


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
