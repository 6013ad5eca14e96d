"""A typed turn while the release before typed answers shares the Redis (docs/operations.md,
"Upgrading"; stored layout level 4: typed turns).

Only this release types answers: a prompt of an agent with an `output_type` is stored with
its answer type (`settings["output"]`, fxworker/typed.py), and its turn asks the model for
the object (here through the final-result tool) and ends with it on the `turn_end` line. A
process of the release before (`TYPED_PREVIOUS`, which reads level 3: delegated turns)
ignores that setting and would end the turn with untyped text. So the prompt raises its
session's meta `newer` to 4 (accept.lua, `needs=TYPED_LEVEL`), which that release's claims
honour (claim.lua answers them `newer`): it is left for a process of this release.

Must hold, on one Redis and one key prefix: while only the previous release's worker serves
`fx.invoices` and `fx.notes`, a typed prompt stored by this release's web is not run (no
model request from that worker for it, no `turn_start` or error line, the session
`waiting` with its prompt pending and meta `newer` 4) within a bounded window, while an
untyped prompt to another session sent in that window is run by that worker to `end_turn`:
untyped work keeps flowing. Once this release's worker joins and the previous one stops
(as a deploy does), the typed turn runs once, on the new worker (its first answer does not
validate, its retry does), to `end_turn` with the `output` object on its one `turn_end`
line. The journal batch holding the turn's `output` verdict is format 2: the previous
release's own decoder refuses it as newer (`FX_JOURNAL_VERSION`), not as damaged, and
reads the session's other batches. No process logged trouble.

`test_a_typed_prompt_behind_a_turn_the_previous_release_holds_is_left_to_a_newer_one`: the
same when the typed prompt arrives (through this release's web) while the previous
release's worker holds the session for an untyped turn (stored through its own web): it
ends its turn and leaves the typed one.

`test_a_typed_turn_runs_on_a_new_worker_while_the_previous_release_still_runs`: with both
releases' workers live and the previous release's worker holding the sweeper guard (its
sweeper skips sessions let go for a newer layout, and the guard stays with its holder), the
new worker sweeps the sessions let go for its layout itself (`Sweeper.sweep_newer`), so the
typed turn runs mid-deploy, not only once every previous-release process is gone.
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
import redis

from fxengine.journal.records import FORMAT_VERSION, decode_batch
from fxengine.output import FINAL_RESULT_TOOL
from fxengine.testing import Reply, hold, text, tool_call, usage
from fxworker.keys import session_keys, sweeper_guard_key
from fxworker.store import redis_store
from fxworker.store._replies import parse_rest
from fxworker.store.types import TYPED_LEVEL
from tests.durable.conftest import last_message_text, system_text
from tests.upgrade.deployment import Deployment
from tests.upgrade.previous import Tree, current_tree, materialise
from tests.upgrade.processes import TreeWeb, lines, state, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.celery, pytest.mark.timeout(240)]

# The last release before typed answers: it reads stored layout level 3 (delegated turns)
# and honours meta `newer`.
TYPED_PREVIOUS = "2800679"
AGENTS = "tests.upgrade.typed_agents"  # in both trees: `invoices` (typed here, untyped there) and `notes`
QUEUES = ("invoices", "notes")
TURN_S = 30.0
# How long the typed prompt is watched for a run by the previous release beyond the
# untyped turn's: a few sweeps (FX_SWEEP_S 0.5) and wakes, kept short.
QUIET_S = 1.5
# How long a typed turn left by the previous release may wait for a sweep of the new worker
# while the previous release's worker still runs (many sweeps and the sweeper guard's life).
MIXED_TURN_S = 12.0
INVOICE = {"number": "42", "total": 17}
NOT_AN_INVOICE = {"number": "42", "total": "seventeen"}
RETRY = "retry"  # the hold of the typed turn's second model request
FIRST = "first"  # an untyped prompt of `invoices` (the previous release's web): held on its model request


def responder(request: Any) -> Reply:
    """invoices: when the request offers the final-result tool (a typed turn), first an
    answer that does not validate, then (once released at `RETRY`, after its verdict was
    stored) a valid one; without the tool it answers in text, as an untyped run of it
    would end (held at `FIRST` for the prompt `FIRST`); notes: answers `noted <text>`."""
    role, last = last_message_text(request)
    if "You are invoices." in system_text(request):
        offered = [t.get("function", {}).get("name") for t in request.body.get("tools") or []]
        if FINAL_RESULT_TOOL not in offered:
            return Reply(*([hold(FIRST)] if last == FIRST else []), text("untyped " + last), usage(9, 3))
        call = f"call_{uuid.uuid4().hex[:8]}"
        if role == "tool":  # the final-result call's result: the errors to fix
            return Reply(hold(RETRY), tool_call(call, FINAL_RESULT_TOOL, INVOICE), usage(12, 5))
        return Reply(tool_call(call, FINAL_RESULT_TOOL, NOT_AN_INVOICE), usage(9, 5))
    return Reply(text("noted " + last), usage(7, 2))


def _imported_from(tree: Tree) -> dict[str, Any]:
    """The files `fxworker`, `fxengine` and the agents module load from in a process started
    as the tree's processes are, and whether that agents module types `invoices`."""
    probe = (f"import json, fxworker, fxengine, {AGENTS} as a; "
             "print(json.dumps({'fxworker': fxworker.__file__, 'fxengine': fxengine.__file__, 'agents': a.__file__, "
             "'typed': a.RELEASE_TYPED}))")
    out = subprocess.run([sys.executable, "-c", probe], env=tree.environment({"REDIS_URL": "redis://127.0.0.1:9/0"}),
                         cwd=tree.root, check=True, capture_output=True, timeout=60)
    return dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def before_typed() -> Iterator[Tree]:
    """The previous release's tree with the agents module beside its own tests; its
    processes load `AGENTS` and import its own packages, not this checkout's."""
    with materialise(TYPED_PREVIOUS) as tree:
        assert not (tree.root / "fxworker" / "typed.py").exists(), "the previous release types answers already"
        here = Path(__file__).with_name("typed_agents.py")
        shutil.copyfile(here, tree.root / "tests" / "upgrade" / here.name)
        old = dataclasses.replace(tree, env={**tree.env, "FX_AGENTS": AGENTS})
        found = _imported_from(old)
        assert found.pop("typed") is False, "the previous release's agents module types `invoices`"
        strays = {name: path for name, path in found.items() if not str(path).startswith(str(tree.root))}
        assert not strays, f"the previous release's processes would import {strays}, not {tree.root}"
        yield old


