"""The callers of a chaos run: what clients do that no fault does, on a seeded schedule.

Every few seconds (`GAP_S`, drawn from the seed) one of:

- `cancel_early`: a prompt cancelled before any worker claimed it, twice: once on a
  session of the agent `late` while the valve holds its wakes (`tests.chaos.wakes.Valve`:
  no worker can claim it until the cancel is stored), once on a `default` session back to
  back (create, then cancel at once: a race with the worker the wake reaches). Each is
  recorded (`caller`) with the session's epoch read after the cancel was acknowledged: 0
  means no claim came before it (`before_claim`), which the checker counts;
- `storm`: a burst of `STORM_SIZE` steers and cancels, in a seeded order, that one driver
  sends back to back at its next step (`tests.chaos.workload.Storms`), against the turn it
  runs and the prompts waiting behind it;
- `cancel_parked`: a `delegate:<tag>` prompt on a new `default` session (its turn parks
  until its child sessions' turns answer, `tests.chaos.workload`), cancelled once its
  state reads `paused` (or after `PARK_WAIT_S`): the cancel travels down to the children,
  whose turns must end all the same (the checker's `delegation:` rules). Recorded
  (`caller`) with the status read when the cancel was sent;
- `ghost`: a session of the agent `ghost`, which the web process knows and no worker runs:
  a prompt, a steer and a second prompt. A watcher reads its state (`GET
  /v1/sessions/{id}`) every `GHOST_POLL_S` until it is no longer `waiting` (or
  `NO_AGENT_GIVE_UP_S` + `GHOST_SLACK_S` passed) and records what it saw (`ghost`):
  whether `noWorker` showed while it waited.

The first round does each kind once, in a seeded order (so every run has each), then kinds
are drawn by `WEIGHTS` until `stop_at`. Each caller session (`c<n>`, `g<n>`) is a
`SessionDriver` of its own with a reader, so §11 covers it as it covers the drivers'.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from tests.chaos.history import History
from tests.chaos.system import NO_AGENT_GIVE_UP_S
from tests.chaos.wakes import Valve
from tests.chaos.workload import Driver, SessionDriver

KINDS = ("cancel_early", "storm", "ghost", "cancel_parked")
WEIGHTS = {"cancel_early": 2, "storm": 3, "ghost": 1, "cancel_parked": 1}
GAP_S = (1.5, 4.0)
STORM_SIZE = (3, 8)
GHOST_POLL_S = 0.25
PARK_WAIT_S = 8.0  # cancel_parked: how long to wait for the delegating turn to park
PARK_POLL_S = 0.1
# How long past the give-up a ghost session's inputs may take to end: the next sweep or
# wake after the give-up ends them (the sweep is 0.5 s; a store fault may delay it).
GHOST_SLACK_S = 20.0


class Callers:
    """Runs the callers' schedule in a thread until `stop_at`."""

    def __init__(self, base_url: str, seed: int, history: History, stop_at: float, *, drivers: list[Driver],
                 valve: Valve) -> None:
        self.base_url = base_url
        self.seed = seed
        self.history = history
        self.stop_at = stop_at
        self.drivers = drivers
        self.valve = valve
        self.rng = random.Random(f"callers-{seed}")
        self.sessions: list[SessionDriver] = []
        self._n = 0
        self._done = threading.Event()
        self._watchers: list[threading.Thread] = []
        self.thread = threading.Thread(target=self.run, name="chaos-callers", daemon=True)

    def start(self) -> Callers:
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Ends the schedule (the running action completes) and waits for it."""
        self._done.set()
        self.thread.join(timeout_s)

    def join_watchers(self, timeout_s: float = 60.0) -> None:
        """Waits until every ghost session's watcher recorded what it saw."""
        for t in self._watchers:
            t.join(timeout_s)

    def schedule(self) -> Iterator[str]:
        first = list(KINDS)
        self.rng.shuffle(first)
        yield from first
        while True:
            yield self.rng.choices(KINDS, [WEIGHTS[k] for k in KINDS])[0]

    def run(self) -> None:
        for i, kind in enumerate(self.schedule()):
            gap = self.rng.uniform(*GAP_S)
            if i < len(KINDS):
                time.sleep(gap)  # the first round always completes: every run has each kind
            elif self._done.wait(gap) or time.monotonic() >= self.stop_at:
                return
            try:
                getattr(self, f"act_{kind}")()
            except Exception as exc:  # recorded, not fatal: the checker counts the kinds done
                self.history.record("caller_failed", action=kind, error=repr(exc))

    # ------------------------------------------------------------------ actions

    def _session(self, prefix: str, agent: str, wait_until: float | None = None) -> SessionDriver:
        self._n += 1
        session = SessionDriver(f"{prefix}{self._n}", self.base_url, self.seed, self.history, self.stop_at,
                                agent=agent, wait_until=wait_until)
        self.sessions.append(session)
        return session

    def act_cancel_early(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=10.0) as http:
            with self.valve.closed():
                self._cancelled_prompt(http, self._session("c", "late"), held=True)
            self._cancelled_prompt(http, self._session("c", "default"), held=False)

    def _cancelled_prompt(self, http: httpx.Client, session: SessionDriver, *, held: bool) -> None:
        """A new session's prompt, cancelled at once; its epoch read after the cancel."""
        message_id = f"m-{self.seed}-{session.tag}.0"
        try:
            if not session.send(http, "prompt", f"echo:{session.tag}.0", message_id) or not session.cancel(http):
                return
            epoch = session.state(http).get("epoch")
        finally:
            if session.reader is not None:
                session.reader.retire({message_id})
        self.history.record("caller", action="cancel_early", session=session.session_id, agent=session.agent,
                            messageId=message_id, held=held, epoch=epoch, before_claim=epoch == 0)

    def act_storm(self) -> None:
        size = self.rng.randint(*STORM_SIZE)
        kinds = ["steer", "cancel", *(self.rng.choice(("steer", "cancel")) for _ in range(size - 2))]
        self.rng.shuffle(kinds)
        driver = self.rng.choice(self.drivers)
        driver.storms.ask(kinds)
        self.history.record("caller", action="storm", driver=driver.index, kinds=kinds)

    def act_cancel_parked(self) -> None:
        session = self._session("d", "default")
        message_id = f"m-{self.seed}-{session.tag}.0"
        status = None
        with httpx.Client(base_url=self.base_url, timeout=10.0) as http:
            try:
                if not session.send(http, "prompt", f"delegate:{session.tag}.0", message_id):
                    return
                deadline = time.monotonic() + PARK_WAIT_S
                while time.monotonic() < deadline:
                    status = session.state(http).get("status")
                    if status == "paused":
                        break
                    time.sleep(PARK_POLL_S)
                if not session.cancel(http):
                    return
            finally:
                if session.reader is not None:
                    session.reader.retire({message_id})
        self.history.record("caller", action="cancel_parked", session=session.session_id, messageId=message_id,
                            status=status)

    def act_ghost(self) -> None:
        started = time.monotonic()
        session = self._session("g", "ghost", wait_until=started + NO_AGENT_GIVE_UP_S + GHOST_SLACK_S)
        prompts = []
        with httpx.Client(base_url=self.base_url, timeout=10.0) as http:
            try:
                for kind, text_, message_id in (
                    ("prompt", f"echo:{session.tag}.0", f"m-{self.seed}-{session.tag}.0"),
                    ("steer", f"steer:{session.tag}.0.0", f"m-{self.seed}-{session.tag}.0-s0"),
                    ("prompt", f"echo:{session.tag}.1", f"m-{self.seed}-{session.tag}.1"),
                ):
                    if not session.send(http, kind, text_, message_id):
                        break
                    if kind == "prompt":
                        prompts.append(message_id)
            finally:
                if session.reader is not None:
                    session.reader.retire(set(prompts))
        if session.session_id is None:
            return
        self.history.record("caller", action="ghost", session=session.session_id, agent="ghost")
        watcher = threading.Thread(target=self._watch_ghost, args=(session,), name=f"chaos-ghost-{session.name}",
                                   daemon=True)
        watcher.start()
        self._watchers.append(watcher)

    def _watch_ghost(self, session: SessionDriver) -> None:
        """Reads a ghost session's state until it stops waiting; records what it saw."""
        assert session.wait_until is not None
        statuses: dict[str, int] = {}
        no_worker: dict[str, Any] | None = None
        last: dict[str, Any] = {}
        with httpx.Client(base_url=self.base_url, timeout=5.0) as http:
            while time.monotonic() < session.wait_until:
                last = session.state(http)
                status = str(last.get("status"))
                statuses[status] = statuses.get(status, 0) + 1
                if no_worker is None and status == "waiting" and last.get("noWorker"):
                    no_worker = {"t": round(self.history.now(), 3), **last["noWorker"]}
                if last and status != "waiting":
                    break
                time.sleep(GHOST_POLL_S)
        self.history.record("ghost", session=session.session_id, statuses=statuses, no_worker=no_worker,
                            last=last)
