"""Each example app runs as its docstring says, offline: no Redis (the turn runs in the
app's process) and no key (the scripted model), one request answered over loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.support.redis_server import free_port
from tests.support.workers import wait_until

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

COMMANDS = {
    "fastapi": ["-m", "uvicorn", "examples.fastapi_app:app", "--port", "{port}"],
    "flask": ["-m", "flask", "--app", "examples.flask_app", "run", "--port", "{port}"],
    "django": ["-m", "django", "runserver", "127.0.0.1:{port}", "--noreload"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_example_answers_a_chat_offline(name: str) -> None:
    pytest.importorskip(name, reason=f"the {name} example needs the examples extra")
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FX_") and k not in ("REDIS_URL", "AI_GATEWAY_API_KEY")}
    env.update(PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="examples.django_settings")
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, *(a.format(port=port) for a in COMMANDS[name])], cwd=ROOT, env=env,
                            stdout=log, stderr=log)
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if proc.poll() is not None:
                log.seek(0)
                raise AssertionError(log.read().decode(errors="replace")[-3000:])
            try:
                httpx.get(base + "/", timeout=1)
                return True
            except httpx.TransportError:
                return False

        wait_until(up, 30, interval_s=0.1, what=f"the {name} example up")
        answer = httpx.post(f"{base}/chat", json={"text": "Where is order 42?"}, timeout=20)
        assert answer.status_code == 200, answer.text[:500]
        lines = [json.loads(raw) for raw in answer.text.splitlines() if raw.strip()]
        assert lines[-1]["type"] == "turn_end" and lines[-1]["stopReason"] == "end_turn", lines[-3:]
        assert answer.headers["x-session-id"].startswith("fxs_")
        assert "".join(ln.get("delta", "") for ln in lines if ln["type"] == "text_delta")
    finally:
        proc.kill()
        proc.wait(10)
        log.close()
