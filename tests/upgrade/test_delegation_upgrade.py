"""A delegated turn while the release before delegation shares the Redis (docs/operations.md,
"Upgrading"; stored layout level 3: delegated turns).

Only this release delegates: a delegating tool parks the parent's turn and prompts a child
session of the tool's agent, whose input carries the link its end answers. A process of
the release before (`DELEGATING_PREVIOUS`, which reads level 2: parked turns) would run
that prompt as a plain one and never answer the parent. So the child's prompt raises its
session's meta `newer` to 3 (accept.lua), which that release's claims honour (claim.lua
answers them `newer`): it is left for a process of this release.

Must hold: this release's `triage` worker delegates to `billing` while only the previous
release's `billing` worker serves `fx.billing`; that worker, woken for the child session,
takes nothing of it (the child stays `waiting` with its prompt pending, meta `newer` 3, no
`turn_start` and no error line in its stream, no model request); once this release's
`billing` worker serves the queue (and the previous release's stops, as a deploy does),
the child runs once and answers, and the parent ends `end_turn` with billing's answer in
its text. No process logged trouble.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fxengine.testing import Reply, text, tool_call, usage
from fxworker.store import redis_store
from fxworker.store.types import DELEGATED_LEVEL
from tests.upgrade.deployment import Deployment
from tests.upgrade.previous import Tree, current_tree, materialise
from tests.upgrade.processes import lines, state, wait_for
from tests.durable.conftest import last_message_text, system_text

pytestmark = [pytest.mark.slow, pytest.mark.celery, pytest.mark.timeout(240)]

# The last release before delegation: it reads stored layout level 2 (parked turns) and
# honours meta `newer`.
DELEGATING_PREVIOUS = "1c5ef79"
NEW_AGENTS = "tests.upgrade.delegation_agents"  # triage (delegates to billing) and billing
OLD_AGENTS = "tests.upgrade.previous_billing"  # billing alone, copied into the previous tree
TURN_S = 30.0


def responder(request: Any) -> Reply:
    """triage: hands its prompt to `billing`, then answers with the result it read;
    billing: answers `billed <task>`."""
    role, last = last_message_text(request)
    if "triage" in system_text(request):
        if role == "tool":
            return Reply(text("answer: " + last), usage(5, 3))
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "billing", {"input": last}), usage(7, 2))
    return Reply(text("billed " + last), usage(11, 4))


def _imported_from(tree: Tree, agents: str) -> dict[str, str]:
    """The files `fxworker`, `fxengine` and `agents` load from in a process started as the
    tree's processes are."""
    probe = (f"import json, fxworker, fxengine, {agents} as a; "
             "print(json.dumps({'fxworker': fxworker.__file__, 'fxengine': fxengine.__file__, 'agents': a.__file__}))")
    out = subprocess.run([sys.executable, "-c", probe], env=tree.environment({"REDIS_URL": "redis://127.0.0.1:9/0"}),
                         cwd=tree.root, check=True, capture_output=True, timeout=60)
    return dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def before_delegation() -> Iterator[Tree]:
    """The previous release's tree with the billing agents module beside its own tests; its
    processes load `OLD_AGENTS` and import its own packages, not this checkout's."""
    with materialise(DELEGATING_PREVIOUS) as tree:
        assert not (tree.root / "fxworker" / "delegation.py").exists(), "the previous release delegates already"
        here = Path(__file__).with_name("previous_billing.py")
        shutil.copyfile(here, tree.root / "tests" / "upgrade" / here.name)
        old = dataclasses.replace(tree, env={**tree.env, "FX_AGENTS": OLD_AGENTS})
        files = _imported_from(old, OLD_AGENTS)
        strays = {name: path for name, path in files.items() if not path.startswith(str(tree.root))}
        assert not strays, f"the previous release's processes would import {strays}, not {tree.root}"
        yield old


@pytest.fixture
def deployment(before_delegation: Tree) -> Iterator[Deployment]:
    d = Deployment(before_delegation, current_tree(), agents=NEW_AGENTS, model_responder=responder)
    try:
        yield d
    finally:
        d.close()


