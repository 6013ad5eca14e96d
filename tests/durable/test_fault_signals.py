"""SIGSTOP past the lease and SIGTERM during a turn, on real Celery worker processes (§5-§7).

SIGSTOP freezes the holder with its sockets open; another worker takes the session over
once the lease is dead; on SIGCONT the frozen worker's writes must all be refused by the
epoch fence (§11.4), so no line of its epoch lands after the new epoch's first line and
no effect runs twice. SIGTERM is a deploy: the worker yields its turn, requeues it and
exits, and another worker finishes it; a stream that ends within the reserve finishes
and the turn yields cleanly before its next request, one that does not is cut off.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from tests.chaos.faults import (
    Pool,
    assert_no_stale_line,
    fault_env,
    lines_of,
    pid_of,
    redis_list,
    redis_set,
    requests_for,
    responder,
    text_without_retracted,
    wait_line,
)
from tests.chaos.tooling import done_key, release_key, starts_key
from tests.support.workers import CeleryWorker, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery]

LEASE_S = 2.0
RESERVE_S = 4.0
TAKEOVER_BOUND_S = LEASE_S + 2.0


@pytest.fixture(scope="module")
def pool(workers: Any, model: Any) -> Pool:
    model.responder = responder
    p = Pool(workers, fault_env(model, FX_LEASE_S=str(LEASE_S), FX_RESERVE_S=str(RESERVE_S)))
    p.fill()
    return p


@pytest.fixture
def live(pool: Pool) -> Any:
    pool.fill()
    stopped: list[CeleryWorker] = []
    yield pool, stopped
    for w in stopped:  # never leave a frozen process behind a failed assertion
        if w.proc is not None and w.proc.poll() is None:
            w.signal(signal.SIGCONT)


def _fenced_in_log(worker: CeleryWorker, session_id: str) -> bool:
    return f"session.fenced session={session_id}" in worker.log_tail(200_000)


def _check_fenced_epoch(lines: list[dict[str, Any]], old_epoch: int) -> None:
    new = [i for i, ln in enumerate(lines) if ln["epoch"] > old_epoch]
    assert new, "no line of the new epoch"
    late = [ln for ln in lines[new[0]:] if ln["epoch"] == old_epoch]
    assert late == [], f"lines of the frozen worker's epoch after the new epoch's first line: {late}"
    assert_no_stale_line(lines)


def test_sigstop_past_the_lease_then_sigcont_the_woken_worker_writes_nothing(live: Any, client: Any, model: Any) -> None:
    pool, stopped = live
    agent = client.agents["default"]
    session = agent.blocking_session()
    turn = session.prompt("hold:stop1")
    model.wait_held("stop1", timeout_s=15)
    partial = wait_line(agent, session.id, lambda ln: ln["type"] == "text_delta", 5, what="partial text stored")
    old_epoch = partial["epoch"]
    frozen = pool.by_pid(pid_of(requests_for(model, "hold:stop1")[-1]))
    frozen.signal(signal.SIGSTOP)
    stopped.append(frozen)
    t0 = time.monotonic()
    resumed = wait_line(agent, session.id, lambda ln: ln["type"] == "turn_resume", TAKEOVER_BOUND_S + 5,
                        what="takeover of the frozen worker's session")
    print(f"SIGSTOP → takeover: {time.monotonic() - t0:.2f} s")
    assert resumed["epoch"] > old_epoch
    wait_until(lambda: len(requests_for(model, "hold:stop1")) >= 2, 10, what="the new holder's model request")
    assert pid_of(requests_for(model, "hold:stop1")[-1]) != frozen.pid
    model.release("stop1")  # both responses go on: the frozen worker's bytes wait in its socket
    assert turn.result().stop_reason == "end_turn"
    ended = lines_of(agent, session.id)
    frozen.signal(signal.SIGCONT)
    wait_until(lambda: _fenced_in_log(frozen, session.id), 15, what="the woken worker fenced")
    # It stopped: its Celery task returned and nothing more of this session was written.
    wait_until(lambda: "fenced" in frozen.log_tail(200_000) and lines_of(agent, session.id) == ended, 5,
               what="the stream unchanged after SIGCONT")
    lines = lines_of(agent, session.id)
    assert lines == ended
    _check_fenced_epoch(lines, old_epoch)
    assert text_without_retracted(lines) == "partial rest"
    assert frozen.proc is not None and frozen.proc.poll() is None  # fenced, not crashed


def test_sigstop_in_a_non_idempotent_tool_runs_its_effect_at_most_once(
    live: Any, client: Any, model: Any, redis_url: str, prefix: str
) -> None:
    pool, stopped = live
    agent = client.agents["default"]
    session = agent.blocking_session()
    name = "hold-s2"
    turn = session.prompt(f"effect:{name}")
    first = wait_until(lambda: redis_list(redis_url, starts_key(name, prefix)), 15, what="the effect started")
    _, old_epoch, pid = first[0].split("|")  # type: ignore[index]
    frozen = pool.by_pid(int(pid))
    frozen.signal(signal.SIGSTOP)
    stopped.append(frozen)
    assert turn.result().stop_reason == "end_turn"  # the new holder answered the call as possibly run
    ended = lines_of(agent, session.id)
    redis_set(redis_url, release_key(name, prefix))
    frozen.signal(signal.SIGCONT)
    wait_until(lambda: _fenced_in_log(frozen, session.id), 15, what="the woken worker fenced")
    starts = redis_list(redis_url, starts_key(name, prefix))
    done = redis_list(redis_url, done_key(name, prefix))
    assert len(starts) == 1
    assert len(done) <= 1
    head_epoch = int(agent.blocking_session(session.id).state()["epoch"])
    # A woken worker's effect carries its old epoch: a downstream service fencing on
    # ctx.epoch refuses it, since the session's head epoch is higher.
    assert all(int(d.split("|")[1]) == int(old_epoch) < head_epoch for d in done)
    lines = lines_of(agent, session.id)
    assert lines == ended
    _check_fenced_epoch(lines, int(old_epoch))
    ends = [ln for ln in lines if ln["type"] == "tool_end"]
    assert len(ends) == 1 and ends[0]["isError"] is True


def test_sigterm_during_a_stream_that_outlasts_the_reserve_cuts_it_off_and_another_worker_finishes_it(
    live: Any, client: Any, model: Any
) -> None:
    pool, _ = live
    agent = client.agents["default"]
    session = agent.blocking_session()
    turn = session.prompt("hold:term1")
    model.wait_held("term1", timeout_s=15)
    wait_line(agent, session.id, lambda ln: ln["type"] == "text_delta", 5, what="partial text stored")
    leaving = pool.by_pid(pid_of(requests_for(model, "hold:term1")[-1]))
    t0 = time.monotonic()
    leaving.signal(signal.SIGTERM)
    yielded = wait_line(agent, session.id, lambda ln: ln["type"] == "turn_yield", RESERVE_S + 2, what="turn_yield")
    yield_s = time.monotonic() - t0
    resumed = wait_line(agent, session.id, lambda ln: ln["type"] == "turn_resume", 5, what="turn_resume")
    resume_s = time.monotonic() - t0
    print(f"SIGTERM → turn_yield {yield_s:.2f} s, → turn_resume {resume_s:.2f} s (reserve_s={RESERVE_S})")
    assert yield_s < RESERVE_S + 1
    # Requeued and released at once: the next worker does not wait out the lease.
    assert resume_s - yield_s < LEASE_S
    assert resumed["epoch"] > yielded["epoch"]
    assert leaving.proc is not None and leaving.proc.wait(15) is not None
    # The stream was still held at the hard stop: a cut-off, retracted on resume.
    assert resumed["interrupted"] is True and resumed["retract"] == [1]
    assert f"session.deadline session={session.id}" in leaving.log_tail(200_000)
    model.release("term1")
    assert turn.result().stop_reason == "end_turn"
    lines = lines_of(agent, session.id)
    assert_no_stale_line(lines)
    assert text_without_retracted(lines) == "partial rest"
    assert pid_of(requests_for(model, "hold:term1")[-1]) != leaving.pid


def test_sigterm_during_a_stream_that_ends_in_time_yields_cleanly_before_the_next_request(
    live: Any, client: Any, model: Any, redis_url: str, prefix: str
) -> None:
    pool, _ = live
    agent = client.agents["default"]
    session = agent.blocking_session()
    turn = session.prompt("holdcall:term2")
    model.wait_held("term2", timeout_s=15)
    wait_line(agent, session.id, lambda ln: ln["type"] == "text_delta", 5, what="partial text stored")
    leaving = pool.by_pid(pid_of(requests_for(model, "holdcall:term2")[-1]))
    t0 = time.monotonic()
    leaving.signal(signal.SIGTERM)
    wait_until(lambda: f"warm shutdown: {session.id} yields" in leaving.log_tail(200_000), RESERVE_S / 2,
               what="the worker's turn told to yield")
    model.release("term2")  # the stream ends well within the reserve, with a tool call
    yielded = wait_line(agent, session.id, lambda ln: ln["type"] == "turn_yield", RESERVE_S, what="turn_yield")
    yield_s = time.monotonic() - t0
    resumed = wait_line(agent, session.id, lambda ln: ln["type"] == "turn_resume", 5, what="turn_resume")
    print(f"SIGTERM → clean turn_yield {yield_s:.2f} s (reserve_s={RESERVE_S})")
    assert yield_s < RESERVE_S
    assert resumed["interrupted"] is False and not resumed.get("retract")
    assert resumed["epoch"] > yielded["epoch"]
    assert turn.result().stop_reason == "end_turn"
    assert leaving.proc is not None and leaving.proc.wait(15) is not None
    log = leaving.log_tail(200_000)
    assert f"session.deadline session={session.id}" not in log  # no cut-off counted
    requests = requests_for(model, "holdcall:term2")
    assert [pid_of(r) == leaving.pid for r in requests] == [True, False]  # no request after the SIGTERM
    assert len(redis_list(redis_url, starts_key("quick-term2", prefix))) == 1  # its call ran once, before the yield
    lines = lines_of(agent, session.id)
    assert_no_stale_line(lines)
    types = [ln["type"] for ln in lines]
    assert types.index("tool_end") < types.index("turn_yield")
    assert text_without_retracted(lines) == "partial done"