@pytest.fixture
def deployment(before_typed: Tree) -> Iterator[Deployment]:
    d = Deployment(before_typed, current_tree(), agents=AGENTS, model_responder=responder)
    try:
        yield d
    finally:
        d.close()


def requests_of(d: Deployment, agent: str) -> list[tuple[str, bool]]:
    """(release of the worker behind it, whether it offered the final-result tool) for each
    of `agent`'s model requests, in order."""
    release = d.release_of_pid()
    return [(release.get(int(r.headers["x-fx-pid"]), "?"),
             FINAL_RESULT_TOOL in [t.get("function", {}).get("name") for t in r.body.get("tools") or []])
            for r in d.model.requests if f"You are {agent}." in system_text(r)]


def create(web: TreeWeb, agent: str, text_in: str) -> str:
    created = httpx.post(f"{web.url}/v1/sessions", json={"agent": agent, "input": text_in}, timeout=10)
    assert created.status_code in (200, 201, 202), created.text
    return str(created.json()["sessionId"])


def kinds(web: TreeWeb, sid: str) -> list[str]:
    return [line["type"] for line in lines(web, sid)]


def store_state(d: Deployment, sid: str) -> Any:
    store = redis_store(d.redis.url, prefix=d.prefix)
    try:
        return store.sync.state(sid)
    finally:
        store.close()


