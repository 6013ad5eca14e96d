"""Turns parked by the new code while the previous release's processes share its Redis
(docs/operations.md, "Upgrading"; stored layout level 2: parked turns).

Only this release writes parked turns (`tool_wait`, `turn_pause`, decision inputs, meta
`paused`): a process of the previous release reads none of it. So a parked turn's session
is let go for readers of level 2 (meta `newer`, release.lua), which the previous release's
claims honour (claim.lua answers them `newer`), and the door refuses decisions
(`FX_UPGRADE_IN_PROGRESS`, 503) while a live process reads an older layout
(`liveness.layout_all_read`). While one does, a parked session keeps its inbox (the
previous release's scripts take a session whose inbox is gone for a damaged one); with
the new code alone its turn's input waits in `rest` instead, so a downgrade finds such a
session refused whole (410 `FX_SESSION_INCOMPLETE`), not run on what it cannot read.

Must hold, upgrading: the previous release's web takes a prompt behind the parked turn; its
worker, woken for the session, takes nothing of it (no refund, no error line, the turn
still parked); a decision sent while it lives is refused and changes nothing; with the new
code alone, one decision, one refund, both turns `end_turn`, no process logged trouble.
Downgrading: a turn parked by the new code alone is refused by the previous release's web
and left alone by its worker; upgraded again, it runs on: one refund, `end_turn`.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis

from fxworker.liveness import layout_all_read
from fxworker.store import redis_store
from fxworker.store.types import LAYOUT_LEVEL
from tests.durable.conftest import responder
from tests.durable.tooling import refunds_key
from tests.upgrade.deployment import Deployment
from tests.upgrade.previous import Tree, current_tree
from tests.upgrade.processes import lines, state, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.celery, pytest.mark.timeout(240)]

TURN_S = 30.0


@pytest.fixture
def parked_deployment(previous: Tree) -> Iterator[Deployment]:
    d = Deployment(previous, current_tree(), agents="tests.durable.agents", model_responder=responder)
    try:
        yield d
    finally:
        d.close()


def gate(d: Deployment) -> int:
    store = redis_store(d.redis.url, prefix=d.prefix)
    try:
        return layout_all_read(store.sync.live_workers())
    finally:
        store.close()


def test_a_parked_turn_waits_out_a_rolling_upgrade_and_then_runs_once(parked_deployment: Deployment) -> None:
    d = parked_deployment
    effects = redis.Redis.from_url(d.redis.url)
    # Mid-deploy: the previous release's web serves, this release's web and worker joined.
    old_web = d.web(d.old)
    new_web = d.web(d.new)
    new_worker = d.worker(d.new)
    assert gate(d) < LAYOUT_LEVEL
    created = httpx.post(f"{new_web.url}/v1/sessions", json={"input": "refund:5"}, timeout=10).json()
    sid = created["sessionId"]
    wait_for("the turn to park", lambda: state(new_web, sid)["status"] == "paused")
    [call_id] = state(new_web, sid)["pendingCalls"]
    assert state(old_web, sid)["status"] == "waiting"  # the previous release reads it whole: an open turn

    # The previous release's worker alone takes the wakes: a prompt sent behind the parked
    # turn through its web wakes the session there, and its claim must take nothing (meta
    # `newer`): it says so in its log, and runs nothing.
    new_worker.stop()
    old_worker = d.worker(d.old)
    behind = httpx.post(f"{old_web.url}/v1/sessions/{sid}/prompts", json={"input": "after"}, timeout=10)
    assert behind.status_code == 202, behind.text
    wait_for("the previous release's worker to leave the session to a newer one",
             lambda: "needs a process that reads stored layout" in old_worker.log_path.read_text(errors="replace"))
    now = state(new_web, sid)
    assert now["status"] == "paused" and now["pendingCalls"] == [call_id], now
    assert effects.llen(refunds_key(d.prefix)) == 0
    assert not [line for line in lines(new_web, sid) if line["type"] in ("session_error", "turn_end")]

    refused = httpx.post(f"{new_web.url}/v1/sessions/{sid}/calls/{call_id}", json={"type": "approve"}, timeout=10)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "FX_UPGRADE_IN_PROGRESS", refused.text
    assert state(new_web, sid)["status"] == "paused"

    # The deploy ends: the new code alone.
    old_worker.stop()
    old_web.stop()
    d.worker(d.new)
    wait_for("the layout gate to open", lambda: gate(d) == LAYOUT_LEVEL)
    approved = httpx.post(f"{new_web.url}/v1/sessions/{sid}/calls/{call_id}", json={"type": "approve"}, timeout=10)
    assert approved.status_code == 202, approved.text
    wait_for("the session to finish", lambda: state(new_web, sid)["status"] == "idle")
    ends = [line["stopReason"] for line in lines(new_web, sid) if line["type"] == "turn_end"]
    assert ends == ["end_turn", "end_turn"]
    assert effects.llen(refunds_key(d.prefix)) == 1
    _no_trouble(d)


def test_a_turn_parked_by_the_new_code_alone_is_refused_whole_by_a_downgrade(parked_deployment: Deployment) -> None:
    d = parked_deployment
    effects = redis.Redis.from_url(d.redis.url)
    new_web = d.web(d.new)
    new_worker = d.worker(d.new)
    sid = httpx.post(f"{new_web.url}/v1/sessions", json={"input": "refund:8"}, timeout=10).json()["sessionId"]
    wait_for("the turn to park", lambda: state(new_web, sid)["status"] == "paused")
    [call_id] = state(new_web, sid)["pendingCalls"]
    new_worker.stop()
    new_web.stop()

    old_web = d.web(d.old)
    d.worker(d.old)
    refused = httpx.post(f"{old_web.url}/v1/sessions/{sid}/prompts", json={"input": "after"}, timeout=10)
    assert refused.status_code == 410 and refused.json()["error"]["code"] == "FX_SESSION_INCOMPLETE", refused.text
    for process in list(d.webs) + list(d.workers):
        if process.tree is d.old:
            process.stop()

    new_web = d.web(d.new)
    d.worker(d.new)
    wait_for("the layout gate to open", lambda: gate(d) == LAYOUT_LEVEL)
    approved = httpx.post(f"{new_web.url}/v1/sessions/{sid}/calls/{call_id}", json={"type": "approve"}, timeout=10)
    assert approved.status_code == 202, approved.text
    wait_for("the session to finish", lambda: state(new_web, sid)["status"] == "idle")
    assert [line["stopReason"] for line in lines(new_web, sid) if line["type"] == "turn_end"] == ["end_turn"]
    assert effects.llen(refunds_key(d.prefix)) == 1


def _no_trouble(d: Deployment) -> None:
    trouble = {name: [line for line in found if "FX_UPGRADE_IN_PROGRESS" not in line]  # the refusal above
               for name, found in d.trouble().items()}
    assert not any(trouble.values()), trouble
