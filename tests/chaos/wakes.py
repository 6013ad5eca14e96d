"""The broker's wake queues, as a chaos run watches and holds them.

A wake is a kombu message in the Redis list `<prefix>:celery:fx.<agent>` (one per agent,
`System.wake_queue_keys`): a JSON envelope whose `body` is base64 of `[args, kwargs,
embed]`, `args[0]` being `{sessionId, agent, reason}` (`fxworker.wakers.wake_payload`).
A message a worker fetched is no longer in the list (kombu keeps it in its `unacked`
hash while it runs): what the list holds is what is queued, not yet delivered.

- `session_of` reads a list entry's session id (None for anything else: a poison message).
- `WakeSampler` counts, every `SAMPLE_S`, the queued wakes of each session in every wake
  queue, and records each sample in which a session had more than one (`wakes`), and the
  highest count it saw of each session; `final()` records what is left after the drain
  (`wakes_final`).
- `Valve` stands in for a worker pool that is momentarily busy: the workers consume
  `fx.default` only, so the wakes of the agent `late` (which every worker runs) stay in
  `fx.late` until the valve moves them into `fx.default`. It does that every `FORWARD_S`,
  except while a caller holds it closed (`with valve.closed(): ...`): then nothing can
  claim a `late` session, which is how a cancel is sent before any worker claimed its prompt.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from fxworker.keys import live_workers_key
from fxworker.store.types import LAYOUT_LEVEL
from tests.chaos.history import History
from tests.chaos.system import STORE_ERRORS, System

SAMPLE_S = 0.3
FORWARD_S = 0.2


def session_of(raw: bytes) -> str | None:
    """The `sessionId` of a wake message as kombu's Redis transport stores it; None when
    the entry is not one (a poison message, another task)."""
    try:
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        session_id = args[0]["sessionId"]
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error):
        return None
    return session_id if isinstance(session_id, str) else None


def count_queued(entries: list[bytes]) -> Counter[str]:
    """Session id -> how many of `entries` are wakes of it."""
    return Counter(sid for sid in map(session_of, entries) if sid is not None)


class WakeSampler:
    """Samples the wake queues in a thread until `stop()` (see the module doc)."""

    def __init__(self, system: System, history: History) -> None:
        self.system = system
        self.history = history
        self.highest: Counter[str] = Counter()
        self.samples = 0
        self._done = threading.Event()
        self.thread = threading.Thread(target=self.run, name="chaos-wakes", daemon=True)

    def start(self) -> WakeSampler:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self.thread.join(10)

    def sample(self) -> Counter[str]:
        queued: Counter[str] = Counter()
        for key in self.system.wake_queue_keys():
            queued.update(count_queued(self.system.entries(key)))
        self.samples += 1
        for sid, n in queued.items():
            self.highest[sid] = max(self.highest[sid], n)
        return queued

    def run(self) -> None:
        while not self._done.wait(SAMPLE_S):
            try:
                queued = self.sample()
            except STORE_ERRORS:
                continue  # Redis restarting: the next sample
            crowded = {sid: n for sid, n in queued.items() if n > 1}
            if crowded:
                self.history.record("wakes", queued=crowded)

    def final(self) -> dict[str, int]:
        """What the queues hold once the run drained, recorded as `wakes_final`."""
        queued = dict(self.sample())
        self.history.record("wakes_final", queued=queued, samples=self.samples)
        return queued


class Valve:
    """Holds the `late` agent's wakes back while closed, forwards them otherwise."""

    def __init__(self, system: System, source: str, target: str) -> None:
        self.system = system
        self.source = source
        self.target = target
        self.forwarded = 0
        self._closed = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.thread = threading.Thread(target=self.run, name="chaos-valve", daemon=True)

    def start(self) -> Valve:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self.thread.join(10)
        self.forward()

    @contextmanager
    def closed(self) -> Iterator[None]:
        with self._lock:
            self._closed += 1
        try:
            yield
        finally:
            with self._lock:
                self._closed -= 1
        self.forward()

    def forward(self) -> int:
        """Moves every queued `late` wake into the served queue (LMOVE keeps each message
        whole and in order), unless a caller holds the valve closed."""
        moved = 0
        with self._lock:
            if self._closed:
                return 0
            try:
                while self.system.retrying(lambda r: r.lmove(self.source, self.target, "RIGHT", "LEFT"),
                                           timeout_s=5.0, broker=True) is not None:
                    moved += 1
            except STORE_ERRORS:
                pass  # Redis restarting: the next round
        self.forwarded += moved
        return moved

    def run(self) -> None:
        while not self._done.wait(FORWARD_S):
            self.forward()
            self.mark_live()

    def mark_live(self) -> None:
        """Writes the valve's live mark (fxworker/store/_live.py's layout): it is what runs
        `late` wakes, as a worker consuming `fx.late` would be, always busy, so the sweepers
        count `late` as served and never take one of its held wakes for lost. It reads what
        this release stores (`reads`): without it the mark counts as a process of a release
        before layout levels, and every decision is refused FX_UPGRADE_IN_PROGRESS."""
        body = json.dumps({"v": 1, "agents": ["late"], "expiresMs": int(time.time() * 1000) + 3500,
                           "freeSinceMs": None, "tookSentMs": 0, "host": "chaos-valve", "pid": os.getpid(),
                           "reads": LAYOUT_LEVEL})
        try:
            self.system.retrying(lambda r: r.hset(live_workers_key(self.system.prefix), "chaos-valve", body),
                                 timeout_s=2.0)
        except STORE_ERRORS:
            pass  # Redis restarting: the next round

