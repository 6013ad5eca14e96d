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


def test_a_script_with_no_redis_runs_its_turn(tmp_path: Path) -> None:
    with ScriptedModel() as model:
        (tmp_path / "script.py").write_text(SCRIPT)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FX_") and k != "REDIS_URL"}
        env["PYTHONPATH"] = str(ROOT)
        done = subprocess.run([sys.executable, "script.py", model.base_url], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("end_turn "), (done.stdout, done.stderr[-2000:])