def stored_batches(d: Deployment, sid: str) -> list[bytes]:
    """The journal records of `sid` as stored: its log stream's, or its `rest` value's at rest."""
    keys = session_keys(d.prefix, sid)
    r = redis.Redis.from_url(d.redis.url)
    try:
        rest = r.get(keys.rest)
        if rest:
            return [fields[b"d"] for _, fields in parse_rest(rest)]
        return [fields[b"d"] for _, fields in r.xrange(keys.log)]
    finally:
        r.close()


def with_verdict(batches: list[bytes]) -> list[bytes] | None:
    """`batches` when one holds an `output` verdict (as this release reads them), else None."""
    return batches if any("output" in [kind for kind, _ in decode_batch(raw)] for raw in batches) else None


# Run in a process of the previous release: its own journal decoder on each record's bytes.
_OLD_DECODE = """
import json, sys
from fxengine.journal import records
out = []
for raw in json.load(sys.stdin):
    try:
        out.append({"kinds": [kind for kind, _ in records.decode_batch(bytes.fromhex(raw))]})
    except Exception as exc:
        out.append({"error": type(exc).__name__, "code": str(getattr(exc, "code", "")), "message": str(exc)})
print(json.dumps({"reads": records.FORMAT_VERSION, "records": out}))
"""


def decode_in_previous(tree: Tree, batches: list[bytes]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _OLD_DECODE], input=json.dumps([b.hex() for b in batches]).encode(),
                         env=tree.environment({"REDIS_URL": "redis://127.0.0.1:9/0"}), cwd=tree.root,
                         check=True, capture_output=True, timeout=60)
    return dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))


