"""Peers side by side: the same scripted two-step tool turn on the openai-agents SDK with its
`RedisSession`, on LangGraph with its in-memory checkpointer, on pydantic-ai made durable by
DBOS (its workflows in a throwaway PostgreSQL database), and on fxworker (a Celery worker,
the Redis store), compared on steps per second and on what survives a kill -9.

Starts a throwaway `redis-server`, the scripted model server (bench/_model.py, its own
process) and one fxworker Celery worker. The turn: the model asks for `lookup`, the tool
answers, the model answers (two model steps). The peers run in this process, as they are
meant to (`Runner.run_streamed` with a `RedisSession`; `create_react_agent` on a streaming
`ChatOpenAI` with an `InMemorySaver`), against the same model server.

- steps/s: `--turns` turns one after another, each on a new session/thread, 2 steps each;
- kill -9: each peer runs one turn in a child process whose second model request holds
  (the tool has run, the answer has not come); the child is killed -9, and a new process
  looks at what is stored for that session/thread. Neither resumes the turn by itself:
  `RedisSession` keeps the items saved before the kill (the app can start a run with no new
  input on them), the in-memory checkpointer keeps nothing (the user's retry runs the turn,
  its tool included, anew). DBOS recovers the workflow when a process of the same
  application launches again (its tool step's output kept). fxworker's kill -9
  (bench/failover.py) resumes the turn on another worker from its journal, the tool result
  kept.

The DBOS peer needs PostgreSQL at `FX_BENCH_POSTGRES_URL` (default
``postgresql://postgres:postgres@127.0.0.1:5432/postgres``); each run makes and drops a
database of its own.

Needs the `bench` extra (``pip install -e '.[bench]'``); a peer that does not import is
reported as not run. Run: ``.venv/bin/python bench/peers.py [--turns 30] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._harness import (  # noqa: E402
    ModelProcess,
    Row,
    add_json_arg,
    client_agent,
    new_prefix,
    print_rows,
    ratio_row,
    start_worker,
    write_json,
)
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import wait_until  # noqa: E402

STEPS_PER_TURN = 2


def tool_runs_key(tag: str) -> str:
    return f"fxbench:peer:tool:{tag}"


def make_lookup(redis_url: str) -> Any:
    """The `lookup` tool: answers `found:<q>` and counts its runs in Redis (per q)."""
    client = redis.Redis.from_url(redis_url)

    def lookup(q: str) -> str:
        """Looks something up."""
        client.incr(tool_runs_key(q))
        return f"found:{q}"

    return lookup


# ---------------------------------------------------------------------------- openai-agents


def openai_agents_agent(model_url: str, redis_url: str) -> Any:
    from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=model_url, api_key="bench-key", max_retries=0, timeout=30)
    return Agent(name="bench", instructions="Use the tools.", tools=[function_tool(make_lookup(redis_url))],
                 model=OpenAIChatCompletionsModel(model="scripted", openai_client=client))


async def openai_agents_turn(agent: Any, redis_url: str, session_id: str, prompt: str | list[Any]) -> str:
    from agents import Runner
    from agents.extensions.memory import RedisSession

    session = RedisSession.from_url(session_id, url=redis_url)
    try:
        result = Runner.run_streamed(agent, prompt, session=session)  # streamed, as fxworker's turns are
        async for _ in result.stream_events():
            pass
        return str(result.final_output)
    finally:
        await session.close()


async def openai_agents_items(redis_url: str, session_id: str) -> list[dict[str, Any]]:
    from agents.extensions.memory import RedisSession

    session = RedisSession.from_url(session_id, url=redis_url)
    try:
        return [dict(i) for i in await session.get_items()]
    finally:
        await session.close()


# ---------------------------------------------------------------------------- LangGraph


def langgraph_graph(model_url: str, redis_url: str) -> Any:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ChatOpenAI(model="scripted", base_url=model_url, api_key="bench-key", max_retries=0, streaming=True,
                           timeout=30)
        return create_react_agent(model, [tool(make_lookup(redis_url))], checkpointer=InMemorySaver())


def langgraph_turn(graph: Any, thread_id: str, prompt: str) -> str:
    out = graph.invoke({"messages": [("user", prompt)]}, {"configurable": {"thread_id": thread_id}})
    return str(out["messages"][-1].content)


# ---------------------------------------------------------------------------- DBOS + pydantic-ai


def postgres_url(database: str) -> str:
    base = os.environ.get("FX_BENCH_POSTGRES_URL", "postgresql://postgres:postgres@127.0.0.1:5432/postgres")
    return base.rsplit("/", 1)[0] + f"/{database}"


def dbos_turn_workflow(model_url: str, redis_url: str, database: str) -> Any:
    """Launches DBOS on `database` with one pydantic-ai agent; returns the workflow that runs
    a turn (its id the session's)."""
    from dbos import DBOS
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.dbos import DBOSDurability
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    DBOS(config={"name": "fxbench", "system_database_url": postgres_url(database), "log_level": "WARNING"})
    model = OpenAIChatModel("scripted", provider=OpenAIProvider(base_url=model_url, api_key="bench-key"))
    agent = Agent(model, name="bench", tools=[make_lookup(redis_url)], instructions="Use the tools.",
                  capabilities=[DBOSDurability()])

    @DBOS.workflow(name="fxbench_turn")
    async def turn(prompt: str) -> str:
        return str((await agent.run(prompt)).output)

    DBOS.launch()
    return turn


async def dbos_turn(workflow: Any, session_id: str, prompt: str) -> str:
    from dbos import SetWorkflowID

    with SetWorkflowID(session_id):
        return str(await workflow(prompt))


def drop_database(database: str) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres_url("postgres"), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
    finally:
        engine.dispose()


# ---------------------------------------------------------------------------- one peer's kill -9


def victim(peer: str, model_url: str, redis_url: str, tag: str, database: str = "") -> None:
    """The child process of a kill -9 run: one turn whose second model request holds."""
    prompt = f"hold:{tag}"
    if peer == "dbos":
        asyncio.run(dbos_turn(dbos_turn_workflow(model_url, redis_url, database), tag, prompt))
    elif peer == "openai-agents":
        asyncio.run(openai_agents_turn(openai_agents_agent(model_url, redis_url), redis_url, tag, prompt))
    else:
        langgraph_turn(langgraph_graph(model_url, redis_url), tag, prompt)


def kill_run(peer: str, model_url: str, redis_url: str, database: str = "") -> dict[str, Any]:
    """Kills a peer -9 after its tool ran; what a new process finds and does next."""
    tag = f"{peer.replace('-', '')}kill{os.getpid()}"
    client = redis.Redis.from_url(redis_url)
    child = subprocess.Popen([sys.executable, __file__, "--victim", peer, "--model-url", model_url,
                              "--redis-url", redis_url, "--tag", tag, "--database", database],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: client.get(tool_runs_key(tag)), 60, what=f"{peer}'s tool run")
        time.sleep(0.5)  # its second model request is in and held
        child.kill()
        child.wait(10)
        out: dict[str, Any] = {"tool_runs_before": int(client.get(tool_runs_key(tag)) or 0)}
        # A new process: what is stored for that session, and a new prompt of the same session.
        if peer == "dbos":
            out.update(dbos_after_kill(model_url, redis_url, database, tag))
        elif peer == "openai-agents":
            items = asyncio.run(openai_agents_items(redis_url, tag))
            out["stored_items"] = len(items)
            out["tool_result_stored"] = any(i.get("type") == "function_call_output" for i in items)
            # Continued by hand: a run with no new input on the stored history.
            try:
                answer = asyncio.run(openai_agents_turn(openai_agents_agent(model_url, redis_url), redis_url, tag, []))
                out["continued_by_hand"] = f"a run with no new input answered {answer!r}"
            except Exception as e:  # noqa: BLE001 - what the SDK says is the finding
                out["continued_by_hand"] = f"a run with no new input failed: {type(e).__name__}"
        else:
            graph = langgraph_graph(model_url, redis_url)
            state = graph.get_state({"configurable": {"thread_id": tag}})
            messages = (state.values or {}).get("messages", [])
            out["stored_items"] = len(messages)
            out["tool_result_stored"] = any(getattr(m, "type", "") == "tool" for m in messages)
            langgraph_turn(graph, tag, f"tool:0:{tag}")  # the user's retry: a new turn from nothing
            out["continued_by_hand"] = "nothing to continue from; the retry ran the turn anew"
        out["tool_runs_after_rerun"] = int(client.get(tool_runs_key(tag)) or 0)
        out.setdefault("resumed_mid_turn", False)  # only DBOS continues an interrupted run (at a relaunch)
        return out
    finally:
        if child.poll() is None:
            child.kill()
        client.close()


def dbos_after_kill(model_url: str, redis_url: str, database: str, tag: str) -> dict[str, Any]:
    """A new process of the same DBOS application: its launch recovers the killed workflow."""
    script = (
        "import asyncio, json, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from bench.peers import dbos_turn_workflow\n"
        "from dbos import DBOS\n"
        f"dbos_turn_workflow({model_url!r}, {redis_url!r}, {database!r})\n"
        f"handle = DBOS.retrieve_workflow({tag!r})\n"
        "print(json.dumps({'answer': handle.get_result(), 'steps': len(DBOS.list_workflow_steps(handle.workflow_id))}))\n"
        "DBOS.destroy()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return {"stored_items": 0, "tool_result_stored": False, "resumed_mid_turn": False,
                "continued_by_hand": f"the relaunch failed: {done.stderr.strip().splitlines()[-1:]}"}
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {"stored_items": found["steps"], "tool_result_stored": True, "resumed_mid_turn": True,
            "continued_by_hand": f"recovered at the relaunch, answered {found['answer']!r}"}


# ---------------------------------------------------------------------------- steps/s


def steps_per_s(run_turn: Any, turns: int) -> float:
    for i in range(3):
        run_turn(f"warm{i}")
    start = time.perf_counter()
    for i in range(turns):
        run_turn(f"t{i}")
    return turns * STEPS_PER_TURN / (time.perf_counter() - start)


def fxworker_steps(server: RedisServer, model: ModelProcess, turns: int) -> float:
    from fxworker.agent import _loop

    prefix = new_prefix()
    worker = start_worker(server, prefix, model.base_url)
    agent = client_agent(server.url, prefix, model.base_url)

    async def turn(tag: str) -> None:
        result = await (await agent.session().prompt(f"tool:0:fx{tag}")).result()
        if result.stop_reason != "end_turn":
            raise RuntimeError(f"fxworker turn {tag} ended {result}")

    try:
        return steps_per_s(lambda tag: _loop().run(turn(tag), timeout_s=30), turns)
    finally:
        agent.close()
        worker.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--victim", help=argparse.SUPPRESS)
    parser.add_argument("--model-url", help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--tag", help=argparse.SUPPRESS)
    parser.add_argument("--database", default="", help=argparse.SUPPRESS)
    add_json_arg(parser)
    args = parser.parse_args()
    if args.victim:
        victim(args.victim, args.model_url, args.redis_url, args.tag, args.database)
        return 0

    server = RedisServer()
    model = ModelProcess()
    data: dict[str, Any] = {"turns": args.turns, "peers": {}}
    try:
        data["fxworker"] = {"steps_per_s": fxworker_steps(server, model, args.turns)}
        print(f"fxworker (1 Celery worker, Redis store): {data['fxworker']['steps_per_s']:.1f} steps/s")
        for peer in ("openai-agents", "langgraph", "dbos"):
            database = f"fxbench_{os.getpid()}_{peer.replace('-', '')}"
            try:
                if peer == "dbos":
                    workflow = dbos_turn_workflow(model.base_url, server.url, database)
                    loop = asyncio.new_event_loop()

                    def run_turn(tag: str, workflow: Any = workflow, loop: Any = loop) -> None:
                        loop.run_until_complete(dbos_turn(workflow, f"db{tag}", f"tool:0:db{tag}"))
                elif peer == "openai-agents":
                    agent = openai_agents_agent(model.base_url, server.url)
                    loop = asyncio.new_event_loop()

                    def run_turn(tag: str, agent: Any = agent, loop: Any = loop) -> None:
                        loop.run_until_complete(openai_agents_turn(agent, server.url, f"oa{tag}", f"tool:0:oa{tag}"))
                else:
                    graph = langgraph_graph(model.base_url, server.url)

                    def run_turn(tag: str, graph: Any = graph) -> None:
                        langgraph_turn(graph, f"lg{tag}", f"tool:0:lg{tag}")

                rate = steps_per_s(run_turn, args.turns)
                if peer == "dbos":
                    from dbos import DBOS

                    DBOS.destroy()  # the kill run's processes are the application now
                killed = kill_run(peer, model.base_url, server.url, database)
                data["peers"][peer] = {"steps_per_s": rate, "kill": killed}
                print(f"{peer}: {rate:.1f} steps/s; after kill -9 with the tool run and the answer pending: "
                      f"{json.dumps(killed)}")
            except ImportError as e:
                data["peers"][peer] = {"error": f"not installed: {e}"}
                print(f"{peer}: not run ({e}); install the bench extra")
            except Exception as e:  # noqa: BLE001 - DBOS without a PostgreSQL to run on
                if peer != "dbos":
                    raise
                data["peers"][peer] = {"error": f"did not run: {type(e).__name__}: {str(e)[:200]}"}
                print(f"{peer}: not run ({e}); it needs PostgreSQL at FX_BENCH_POSTGRES_URL")
            finally:
                if peer == "dbos":
                    try:
                        drop_database(database)
                    except Exception as e:  # noqa: BLE001 - no PostgreSQL here: said in the row
                        print(f"dropping {database} failed: {e}")
    finally:
        model.close()
        server.close()

    rows: list[Row] = []
    fx = data["fxworker"]["steps_per_s"]
    stores = {"openai-agents": "RedisSession", "langgraph": "InMemorySaver", "dbos": "pydantic-ai on DBOS, PostgreSQL"}
    for peer, got in data["peers"].items():
        name = f"{peer} ({stores[peer]}, in-process)"
        if "error" in got:
            rows.append(Row("7 peers", f"{name} steps/s", float("nan"), "steps/s", note=got["error"]))
            continue
        rows.append(ratio_row("7 peers", "fxworker durable steps/s (Celery worker + Redis)", fx, "steps/s",
                              f"{name}", got["steps_per_s"]))
        k = got["kill"]
        rows.append(Row("7 peers", f"{peer} after kill -9 mid-turn: items stored", k["stored_items"], "items",
                        note=f"tool result kept: {'yes' if k['tool_result_stored'] else 'no'}; "
                        f"resumed by itself: {'yes' if k['resumed_mid_turn'] else 'no'}; "
                        f"{k['continued_by_hand']}; tool runs in all {k['tool_runs_after_rerun']}"))
    rows.append(Row("7 peers", "fxworker after kill -9 mid-turn", 1.0, "resumed",
                    note="resumes on another worker from its journal, tool result kept (item 6)"))
    print_rows(rows)
    write_json(args.json, "peers", rows, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
