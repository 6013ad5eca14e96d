"""Which agents live workers run, and which wakes are outstanding (§7).

Each worker process writes its own mark every second (`heartbeat`): the agents it runs,
whether a delivery runs on it, and the send time of the newest wake it started. The
sweeper reads them (`live_workers`) to know which agents are served at all (a session of
an agent nobody runs waits with `noWorker` and is never woken through the broker) and
whether a wake it queued earlier can still be on its way. `mark_woken` notes a wake the
sweeper or a delivery queued; accept.lua and cancel.lua note the senders' own.

A mark is stored as JSON with a layout version (`MARK_VERSION`); `live_workers` reads only
the versions it knows and says once which ones it skipped, so old and new workers can
share a store during a deploy.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from .. import scripts
from ..keys import live_workers_key
from ..scripts import Command, Step
from . import _replies as r
from ._core import Op, Plan, StoreCore, one_call, several_calls
from .types import WorkerMark

log = logging.getLogger("fxworker.store")

MARK_VERSION = 1
# A mark expired this long is deleted by the next read (a crashed worker leaves one behind).
STALE_MARK_MS = 60_000
# The whole hash outlives its newest mark by this much: a deployment gone leaves nothing.
LIVE_KEY_TTL_MS = 3_600_000

_skipped_versions: set[Any] = set()


def _mark_woken(
    core: StoreCore, session_ids: Sequence[str], *, now_ms: int | None = None, trust_ms: int = 0
) -> Op[list[bool]]:
    """Notes that a wake of each session is queued at `now_ms` (woken.lua); per session,
    whether to send it: False for a session the store does not hold (nothing is created
    for it) or, with `trust_ms`, one whose outstanding wake was noted less than that ago."""
    now = core.now(now_ms)
    steps: list[Step] = [scripts.woken(core.keys(sid), now_ms=now, trust_ms=trust_ms) for sid in session_ids]
    return Op(steps, lambda replies: [bool(x) for x in replies])


def _heartbeat(core: StoreCore, mark: WorkerMark) -> Op[None]:
    """Writes this worker's mark (it holds until `mark.expires_ms`)."""
    key = live_workers_key(core.prefix)
    body = json.dumps({
        "v": MARK_VERSION, "agents": list(mark.agents), "expiresMs": mark.expires_ms,
        "freeSinceMs": mark.free_since_ms, "tookSentMs": mark.took_sent_ms, "host": mark.host, "pid": mark.pid,
        "reads": mark.reads,
    }, separators=(",", ":"))
    steps: list[Step] = [Command(("HSET", key, mark.worker_id, body), key=key),
                         Command(("PEXPIRE", key, mark.expires_ms - core.now(None) + LIVE_KEY_TTL_MS), key=key)]
    return Op(steps, lambda _replies: None)


def _forget_worker(core: StoreCore, worker_id: str) -> Op[None]:
    """Deletes this worker's mark (it stops: its agents are no longer served by it)."""
    key = live_workers_key(core.prefix)
    return Op([Command(("HDEL", key, worker_id), key=key)], lambda _replies: None)


def _live_workers(core: StoreCore, *, now_ms: int | None = None) -> Plan[list[WorkerMark]]:
    """The marks of the worker processes alive at `now_ms`; deletes those expired for
    `STALE_MARK_MS`. A mark of a layout this process does not know is skipped."""
    now = core.now(now_ms)
    key = live_workers_key(core.prefix)
    raw = yield Op([Command(("HGETALL", key), key=key)], lambda replies: replies[0], read=True)
    pairs = raw.items() if isinstance(raw, dict) else zip(raw[::2], raw[1::2])
    live, stale = [], []
    for field, value in pairs:
        worker_id = r.text(field)
        mark = parse_mark(worker_id, value)
        if mark is None:
            continue
        if mark.expires_ms > now:
            live.append(mark)
        elif mark.expires_ms + STALE_MARK_MS <= now:
            stale.append(worker_id)
    if stale:
        yield Op([Command(("HDEL", key, *stale), key=key)], lambda _replies: None)
    return live


def parse_mark(worker_id: str, value: bytes | str) -> WorkerMark | None:
    """A stored mark, checked; None (said once per version) for one this process cannot read."""
    try:
        body = json.loads(value)
        version = body.get("v") if isinstance(body, dict) else None
        if version != MARK_VERSION:
            _skip(version, worker_id, "newer" if isinstance(version, int) and version > MARK_VERSION else "unknown")
            return None
        agents = body["agents"]
        idle = body["freeSinceMs"]
        if not (isinstance(agents, list) and all(isinstance(a, str) for a in agents)
                and isinstance(body["expiresMs"], int) and (idle is None or isinstance(idle, int))
                and isinstance(body["tookSentMs"], int)):
            raise ValueError("a field has the wrong type")
        reads = body.get("reads", 1)
        if not isinstance(reads, int):
            raise ValueError("reads is not a layout level")
        return WorkerMark(worker_id, tuple(agents), body["expiresMs"], idle, body["tookSentMs"],
                          str(body.get("host", "")), int(body.get("pid", 0)), reads)
    except (ValueError, KeyError, TypeError) as exc:
        _skip(f"malformed: {exc}", worker_id, "malformed")
        return None


def _skip(version: Any, worker_id: str, why: str) -> None:
    if version in _skipped_versions:
        return
    _skipped_versions.add(version)
    log.warning("the live mark of worker %s is %s (layout %r; this process reads %s): it is not counted",
                worker_id, why, version, MARK_VERSION)


def _note_wait(core: StoreCore, session_id: str, *, due_ms: int, timeout_s: float) -> Op[None]:
    """Notes that `session_id`'s parked turn waits until `due_ms` at most (a wait of
    `timeout_s`): past it the sweeper denies its waiting calls (`waits_due`)."""
    key = core.index.waits
    return Op([Command(("ZADD", key, due_ms, f"{timeout_s:g}|{session_id}"), key=key)], lambda _replies: None)


def _waits_due(core: StoreCore, *, now_ms: int, limit: int = 100) -> Op[list[tuple[str, float, str]]]:
    """The noted waits due by `now_ms`: (member, timeout s, session id), oldest first."""
    key = core.index.waits
    step = Command(("ZRANGEBYSCORE", key, "-inf", now_ms, "LIMIT", 0, limit), key=key)

    def parse(replies: list[Any]) -> list[tuple[str, float, str]]:
        due = []
        for raw in replies[0]:
            member = r.text(raw)
            timeout, _, session_id = member.partition("|")
            try:
                due.append((member, float(timeout), session_id))
            except ValueError:
                due.append((member, 0.0, ""))  # not a wait this release wrote: forgotten
        return due

    return Op([step], parse, read=True)


def _forget_waits(core: StoreCore, members: Sequence[str]) -> Op[None]:
    key = core.index.waits
    return Op([Command(("ZREM", key, *members), key=key)], lambda _replies: None)


class LiveOperations:
    """The liveness operations of `RedisStore` (awaitable) and `store.sync` (blocking)."""

    mark_woken = one_call(_mark_woken)
    heartbeat = one_call(_heartbeat)
    forget_worker = one_call(_forget_worker)
    live_workers = several_calls(_live_workers)
    note_wait = one_call(_note_wait)
    waits_due = one_call(_waits_due)
    forget_waits = one_call(_forget_waits)
