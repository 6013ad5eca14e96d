"""`/metrics` of a web process and of a worker process (`FX_METRICS_PORT`): the counts move.

The module has its own worker (agents `default` and `a` only, serving its metrics on a
free port) and its own web process (agents `default`, `a` and `b`), so a prompt to `b`
waits for an agent no live worker runs: the worker's sweeper counts an `FX_NO_AGENT`
refusal as it records `noWorker`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fxengine.testing import ScriptedModel
from tests.support.redis_server import free_port
from tests.support.workers import Workers, wait_until
from tests.web._server import WebProcess
from tests.web.conftest import _env, read_turn
from tests.web.test_cli import Running, fx

pytestmark = [pytest.mark.redis, pytest.mark.celery]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def workers(redis_url: str, prefix: str, model: ScriptedModel, metrics_port: int) -> Iterator[Workers]:
    """Overrides the package's worker: agents default and a, metrics on `metrics_port`."""
    pool = Workers(redis_url=redis_url, prefix=prefix, env={"FX_TEST_MODEL_URL": model.base_url})
    try:
        pool.start(queues=("default", "a", "b"), agents=("default", "a"), concurrency=4,
                   env={"FX_TEST_MODEL_URL": model.base_url, "FX_METRICS_PORT": str(metrics_port)})
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def web(redis_url: str, prefix: str, model: ScriptedModel, workers: Workers) -> Iterator[WebProcess]:
    process = WebProcess(env=_env(redis_url, prefix, model, "default,a,b"))
    try:
        yield process.wait_ready()
    finally:
        process.close()


def scrape(url: str) -> Samples:
    response = httpx.get(url, timeout=5.0)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_a_turn_moves_the_web_and_the_worker_metrics(web: WebProcess, metrics_port: int, model: Any) -> None:
    worker_url = f"http://127.0.0.1:{metrics_port}/metrics"
    web_before, worker_before = scrape(web.url + "/metrics"), scrape(worker_url)
    with httpx.Client(base_url=web.url, timeout=15.0) as api:
        created = api.post("/v1/sessions", json={"input": "hold:metrics1"})
        assert created.status_code == 202, created.text
        model.wait_held("metrics1", timeout_s=15)
        # The worker runs the turn now: its gauge says so.
        running = wait_until(lambda: value(scrape(worker_url), "fx_turns_running") == 1, 5, interval_s=0.05,
                             what="fx_turns_running = 1 on the worker")
        assert running
        model.release("metrics1")
        lines = read_turn(api, created.json()["sessionId"])
        assert lines[-1]["stopReason"] == "end_turn"

    web_after = scrape(web.url + "/metrics")
    assert value(web_after, "fx_inputs_accepted_total") == value(web_before, "fx_inputs_accepted_total") + 1
    accept = "fx_store_latency_seconds_count"
    assert value(web_after, accept, op="accept") >= value(web_before, accept, op="accept") + 1

    def worker_done() -> Samples | None:
        now = scrape(worker_url)
        moved = value(now, "fx_wakes_total", outcome="done") > value(worker_before, "fx_wakes_total", outcome="done")
        return now if moved and value(now, "fx_turns_running") == 0 else None

    worker_after: Samples = wait_until(worker_done, 5, interval_s=0.05, what="the wake counted done")  # type: ignore[assignment]
    for op in ("claim", "append"):
        assert value(worker_after, accept, op=op) > value(worker_before, accept, op=op), op
    # The turn's end record let the session go in its own call: no release call of its own.
    assert value(worker_after, accept, op="release") == value(worker_before, accept, op="release")
    # The worker stored nothing as a sender, and took nothing over.
    assert value(worker_after, "fx_inputs_accepted_total") == value(worker_before, "fx_inputs_accepted_total")
    assert value(worker_after, "fx_session_takeovers_total") == value(worker_before, "fx_session_takeovers_total")
    # The turn's end, by agent and stop reason, and its time from the prompt's storing.
    ended = {"agent": "default", "stop_reason": "end_turn"}
    assert value(worker_after, "fx_turns_ended_total", **ended) == value(worker_before, "fx_turns_ended_total",
                                                                         **ended) + 1
    count = "fx_turn_duration_seconds_count"
    assert value(worker_after, count, **ended) == value(worker_before, count, **ended) + 1
    spent = value(worker_after, "fx_turn_duration_seconds_sum", **ended) - value(
        worker_before, "fx_turn_duration_seconds_sum", **ended)
    assert 0 < spent < 60, spent  # it waited at the held model: more than nothing, bounded
    # The web lists only what it counts: none of the workers' families.
    web_names = {name for name, _ in web_after}
    assert "fx_inputs_accepted_total" in web_names and "fx_store_latency_seconds_count" in web_names
    for worker_only in ("fx_turns_running", "fx_session_takeovers_total", "fx_wakes_total", "fx_turns_ended_total",
                        "fx_turn_yields_total", "fx_no_agent_refusals_total"):
        assert worker_only not in web_names, worker_only


def test_a_wake_for_an_agent_the_worker_lacks_counts_a_refusal(web: WebProcess, metrics_port: int) -> None:
    worker_url = f"http://127.0.0.1:{metrics_port}/metrics"
    before = value(scrape(worker_url), "fx_no_agent_refusals_total")
    with httpx.Client(base_url=web.url, timeout=15.0) as api:
        created = api.post("/v1/sessions", json={"input": "for b", "agent": "b"})
        assert created.status_code == 202, created.text
        session_id = created.json()["sessionId"]
        wait_until(lambda: value(scrape(worker_url), "fx_no_agent_refusals_total") > before, 10, interval_s=0.05,
                   what="an FX_NO_AGENT refusal counted on the worker")
        state = api.get(f"/v1/sessions/{session_id}").json()
        assert state["status"] == "waiting" and state["noWorker"]["agent"] == "b", state
    # `fx tail` says what the session waits for, not silence.
    tail = Running(web.url, "tail", session_id)
    try:
        wait_until(lambda: "no live worker runs agent 'b'" in tail.stderr, 10, interval_s=0.05,
                   what="fx tail saying the session waits for a worker of agent b")
    finally:
        tail.proc.kill()
        tail.proc.wait(5)
    # `fx cancel` says the cancel waits for a worker of that agent (the turn's end will not show till then).
    cancelled = fx(web.url, "cancel", session_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "no live worker runs agent 'b'" in cancelled.stdout, cancelled.stdout
