"""Prompts accepted in one process run on real Celery worker processes (§7)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support.workers import ROOT, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery]


@pytest.fixture(scope="module")
def pool(workers: Any) -> Any:
    workers.start(concurrency=50)
    workers.start(concurrency=50)
    return workers


def run_client(redis_url: str, prefix: str, session_id: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.durable._client", redis_url, prefix, session_id, *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def lines_of(client: Any, session_id: str) -> list[dict[str, Any]]:
    return list(client.agents["default"].blocking_session(session_id).stream(0, follow=False))


def turn_ended(client: Any, session_id: str, n: int = 1) -> bool:
    ends = [line for line in lines_of(client, session_id) if line["type"] == "turn_end"]
    return len(ends) >= n


def test_a_prompt_runs_on_a_worker_and_streams_to_a_third_process(pool: Any, client: Any, redis_url: str, prefix: str) -> None:
    session = client.agents["default"].blocking_session()
    reader = run_client(redis_url, prefix, session.id, "stream")
    turn = session.prompt("hello there")
    result = turn.result()
    out, err = reader.communicate(timeout=30)
    assert reader.returncode == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert result.stop_reason == "end_turn"
    assert [ln["type"] for ln in lines][0] == "turn_start"
    assert lines[-1]["type"] == "turn_end" and lines[-1]["stopReason"] == "end_turn"
    text = "".join(ln["delta"] for ln in lines if ln["type"] == "text_delta")
    assert text == "echo:hello there"
    cursors = [ln["cursor"] for ln in lines]
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
    assert all(ln["messageId"] == turn.message_id and ln["epoch"] >= 1 for ln in lines)


def test_steer_from_another_process_joins_the_running_turn(pool: Any, client: Any, model: Any, redis_url: str, prefix: str) -> None:
    session = client.agents["default"].blocking_session()
    turn = session.prompt("hold:steer1")
    model.wait_held("steer1", timeout_s=15)
    steerer = run_client(redis_url, prefix, session.id, "steer", "please also say bye")
    assert steerer.wait(30) == 0, steerer.stderr.read() if steerer.stderr else ""
    wait_until(lambda: any(ln["type"] == "user_message" for ln in lines_of(client, session.id)), 10, what="user_message")
    model.release("steer1")
    result = turn.result()
    assert result.stop_reason == "end_turn"
    lines = lines_of(client, session.id)
    joined = [ln for ln in lines if ln["type"] == "user_message"]
    assert joined[0]["text"] == "please also say bye"
    # The model's next request carries the steer.
    assert any("please also say bye" in json.dumps(r.body) for r in model.requests)


def test_cancel_reaches_the_running_worker_within_a_second(pool: Any, client: Any, model: Any) -> None:
    session = client.agents["default"].blocking_session()
    turn = session.prompt("hold:cancel1")
    model.wait_held("cancel1", timeout_s=15)
    t0 = time.monotonic()
    session.cancel()
    wait_until(lambda: turn_ended(client, session.id), 5, interval_s=0.01, what="turn_end")
    elapsed_s = time.monotonic() - t0
    print(f"cancel → turn_end: {elapsed_s * 1000:.0f} ms")
    model.release("cancel1")
    assert turn.result().stop_reason == "cancelled"
    assert elapsed_s < 1.0


def test_turn_cancel_ends_that_turn_waiting_or_running_and_leaves_the_next(pool: Any, client: Any, model: Any) -> None:
    session = client.agents["default"].blocking_session()
    running = session.prompt("hold:tc1")
    model.wait_held("tc1", timeout_s=15)
    waiting = session.prompt("queued behind the held one")
    after = session.prompt("runs after both")

    assert waiting.cancel() is True  # waiting: it ends cancelled when its turn comes
    assert running.cancel() is True  # running: the worker sees it within a second
    assert running.result().stop_reason == "cancelled"
    model.release("tc1")
    assert waiting.result().stop_reason == "cancelled"
    done = after.result()
    assert done.stop_reason == "end_turn" and done.message_id == after.message_id and done.epoch >= 1
    assert after.cancel() is False and running.cancel() is False  # ended: no-ops
    ends = [ln for ln in lines_of(client, session.id) if ln["type"] == "turn_end"]
    assert [(e["messageId"], e["stopReason"]) for e in ends] == [
        (running.message_id, "cancelled"), (waiting.message_id, "cancelled"), (after.message_id, "end_turn")]
    texts = [json.dumps(r.body) for r in model.requests]
    assert not any("queued behind the held one" in t for t in texts)  # the cancelled waiting turn never asked the model


def test_a_lost_wake_is_run_by_the_sweeper(pool: Any, client: Any) -> None:
    class NoWaker:
        def wake(self, session_id: str, *, agent: str, reason: str) -> None:
            pass  # the wake is lost between accept and the broker

    agent = client.agents["default"]
    agent._waker = NoWaker()
    try:
        session = agent.blocking_session()
        turn = session.prompt("lost wake")
    finally:
        agent._waker = client.waker
    t0 = time.monotonic()
    wait_until(lambda: turn_ended(client, session.id), 15, what="the sweeper's run")
    print(f"lost wake → turn_end after {time.monotonic() - t0:.2f} s (FX_SWEEP_S=1)")
    assert turn.result().stop_reason == "end_turn"


def test_a_failed_wake_is_a_lost_one_only_when_the_broker_is_away(pool: Any, client: Any) -> None:
    """A waker whose broker is away (a socket error) costs the prompt nothing: it is
    acknowledged and the sweeper runs it. A waker that fails otherwise has a bug: the
    prompt raises it instead of hiding it in a warning."""
    class AwayWaker:
        def wake(self, session_id: str, *, agent: str, reason: str) -> None:
            raise ConnectionRefusedError("the broker is away")

    class BuggyWaker:
        def wake(self, session_id: str, *, agent: str, reason: str) -> None:
            raise ValueError("a bug in the waker")

    agent = client.agents["default"]
    agent._waker = AwayWaker()
    try:
        away = agent.blocking_session()
        turn = away.prompt("broker away")
        agent._waker = BuggyWaker()
        with pytest.raises(ValueError, match="a bug in the waker"):
            agent.blocking_session().prompt("buggy waker")
    finally:
        agent._waker = client.waker
    wait_until(lambda: turn_ended(client, away.id), 15, what="the sweeper's run")
    assert turn.result().stop_reason == "end_turn"


def test_fifty_prompts_from_five_processes_run_one_at_a_time_in_acceptance_order(
    pool: Any, client: Any, redis_url: str, prefix: str
) -> None:
    session = client.agents["default"].blocking_session()
    session.prompt("first", message_id="m0").result()
    senders = [
        run_client(redis_url, prefix, session.id, "prompt", *[f"s{p}-{i}" for i in range(10)]) for p in range(5)
    ]
    for s in senders:
        out, err = s.communicate(timeout=60)
        assert s.returncode == 0, err
    expected = {f"s{p}-{i}" for p in range(5) for i in range(10)}
    wait_until(lambda: turn_ended(client, session.id, 51), 60, interval_s=0.1, what="51 turn ends")
    lines = lines_of(client, session.id)
    open_turn = None
    started: list[str] = []
    for line in lines:
        if line["type"] == "turn_start":
            assert open_turn is None, f"{line['messageId']} started while {open_turn} was open"
            open_turn = line["messageId"]
            started.append(open_turn)
        elif line["type"] == "turn_end":
            assert line["messageId"] == open_turn
            open_turn = None
    assert started[0] == "m0"
    assert sorted(started[1:]) == sorted(expected) and len(started) == 51
    # Acceptance order: the inbox sequence numbers the store's message index keeps
    # ("kind:state:seq:...", see fxworker.keys).
    import redis as redis_py

    from fxworker.keys import session_keys

    r = redis_py.Redis.from_url(redis_url)
    try:
        index = r.hgetall(session_keys(prefix, session.id).msgs)
    finally:
        r.close()
    seqs = {k.decode(): int(v.decode().split(":")[2]) for k, v in index.items()}
    accepted = sorted(seqs, key=seqs.__getitem__)
    assert started == accepted
    # Within one sender, its own prompts keep their order.
    for p in range(5):
        mine = [m for m in started if m.startswith(f"s{p}-")]
        assert mine == [f"s{p}-{i}" for i in range(10)]


def test_two_hundred_sessions_over_two_workers_all_complete(pool: Any, client: Any) -> None:
    agent = client.agents["default"]
    t0 = time.monotonic()
    turns = [agent.blocking_session().prompt(f"many {i}") for i in range(200)]
    accepted_s = time.monotonic() - t0
    results = [t.result() for t in turns]
    total_s = time.monotonic() - t0
    print(f"200 sessions: accepted in {accepted_s:.2f} s, all ended after {total_s:.2f} s")
    assert [r.stop_reason for r in results] == ["end_turn"] * 200