def billing_requests(d: Deployment) -> list[str]:
    """The release of the worker behind each of billing's model requests, in order."""
    release = d.release_of_pid()
    return [release.get(int(r.headers["x-fx-pid"]), "?") for r in d.model.requests
            if "billing" in system_text(r) and "triage" not in system_text(r)]


def test_a_delegated_turn_waits_for_a_process_that_answers_its_parent(deployment: Deployment) -> None:
    d = deployment
    store = redis_store(d.redis.url, prefix=d.prefix)
    try:
        web = d.web(d.new)
        d.worker(d.new, queues=("triage",))
        old_billing = d.worker(d.old, queues=("billing",))

        created = httpx.post(f"{web.url}/v1/sessions", json={"agent": "triage", "input": "invoice 42"}, timeout=10)
        assert created.status_code in (200, 201, 202), created.text
        sid = created.json()["sessionId"]
        wait_for("the parent to park on its call", lambda: state(web, sid)["status"] == "paused")
        [start] = wait_for("the call's delegate_start",
                           lambda: [line for line in lines(web, sid) if line["type"] == "delegate_start"])
        child = start["sessionId"]
        assert start["agent"] == "billing"

        # The previous release's billing worker alone serves fx.billing: woken for the child,
        # its claim takes nothing (meta `newer`), and it says so in its log.
        def left_to_a_newer_one() -> bool:
            ran = [line["type"] for line in lines(web, child) if line["type"] in ("turn_start", "session_error")]
            assert not ran, f"the previous release's worker ran the child's prompt: {ran}"
            return (f"{child} needs a process that reads stored layout {DELEGATED_LEVEL}"
                    in old_billing.log_path.read_text(errors="replace"))

        wait_for("the previous release's worker to leave the child to a newer one", left_to_a_newer_one)
        time.sleep(1.5)  # a few sweeps: nothing wakes it into running the prompt either
        left = store.sync.state(child)
        assert left is not None and left.agent == "billing", left
        assert left.status == "waiting" and left.pending == 1 and left.open_turn is None, left
        assert left.newer == DELEGATED_LEVEL, left
        assert left.turns == 0 and left.epoch == 0, left
        child_types = [line["type"] for line in lines(web, child)]
        assert "turn_start" not in child_types and "session_error" not in child_types, child_types
        assert billing_requests(d) == []
        assert state(web, sid)["status"] == "paused"
        assert not [line for line in lines(web, sid) if line["type"] in ("turn_end", "session_error")]

        # The deploy: this release's billing worker joins, the previous release's stops.
        new_billing = d.worker(d.new, queues=("billing",))
        old_billing.stop()
        wait_for("the parent to finish", lambda: state(web, sid)["status"] == "idle")

        child_lines = lines(web, child)
        assert [line["type"] for line in child_lines if line["type"] in ("turn_start", "turn_end")] == [
            "turn_start", "turn_end"], child_lines
        assert [line["stopReason"] for line in child_lines if line["type"] == "turn_end"] == ["end_turn"]
        assert not [line for line in child_lines if line["type"] == "session_error"]
        assert billing_requests(d) == ["new"]
        assert d.release_of_pid()[new_billing.pid] == "new"  # type: ignore[index]
        done = store.sync.state(child)
        assert done is not None and done.status == "idle" and done.newer is None and done.turns == 1, done

        parent_lines = lines(web, sid)
        [end] = [line for line in parent_lines if line["type"] == "delegate_end"]
        assert end["sessionId"] == child and end["stopReason"] == "end_turn", end
        assert [line["stopReason"] for line in parent_lines if line["type"] == "turn_end"] == ["end_turn"]
        final = "".join(line["delta"] for line in parent_lines if line["type"] == "text_delta")
        assert "billed invoice 42" in final, final
    finally:
        store.close()
    trouble = d.trouble()
    assert not trouble, trouble