def test_a_typed_turn_waits_for_a_process_that_types_its_answer(deployment: Deployment) -> None:
    d = deployment
    store = redis_store(d.redis.url, prefix=d.prefix)
    try:
        web = d.web(d.new)
        old_worker = d.worker(d.old, queues=QUEUES)

        # (1) The previous release's worker alone serves both agents. The typed prompt is
        # stored by this release's web; its wake reaches that worker, whose claim takes nothing.
        t0 = time.monotonic()
        typed_sid = create(web, "invoices", "invoice 42, total 17")
        stored = store.sync.state(typed_sid)
        assert stored is not None and stored.newer == TYPED_LEVEL, stored

        def left_to_a_newer_one() -> bool:
            ran = [kind for kind in kinds(web, typed_sid) if kind in ("turn_start", "session_error")]
            assert not ran, f"the previous release's worker ran the typed prompt: {ran}"
            return (f"{typed_sid} needs a process that reads stored layout {TYPED_LEVEL}"
                    in old_worker.log_path.read_text(errors="replace"))

        wait_for("the previous release's worker to leave the typed prompt to a newer one", left_to_a_newer_one)

        # In the same window an untyped prompt to another session runs there, to its end.
        plain_sid = create(web, "notes", "buy milk")
        wait_for("the untyped turn to end", lambda: "turn_end" in kinds(web, plain_sid), TURN_S)
        plain = lines(web, plain_sid)
        assert [line["stopReason"] for line in plain if line["type"] == "turn_end"] == ["end_turn"], plain
        assert "output" not in next(line for line in plain if line["type"] == "turn_end")
        assert "".join(line["delta"] for line in plain if line["type"] == "text_delta") == "noted buy milk"
        assert requests_of(d, "notes") == [("old", False)]

        # A short quiet window more: sweeps and wakes do not get it run by that worker either.
        time.sleep(QUIET_S)
        quiet_s = time.monotonic() - t0
        left = store.sync.state(typed_sid)
        assert left is not None and left.agent == "invoices", left
        assert left.status == "waiting" and left.pending == 1 and left.open_turn is None, left
        assert left.newer == TYPED_LEVEL, left
        assert left.turns == 0 and left.epoch == 0, left
        assert state(web, typed_sid)["status"] == "waiting"
        typed_kinds = kinds(web, typed_sid)
        assert not {"turn_start", "turn_end", "session_error"} & set(typed_kinds), typed_kinds
        assert requests_of(d, "invoices") == [], "the previous release's worker asked the model for the typed turn"

        # (2) The deploy: this release's worker joins, the previous release's stops.
        t1 = time.monotonic()
        new_worker = d.worker(d.new, queues=QUEUES)
        old_worker.stop()
        # Its first answer does not validate: the verdict is stored, and the model asked
        # again; while that request is held, the journal holds the verdict's batch.
        d.model.wait_held(RETRY, timeout_s=TURN_S)
        batches = wait_for("the verdict's batch to be stored",
                           lambda: with_verdict(stored_batches(d, typed_sid)), 10.0)
        d.model.release(RETRY)
        wait_for("the typed turn to end", lambda: "turn_end" in kinds(web, typed_sid), TURN_S)
        ran_s = time.monotonic() - t1
        typed_lines = lines(web, typed_sid)
        assert [line["type"] for line in typed_lines if line["type"] in ("turn_start", "turn_end")] == [
            "turn_start", "turn_end"], typed_lines
        [end] = [line for line in typed_lines if line["type"] == "turn_end"]
        assert end["stopReason"] == "end_turn", end
        assert end["output"] == INVOICE, end
        assert not [line for line in typed_lines if line["type"] == "session_error"]
        assert requests_of(d, "invoices") == [("new", True), ("new", True)]
        assert d.release_of_pid()[new_worker.pid] == "new"  # type: ignore[index]
        wait_for("the typed session to be let go",
                 lambda: (s := store.sync.state(typed_sid)) is not None and s.status == "idle")
        done = store.sync.state(typed_sid)
        assert done is not None and done.newer is None and done.turns == 1 and done.pending == 0, done

        # (3) The batch with the turn's `output` verdict is format 2: the previous release's
        # decoder refuses it as newer, never as damaged, and reads every other batch.
        assert batches, "no journal record of the typed turn was stored while its retry was held"
        assert FORMAT_VERSION == 2
        decoded = decode_in_previous(d.old, batches)
        assert decoded["reads"] == 1, decoded
        refused = [r for r in decoded["records"] if "error" in r]
        read = [r for r in decoded["records"] if "error" not in r]
        assert refused, f"no batch the previous release refuses: {decoded}"
        for r in refused:
            assert (r["error"], r["code"]) == ("FxJournalVersionError", "FX_JOURNAL_VERSION"), decoded
            assert "newer" in r["message"], decoded
        assert read and all("output" not in r["kinds"] for r in read), decoded
        # The refused ones are exactly those holding an `output` verdict (read by this release).
        verdicts = ["output" in [kind for kind, _ in decode_batch(raw)] for raw in batches]
        assert verdicts == ["error" in r for r in decoded["records"]], (verdicts, decoded)
        print(f"\ntyped upgrade: left alone for {quiet_s:.2f}s by the previous release "
              f"(untyped turn ran meanwhile); new worker ran it in {ran_s:.2f}s; "
              f"{len(refused)} of {len(batches)} batches refused as newer by the previous decoder")
    finally:
        store.close()
    trouble = d.trouble()
    assert not trouble, trouble


