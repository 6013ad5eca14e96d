"""`fx dev` started as a child process: a prompt over HTTP streams its answer; an embedded
worker killed mid-turn (SIGUSR1, the dev-mode hook) is replaced and the turn completes."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator

import httpx
import pytest

from fxengine.testing import ScriptedModel
from tests.web._model import responder
from tests.web._server import WebProcess

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def dev_model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


@pytest.fixture(scope="module")
def dev(dev_model: ScriptedModel) -> Iterator[WebProcess]:
    env = {"FX_TEST_MODEL_URL": dev_model.base_url, "FX_TEST_AGENTS": "default", "FX_LEASE_S": "1", "FX_SWEEP_S": "0.2"}
    web = WebProcess("dev", env=env, args=("--agents", "tests.durable.agents"))
    try:
        yield web.wait_ready()
    finally:
        web.close()


def test_fx_dev_serves_the_embedded_store_and_streams_a_prompt(dev: WebProcess) -> None:
    assert httpx.get(dev.url + "/healthz").json() == {"ok": True, "store": "embedded"}
    with httpx.stream("POST", dev.url + "/v1/sessions", json={"input": "hi from dev"},
                      headers={"Accept": "application/x-ndjson"}, timeout=20.0) as response:
        lines = [json.loads(raw) for raw in response.iter_lines() if raw.strip()]
    assert lines[0]["type"] == "turn_start" and lines[-1]["stopReason"] == "end_turn"
    assert "".join(line.get("delta", "") for line in lines) == "echo:hi from dev "


def test_an_embedded_worker_killed_mid_turn_is_replaced_and_the_turn_completes(dev: WebProcess, dev_model: ScriptedModel) -> None:
    lines: list[dict] = []
    first_text = threading.Event()
    ended = threading.Event()

    def read() -> None:
        with httpx.stream("POST", dev.url + "/v1/sessions", json={"input": "holdonce:kill1"},
                          headers={"Accept": "application/x-ndjson"}, timeout=30.0) as response:
            for raw in response.iter_lines():
                if raw.strip():
                    lines.append(json.loads(raw))
                    if lines[-1].get("delta") == "partial ":
                        first_text.set()
                    if lines[-1]["type"] == "turn_end":
                        ended.set()
                        return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        dev_model.wait_held("kill1", timeout_s=15)
        assert first_text.wait(10), lines
        dev.signal(signal.SIGUSR1)  # kills embedded worker 0 mid-request and starts a fresh one
        assert ended.wait(30), f"turn did not end: {lines}\n{dev.log_tail()}"
    finally:
        dev_model.release("kill1")
        reader.join(10)
    kinds = [line["type"] for line in lines]
    assert kinds[0] == "turn_start" and kinds[-1] == "turn_end"
    assert lines[-1]["stopReason"] == "end_turn"
    resume = [line for line in lines if line["type"] == "turn_resume"]
    assert resume and resume[0]["interrupted"] is True
    assert resume[0]["epoch"] > lines[0]["epoch"]
    after = lines[kinds.index("turn_resume"):]
    assert "".join(line.get("delta", "") for line in after) == "after the kill"
    assert "killed embedded worker 0" in dev.log_tail()
