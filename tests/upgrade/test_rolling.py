"""A rolling upgrade from the previous release (`previous.PREVIOUS_RELEASE`) to this code,
and a downgrade back, under load on one Redis and one prefix.

The deploy as it happens in production, one step at a time, a round of turns on 20
sessions after each (`load.run_round`: each prompt sent through one web, its stream read
through another):
  A. the previous release alone: its web and two of its workers;
  B. the new web joins (webs first), the old workers still run every turn;
  C. two new workers join: old and new workers take the sessions in turn, two rounds;
  D. the old workers stop (SIGTERM): the old web still serves and reads what new workers packed;
  E. the old web stops: the new code alone;
  F. downgrade: the new processes stop, an old web and worker run a turn on 10 sessions
     the new code wrote last;
  G. upgrade again: a new web and worker finish whatever F left waiting, and one more round.
After each phase every session's stream is read whole, and from its middle (often inside a
packed chunk), through every web up, and the reads compared (`load.sweep`). After D the
test counts how the store held what the old web read (chunks the new code packed carry a
checksum field); after C and E it asks the new code's layout gate (`layout_all_read`)
which stored layout a writer may use: while old processes live, none newer than they read;
with the new code alone, its own.

Must hold: no turn ended `error`, no stream broke (every read reached its turn's
`turn_end` with contiguous cursors, both webs read the same lines), no effect ran twice
(`tests.chaos.tooling` records each start by execution id), every acknowledged prompt ended
exactly once by the end. In F alone, a prompt may instead be refused, or end `error`,
with `FX_JOURNAL_VERSION` ("written by a newer fxworker"), or still wait: G runs it.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from typing import Any

import pytest
import redis

from fxengine.codes import Code
from fxworker.keys import session_keys
from fxworker.store._packed import CHECKPOINT_MAGIC
from tests.chaos.faults import pid_of, turn_prompt
from tests.chaos.tooling import runs_key
from tests.upgrade.deployment import Deployment
from tests.upgrade.load import Conversation, Ledger, Turn, follow, run_round, sweep

SESSIONS = 20
DOWNGRADE_SESSIONS = 10
# In F the previous release may leave a prompt waiting: this long is its chance to run it.
DOWNGRADE_TURN_S = 15.0
# The stored layout level the previous release reads (it predates the live marks' `reads`).
PREVIOUS_LAYOUT_LEVEL = 1
MAX_LISTED = 60  # failures the assertion lists (the count says how many more)

pytestmark = [pytest.mark.slow, pytest.mark.celery, pytest.mark.timeout(300)]


def test_rolling_upgrade_and_downgrade(deployment: Deployment) -> None:
    d = deployment
    ledger = Ledger()
    talks = [Conversation(i, ledger) for i in range(SESSIONS)]
    started = time.monotonic()

    old_web = d.web(d.old)
    old_workers = [d.worker(d.old), d.worker(d.old)]
    run_round("A old alone", talks, [old_web])
    sweep(ledger, "A old alone", talks, [old_web])

    new_web = d.web(d.new)
    run_round("B new web, old workers", talks, [old_web, new_web])
    sweep(ledger, "B new web, old workers", talks, [old_web, new_web])

    new_workers = [d.worker(d.new), d.worker(d.new)]
    run_round("C mixed", talks, [old_web, new_web])
    run_round("C mixed", talks, [new_web, old_web])
    sweep(ledger, "C mixed", talks, [old_web, new_web])
    gate_mixed = _layout_gate(d)

    for worker in old_workers:
        worker.stop()
    run_round("D new workers, both webs", talks, [old_web, new_web])
    sweep(ledger, "D new workers, both webs", talks, [old_web, new_web])
    packed_for_old_web = _census(d, talks)

    old_web.stop()
    run_round("E new alone", talks, [new_web])
    sweep(ledger, "E new alone", talks, [new_web])
    gate_alone = _layout_gate(d)

    new_web.stop()
    for worker in new_workers:
        worker.stop()
    old_web = d.web(d.old)
    old_worker = d.worker(d.old)
    run_round("F downgrade", talks[:DOWNGRADE_SESSIONS], [old_web], pairs_every=0, turn_timeout_s=DOWNGRADE_TURN_S)
    sweep(ledger, "F downgrade", talks, [old_web])

    old_web.stop()
    old_worker.stop()
    new_web = d.web(d.new)
    d.worker(d.new)
    left = [t for t in ledger.turns.values() if t.acked and t.end is None]
    for turns in _by_session(left).values():
        follow(ledger, "G upgrade again", new_web, turns, timeout_s=30.0)
    run_round("G upgrade again", talks, [new_web])
    stored = sweep(ledger, "G upgrade again", talks, [new_web])

    report = _report(d, ledger, stored, left, time.monotonic() - started)
    report.notes.append(f"stored when the old web read every session in D: {dict(packed_for_old_web)}")
    if not packed_for_old_web["checksummed chunks"]:
        report.failures.append("no chunk the new code packed was stored when the old web read the sessions in D")
    _check_gate(report, gate_mixed, gate_alone, old_processes=len(old_workers) + 1)
    print(report)
    failures = report.failures[:MAX_LISTED] + [f"... and {len(report.failures) - MAX_LISTED} more"] * (
        len(report.failures) > MAX_LISTED)
    assert not report.failures, f"{len(report.failures)} failures:\n" + "\n".join(failures) + "\n\n" + str(report)


def _layout_gate(d: Deployment) -> tuple[int, int, int] | None:
    """(the stored layout level the new code would let a writer use now, its own level, how
    many live marks it read), or None in a tree with no such gate (`liveness.layout_all_read`)."""
    try:
        from fxworker.liveness import layout_all_read
        from fxworker.store import redis_store
        from fxworker.store.types import LAYOUT_LEVEL
    except ImportError:
        return None
    store = redis_store(d.redis.url, prefix=d.prefix)
    try:
        marks = store.sync.live_workers()
    finally:
        store.close()
    return layout_all_read(marks), LAYOUT_LEVEL, len(marks)


def _check_gate(report: Report, mixed: tuple[int, int, int] | None, alone: tuple[int, int, int] | None, *,
                old_processes: int) -> None:
    """While processes of the previous release run, the gate must not let a layout they cannot
    read be written (they read level `PREVIOUS_LAYOUT_LEVEL`); once the new code runs alone it
    advances to its own level."""
    if mixed is None or alone is None:
        report.notes.append("layout gate: none in this tree")
        return
    level, own, marks = mixed
    report.notes.append(f"layout gate with {old_processes} old processes live: level {level} of {own} "
                        f"({marks} live marks read); new code alone: level {alone[0]} ({alone[2]} marks)")
    if level > PREVIOUS_LAYOUT_LEVEL:
        report.failures.append(f"layout gate: with {old_processes} processes of the previous release live (they read "
                               f"level {PREVIOUS_LAYOUT_LEVEL}), layout_all_read answers level {level}: it sees only "
                               f"the {marks} live marks, and the previous release writes none")
    if alone[0] != alone[1]:
        report.failures.append(f"layout gate: with the new code alone, level {alone[0]}, not its own {alone[1]}")


def _census(d: Deployment, talks: list[Conversation]) -> Counter[str]:
    """How the sessions' lines and checkpoints are stored: packed chunks with the new code's
    checksum (`s`) or without (the previous release's), plain line entries, compressed checkpoints."""
    found: Counter[str] = Counter()
    client = redis.Redis.from_url(d.redis.url)
    try:
        for talk in talks:
            if talk.session_id is None:
                continue
            keys = session_keys(d.prefix, talk.session_id)
            for _, fields in client.xrange(keys.ui):
                if b"z" in fields:
                    found["checksummed chunks" if b"s" in fields else "chunks without checksum"] += 1
                else:
                    found["plain lines"] += 1
            checkpoint = client.hget(keys.ckpt, "data")
            if checkpoint is not None:
                found["compressed checkpoints" if checkpoint.startswith(CHECKPOINT_MAGIC) else "plain checkpoints"] += 1
    finally:
        client.close()
    return found


def _by_session(turns: list[Turn]) -> dict[str, list[Turn]]:
    found: dict[str, list[Turn]] = defaultdict(list)
    for turn in turns:
        assert turn.session_id is not None
        found[turn.session_id].append(turn)
    return found


class Report:
    """What the run did and every way it failed, as the test's output says it."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.notes: list[str] = []

    def __str__(self) -> str:
        return "\n".join(self.notes)


def _report(d: Deployment, ledger: Ledger, stored: dict[str, list[dict[str, Any]]], left: list[Turn],
            elapsed_s: float) -> Report:
    report = Report()
    turns = list(ledger.turns.values())
    downgrade = "F downgrade"
    version = Code.JOURNAL_VERSION.value

    ran_by = _ran_by(d)
    for phase in dict.fromkeys(t.phase for t in turns):
        mine = ledger.of(phase)
        ends = Counter((t.end or {}).get("stopReason", "none") for t in mine)
        releases = Counter(ran_by.get(t.prompt, "-") for t in mine)
        took = sorted(t.took_s for t in mine if t.took_s is not None)
        latency = f", ack to end median {took[len(took) // 2]:.2f}s max {took[-1]:.2f}s" if took else ""
        report.notes.append(f"{phase}: {len(mine)} prompts, {sum(t.acked for t in mine)} acked, "
                            f"ends {dict(ends)}, run by {dict(releases)}{latency}")

    for t in turns:
        allowed = t.phase == downgrade
        if t.refused is not None and not (allowed and t.refused[1] == version):
            report.failures.append(f"{t.phase}: {t.prompt} refused via {t.sent_via}: {t.refused}")
        error = t.error
        if error is not None and not (allowed and error[0] == version):
            report.failures.append(f"{t.phase}: {t.prompt} (session {t.session_id}, sent via {t.sent_via}, "
                                   f"run by {_worker(ran_by, t.prompt)}) ended error {error[0]} {error[1]!r}")
        if t.acked and t.end is None:
            report.failures.append(f"{t.phase}: {t.prompt} (session {t.session_id}) acked, never ended")
    for turn in left:
        where = "ended " + str((turn.end or {}).get("stopReason")) if turn.end else "still waiting"
        report.notes.append(f"not seen to end in {turn.phase}: {turn.prompt} -> after the upgrade again: {where}")

    report.failures.extend(f"broken stream: {b}" for b in ledger.broken)

    ends = Counter(line.get("messageId") for lines in stored.values() for line in lines if line["type"] == "turn_end")
    for t in turns:
        if t.acked and ends[t.message_id] != 1:
            report.failures.append(f"{t.prompt} ({t.message_id}, {t.phase}) has {ends[t.message_id]} turn_end lines "
                                   f"stored")

    client = redis.Redis.from_url(d.redis.url)
    try:
        runs = [json.loads(raw) for raw in client.lrange(runs_key(d.prefix), 0, -1)]
    finally:
        client.close()
    effects = Counter(run["x"] for run in runs if run["tool"] == "effect")
    report.notes.append(f"effect starts: {sum(effects.values())} over {len(effects)} calls")
    report.failures.extend(f"effect {x} ran {n} times" for x, n in effects.items() if n > 1)

    handoffs = _handoffs(ledger, ran_by)
    report.notes.append(f"handoffs between releases' workers within a session: {dict(handoffs)}")
    if not handoffs["new->old"]:
        report.failures.append("no session went from a new worker to an old one: the mix was not exercised")

    for name, lines in d.trouble().items():
        report.notes.append(f"log of {name}:\n  " + "\n  ".join(lines))
    report.notes.append(f"{len(turns)} prompts in {elapsed_s:.0f}s")
    return report


def _worker(ran_by: dict[str, str], prompt: str) -> str:
    release = ran_by.get(prompt)
    return f"an {release} worker" if release else "a worker that made no model request for it"


def _ran_by(d: Deployment) -> dict[str, str]:
    """Prompt -> the release of the worker that made its turn's first model request."""
    release = d.release_of_pid()
    found: dict[str, str] = {}
    for request in d.model.requests:
        prompt = turn_prompt(request)[0]
        try:
            found.setdefault(prompt, release.get(pid_of(request), "?"))
        except (KeyError, ValueError):
            continue
    return found


def _handoffs(ledger: Ledger, ran_by: dict[str, str]) -> Counter[str]:
    """Consecutive turns of one session run by workers of different releases, by direction."""
    found: Counter[str] = Counter()
    for turns in _by_session([t for t in ledger.turns.values() if t.acked]).values():
        releases = [ran_by[t.prompt] for t in turns if t.prompt in ran_by]
        for before, after in zip(releases, releases[1:]):
            if before != after:
                found[f"{before}->{after}"] += 1
    return found