def test_a_typed_prompt_behind_a_turn_the_previous_release_holds_is_left_to_a_newer_one(
        deployment: Deployment) -> None:
    """Mid-deploy both webs serve: the previous release's web stores an untyped prompt of
    `invoices`, which its worker runs (held on the model); this release's web stores a typed
    prompt behind it on the same session while that worker holds the lease. The worker ends
    its own turn and leaves the typed one (no model request for it, meta `newer` 4); this
    release's worker runs it to `end_turn` with its `output`."""
    d = deployment
    d.model.release(RETRY)  # the typed turn's retry is not held here
    store = redis_store(d.redis.url, prefix=d.prefix)
    try:
        old_web = d.web(d.old)
        new_web = d.web(d.new)
        old_worker = d.worker(d.old, queues=QUEUES)

        sid = create(old_web, "invoices", FIRST)
        d.model.wait_held(FIRST, timeout_s=TURN_S)
        behind = httpx.post(f"{new_web.url}/v1/sessions/{sid}/prompts", json={"input": "invoice 42"}, timeout=10)
        assert behind.status_code == 202, behind.text
        typed_mid = behind.json()["messageId"]
        held = store.sync.state(sid)
        assert held is not None and held.status == "running" and held.pending == 1 and held.newer == TYPED_LEVEL, held
        d.model.release(FIRST)

        wait_for("the previous release's turn to end", lambda: "turn_end" in kinds(new_web, sid), TURN_S)
        wait_for("the previous release's worker to let the session go",
                 lambda: (s := store.sync.state(sid)) is not None and s.lease_holder is None)
        time.sleep(QUIET_S)  # a few sweeps and wakes: that worker does not run the typed prompt
        left = store.sync.state(sid)
        assert left is not None and left.status == "waiting" and left.pending == 1, left
        assert left.newer == TYPED_LEVEL and left.turns == 1, left
        ends = [line for line in lines(new_web, sid) if line["type"] == "turn_end"]
        assert [(e["stopReason"], "output" in e) for e in ends] == [("end_turn", False)], ends
        assert requests_of(d, "invoices") == [("old", False)]

        d.worker(d.new, queues=QUEUES)
        old_worker.stop()
        wait_for("the typed turn to end",
                 lambda: [line for line in lines(new_web, sid) if line["type"] == "turn_end"][1:], TURN_S)
        session_lines = lines(new_web, sid)
        turns = [(line["type"], line["messageId"]) for line in session_lines
                 if line["type"] in ("turn_start", "turn_end")]
        assert turns[2:] == [("turn_start", typed_mid), ("turn_end", typed_mid)], session_lines
        end = [line for line in session_lines if line["type"] == "turn_end"][-1]
        assert end["stopReason"] == "end_turn" and end["output"] == INVOICE, end
        assert requests_of(d, "invoices") == [("old", False), ("new", True), ("new", True)]
        assert not [line for line in session_lines if line["type"] == "session_error"]
    finally:
        store.close()
    trouble = d.trouble()
    assert not trouble, trouble


def test_a_typed_turn_runs_on_a_new_worker_while_the_previous_release_still_runs(deployment: Deployment) -> None:
    """Mid-deploy: this release's worker joins while the previous release's keeps running;
    the typed prompt the previous one left (meta `newer` 4) should run on the new worker
    within a bounded time, not only once every previous-release process is gone."""
    d = deployment
    d.model.release(RETRY)
    web = d.web(d.new)
    old_worker = d.worker(d.old, queues=QUEUES)
    sid = create(web, "invoices", "invoice 42")
    wait_for("the previous release's worker to leave the typed prompt to a newer one",
             lambda: f"{sid} needs a process that reads stored layout {TYPED_LEVEL}"
             in old_worker.log_path.read_text(errors="replace"))
    new_worker = d.worker(d.new, queues=QUEUES)
    guard = redis.Redis.from_url(d.redis.url)
    try:
        def sweeping_pid() -> int | None:
            token = guard.get(sweeper_guard_key(d.prefix))  # "<pid>:<id>" of the process that sweeps
            return int(token.split(b":")[0]) if token else None

        # The previous release's worker came first: its sweeper holds the guard.
        assert wait_for("a sweeper to hold the guard", sweeping_pid) == old_worker.pid
        # A few sweeps (FX_SWEEP_S 0.5) and the guard's life (2.5 s) over: a new worker
        # serving `invoices` has been live all along.
        try:
            wait_for("the typed turn to run on the new worker while the previous one runs too",
                     lambda: "turn_end" in kinds(web, sid), MIXED_TURN_S)
        except AssertionError as exc:
            holder = {old_worker.pid: "the previous release's worker", new_worker.pid: "this release's worker"}
            raise AssertionError(f"{exc}; the sweeper guard is held by {holder.get(sweeping_pid(), sweeping_pid())}, "
                                 f"session {store_state(d, sid)}") from None
    finally:
        guard.close()
    end = [line for line in lines(web, sid) if line["type"] == "turn_end"][-1]
    assert end["stopReason"] == "end_turn" and end["output"] == INVOICE, end
