"""The Python API as a plain script, with no Redis and no worker started (§7, the embedded
mode): the first prompt starts an in-process worker, and the turn ends."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fxengine.testing import ScriptedModel

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from fxworker import Agent

    provider = {"name": "scripted", "base_url": sys.argv[1], "models": {"scripted": {}}}
    support = Agent(name="support", model="scripted", provider=provider, api_key="k",
                    instructions="Answer billing questions.")

    async def main():
        session = support.session()
        turn = await session.prompt("Where is order 42?")
        text = "".join([e["delta"] async for e in turn if e["type"] == "text_delta"])
        result = await turn.result()
        print(result.stop_reason, text)

    asyncio.run(main())
""")


def run_script(tmp_path: Path, source: str, *, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`source` run as a script with no Redis and no FX_ setting, against a scripted model."""
    with ScriptedModel() as model:
        (tmp_path / "script.py").write_text(source)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FX_") and k != "REDIS_URL"}
        env["PYTHONPATH"] = str(ROOT)
        return subprocess.run([sys.executable, "script.py", model.base_url], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=timeout_s)


def test_a_script_with_no_redis_runs_its_turn(tmp_path: Path) -> None:
    done = run_script(tmp_path, SCRIPT, timeout_s=10)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("end_turn "), (done.stdout, done.stderr[-2000:])


CLOSE_SCRIPT = textwrap.dedent("""
    import asyncio, sys, threading
    from fxworker import Agent
    from fxworker.embedded import embedded_workers
    from fxworker.store import _default_stores

    provider = {"name": "scripted", "base_url": sys.argv[1], "models": {"scripted": {}}}

    async def main():
        for round in (1, 2):  # closed, the next agent of the process starts afresh
            support = Agent(name="support", model="scripted", provider=provider, api_key="k")
            result = await (await support.session().prompt("hi")).result()
            print(round, result.stop_reason, len(embedded_workers()), len(_default_stores))
            support.close()
            print(round, "closed", len(embedded_workers()), len(_default_stores),
                  sorted(t.name for t in threading.enumerate() if t.name.startswith("fx-")))

    asyncio.run(main())
""")


def test_closing_the_last_agent_stops_its_worker_and_closes_the_store(tmp_path: Path) -> None:
    done = run_script(tmp_path, CLOSE_SCRIPT, timeout_s=20)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["1 end_turn 1 1", "1 closed 0 0 []", "2 end_turn 1 1", "2 closed 0 0 []"], (
        done.stdout, done.stderr[-2000:])
