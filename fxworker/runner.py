"""The runner: one delivery's work on one session under one lease (§5-§7).

    claim → load → [resume the open turn | start the next pending input]* → release

Every write is fenced by the claim's epoch. While a turn runs the runner renews the lease
every `lease_s / 3` (`LeaseKeeper`: a refused renewal detaches the turn at once), follows
the inbox for steers, prompts and cancels (`InboxWatcher`), and keeps the delivery's
`Deadline` (fxworker/deadline.py): at the soft stop the turn yields; at the hard stop a
call still running is cut off (the turn is detached, `release(cutoff=True)` counts one
more cut-off of the step, `session.deadline`). A warm shutdown (SIGTERM) pulls both in and
yields the turn at once (`Turn.yield_now()`): a request that ends within the reserve
finishes and the turn yields cleanly, with no cut-off counted.

A turn's `turn_end` (or `turn_yield`) line is stored in the same fenced call as the
engine's end (or yield) record, so a turn the store holds as ended always shows its end.

Each turn (or input ended without one) is a `TurnRun` (fxworker/turns.py), made from the
claim's engine and the delivery's `LineWriter`: it owns the turn's id, its lines and its
one end. The next delivery writes `turn_resume {interrupted, retract}` and continues. A step cut
off 3 times in a row is not run again (a tool call is answered as possibly run, a model
request cancels the turn); a turn whose workers died 3 times with no progress between is
cancelled (poison), so the prompts behind it run.

Any other exception ends what it hit, and the delivery goes on (nothing loops for ever):
the open turn, or the input whose turn could not open (a model setting the engine
refuses, a checkpoint it cannot read), ends `error` with the exception's `FX_` code
(`FX_TURN_FAILED` for one without), a `turn_end` and a `session_error` line, and
`session.error`. When even that cannot be written the lease is left to expire: the next
claim counts a death of the turn, or of the first pending input, and the delivery after
the third such death ends it as poison. An input whose stored fields do not decode ends
`FX_INVALID_INPUT` the same way. A turn whose poison ending itself died (its journal
kills the process that loads it) is ended at the next death without loading the journal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
import logging
from typing import Any

import httpx

from . import delegation, metrics, registry, typed
from .deadline import Deadline
from .errors import FxLeaseLostError, FxStoreUnavailableError
from .ids import new_holder_id, now_ms
from .leases import LeaseKeeper
from .liveness import layout_all_read
from .protocol import Outcome, RunResult, WorkerAgent
from .runtime import StopSignal
from .store import RedisStore
from .store.persistence import LineWriter, retry_unavailable
from .store.types import (
    DELEGATED_LEVEL, LAYOUT_LEVEL, PARKED_LEVEL, TYPED_LEVEL, Claim, Idle, Input, Newer, Released, Serving, Unserved,
)
from .turns import MAX_CUTOFFS, MAX_DEATHS, STOPS, Closed, Stopped, TurnRun, Unsettled
from .waiting import Waiting
from .watch import InboxWatcher
from .work import MAX_FUTILE_CLAIMS, Work

__all__ = ["MAX_CUTOFFS", "MAX_DEATHS", "MAX_FUTILE_CLAIMS", "Runner", "Stopped"]

log = logging.getLogger("fxworker.runner")

CLAIM_RETRY_MS = 2000  # how long a claim retries a store that does not answer
_STOPS = STOPS  # the delivery's own stops, which no turn takes for a failure of its own


class Runner:
    """Runs one session for one delivery: `run()` returns a `RunResult` (protocol.py)."""

    def __init__(
        self,
        agent: WorkerAgent,
        session_id: str,
        *,
        deadline_ms: int,
        reason: str = "wake",
        http_client: httpx.AsyncClient | None = None,
        stopping: StopSignal | None = None,
        closing: StopSignal | None = None,
    ) -> None:
        self.agent = agent
        self.store: RedisStore = agent.store
        self.session_id = session_id
        self.reason = reason
        self.http_client = http_client
        self.deadline = Deadline(deadline_ms, int(agent.reserve_s * 1000), stopping)  # stopping: set on warm shutdown
        self.closing = closing  # set as the worker's loop closes (`LoopThread.close`)
        self.holder = new_holder_id()
        self.lease_ms = int(agent.lease_s * 1000)
        self._claimed: Claim | None = None
        self.epoch = 0
        self.waiting = Waiting()
        self.work: Work | None = None  # what the claim runs, and the turn it is on
        self.stopped = Stopped(0)  # why this delivery stops short of its work, if it does
        self.writer: LineWriter | None = None
        self.released: Released | None = None  # the store's answer to this delivery's release
        self.owner: str | None = None  # the owning agent, when run() answers MISROUTED
        self.unserved: Unserved | None = None  # and the store's backoff, when nothing was claimed

    @property
    def claim(self) -> Claim:
        """What the claim found (the work and its turns read it once the lease is held)."""
        if self._claimed is None:
            raise RuntimeError(f"{self.session_id} is not claimed yet")
        return self._claimed

    @property
    def current(self) -> TurnRun | None:
        """The turn (or input) the claim's work is on."""
        return self.work.current if self.work is not None else None

    def __repr__(self) -> str:
        turn = self.current.turn_id if self.current is not None else None
        return (
            f"<Runner session={self.session_id} epoch={self.epoch} turn={turn} "
            f"deadline_in_ms={self.deadline.deadline_ms - now_ms()} stopped={self.stopped!r}>"
        )

    # ------------------------------------------------------------------ diagnostics

    def emit(self, type_: str, **fields: Any) -> None:
        event = {"type": type_, "sessionId": self.session_id, **fields}
        log.info("%s session=%s epoch=%s %s", type_, self.session_id, self.epoch, fields)
        self.agent.emit(event)


    async def run(self) -> RunResult:
        """Claims the session and runs it; `MISROUTED` when it belongs to another agent
        (`owner` names it; the lease was let go at once).

        Raises `FxUnknownSessionError` for a session the store does not know, and
        `FxStoreUnavailableError` when the claim met an outage for `CLAIM_RETRY_MS`.
        """
        outcome = await self._run()
        return RunResult(outcome, self.agent, self.owner, self.unserved, self.released)

    async def _run(self) -> Outcome:
        claim = await self._claim()
        if isinstance(claim, Outcome):
            return claim
        self._claimed = claim
        self.epoch = claim.epoch
        if claim.taken_over:
            metrics.TAKEOVERS.inc()
            turn = claim.open_turn.message_id if claim.open_turn else None
            self.emit("session.takeover", epoch=self.epoch, turn=turn, deaths=claim.deaths)
        self.waiting = Waiting(claim.pending)
        outcome = await self._run_claimed(claim)
        if outcome == Outcome.FENCED:
            return outcome
        if Stopped.CLOSED in self.stopped:
            return Outcome.NOOP  # not released: the next claim, after the lease, takes it on
        if Stopped.NEWER in self.stopped:
            # Nothing of it ends here: only a process that reads the newer layout claims it next.
            self.released = await self._release(cutoff=False, newer=LAYOUT_LEVEL + 1)
            return Outcome.NOOP
        if outcome == Outcome.UNSETTLED:
            # Not released: the lease expires unrenewed, the sweeper's next claim counts a
            # death, and the third one ends the turn or input (claim.lua).
            log.error("%s is left to its lease (%s ms) after a failure it could not record",
                      self.session_id, self.lease_ms)
            return Outcome.NOOP
        if self.released is not None:  # the turn's end record let the session go
            return outcome
        cut_off = Stopped.CUT_OFF in self.stopped
        released = self.released = await self._release(
            cutoff=cut_off, newer=self._needs() if outcome != Outcome.DONE else None,
            input_at_rest=outcome == Outcome.PAUSED and await self._all_read())
        if cut_off:
            # The store's count: it restarts only when the turn moved on (append.lua).
            cutoffs = released.cutoffs if released is not None else int(self.claim.cutoffs) + 1
            self.emit("session.deadline", epoch=self.epoch, cutoffs=cutoffs)
        if outcome == Outcome.YIELDED and not self.stopped & (Stopped.STORE_LOST | Stopped.REQUEUE):
            metrics.YIELDS.inc()
        return outcome

    async def _claim(self) -> Claim | Outcome:
        """The session's lease for this runner, or why there is nothing to run here."""
        # A claim is retried under this runner's holder id: one that ran but lost its
        # reply answers the same epoch again (claim.lua), so nothing is counted twice.
        started_ms = now_ms()
        serving = self._serving()
        claim = await retry_unavailable(
            lambda: self.store.claim(
                self.session_id, holder=self.holder, lease_ms=self.lease_ms, now_ms=now_ms(), only_work=True,
                serving=serving,
            ),
            due_ms=lambda: started_ms + CLAIM_RETRY_MS,
            what=f"claiming {self.session_id}",
        )
        if claim is None:
            self.emit("session.redelivered", reason=self.reason)
            return Outcome.NOOP
        if isinstance(claim, Unserved):
            # Owned by an agent no agent of this store here is: nothing was taken (§7).
            self.owner, self.unserved = claim.agent, claim
            return Outcome.MISROUTED
        if isinstance(claim, Newer):
            # A holder before met a stored layout this process cannot read either: nothing
            # was taken, and a process of a newer release takes the session.
            log.warning("%s needs a process that reads stored layout %s (this one reads %s): left to it",
                        self.session_id, claim.level, LAYOUT_LEVEL)
            return Outcome.NOOP
        if isinstance(claim, Idle):
            # A second wake of work done already (the release's own wake and the sender's
            # both fire): nothing to run, and the session is left exactly as it is.
            log.debug("wake of %s (%s): nothing to run at epoch %s", self.session_id, self.reason, claim.epoch)
            return Outcome.NOOP
        self.epoch = claim.epoch
        misrouted = (
            bool(claim.agent) and claim.agent != self.agent.name and not claim.give_up
            and not self._run_as_owner(claim.agent)
        )
        if misrouted:
            self.owner = claim.agent
            await self._release(cutoff=False, newer=self._needs(claim))
            return Outcome.MISROUTED
        return claim

    async def _run_claimed(self, claim: Claim) -> Outcome:
        """Runs what the claim found, with the lease renewed, the inbox watched and the
        deadline armed; FENCED when another epoch took over meanwhile."""
        keeper = LeaseKeeper(self.store, self.session_id, self.epoch, lease_ms=self.lease_ms, on_lost=self._lost)
        # Writes that meet a store outage are retried while the lease stands (store/persistence.py).
        self.writer = LineWriter(
            self.store, self.session_id, self.epoch, on_fenced=self._writer_fenced,
            lease_due_ms=lambda: keeper.expires_ms,
        )
        watcher = InboxWatcher(self.store, self.session_id, after_seq=claim.inbox_cursor, on_input=self._on_input)
        keeper.start()
        watcher.start()
        disarm = self.deadline.arm(on_hard_stop=self._hard_stop, on_shutdown=self._shut_down)
        forget_closing = self.closing.on_set(self._close_down) if self.closing is not None else None
        outcome: Outcome = Outcome.DONE
        work = self.work = Work(self, self.writer, http_client=self.http_client)
        try:
            outcome = await work.run()
        except asyncio.CancelledError:
            self._close_down()  # cancelled from outside: whatever else is cancelled writes nothing
            raise
        except FxLeaseLostError:
            outcome = Outcome.FENCED
        except Unsettled:
            outcome = Outcome.UNSETTLED
        except Closed:
            outcome = Outcome.NOOP
        except FxStoreUnavailableError as exc:
            # Redis stayed away past the lease: whatever is stored stands, the turn stays
            # open, and the next delivery (the requeued wake, or the sweeper's) continues.
            log.warning("store unavailable while running %s: %s", self.session_id, exc)
            self._detach()
            self.stopped |= Stopped.STORE_LOST
            outcome = Outcome.YIELDED
        finally:
            disarm()
            if forget_closing is not None:
                forget_closing()
            await watcher.stop()
            await keeper.stop()
            if Stopped.FENCED in self.stopped or outcome == Outcome.FENCED:
                self.emit("session.fenced", epoch=self.epoch)
                outcome = Outcome.FENCED
                self._detach()
            await work.close_engine()
        return outcome

    def _serving(self) -> Serving:
        """The agents this runner may run a session as: those of this process on its store."""
        store = self.agent.store
        names = tuple(name for name, agent in registry.agents().items() if agent.store is store)
        settings = self.agent.settings
        return Serving(
            names or (self.agent.name,),
            give_up_ms=int(settings.no_agent_give_up_s * 1000),
            retry_max_ms=int(settings.no_agent_retry_s * 1000),
        )

    def _run_as_owner(self, name: str) -> bool:
        """Whether this process's agent `name`, on the store this claim was made in, can
        run the session (a wake names an agent, but the store's owner decides)."""
        owner = registry.get_agent(name)
        if owner is None or owner.store is not self.agent.store:
            return False
        log.info("wake of %s for agent %r runs as its owner %r", self.session_id, self.agent.name, name)
        self.agent = owner
        self.lease_ms = int(owner.lease_s * 1000)
        self.deadline.reserve_ms = int(owner.reserve_s * 1000)
        return True

    def _needs(self, claim: Claim | None = None) -> int | None:
        """The layout level the claim's inputs (open or waiting) need, if above the oldest:
        left unfinished, only a process that reads it may claim the session next (a
        delegated turn's, `DELEGATED_LEVEL`; a typed turn's, `TYPED_LEVEL`)."""
        claim = claim or self._claimed
        if claim is None:
            return None
        inputs = [claim.open_turn.input] if claim.open_turn is not None else []
        needs = 0
        for i in [*inputs, *claim.pending]:
            if i is None:
                continue
            if isinstance(i.settings, Mapping) and typed.OUTPUT_KEY in i.settings:
                needs = max(needs, TYPED_LEVEL)
            if delegation.link_of(i.settings) is not None:
                needs = max(needs, DELEGATED_LEVEL)
        return needs or None

    async def _all_read(self) -> bool:
        """Whether every live process reads this release's stored layout (a parked turn's
        input may then wait in `rest`, which a previous release's process does not read)."""
        try:
            return layout_all_read(await self.store.live_workers()) >= PARKED_LEVEL
        except Exception:  # noqa: BLE001 - not known: store it the way every release reads
            return False

    async def _release(self, *, cutoff: bool, newer: int | None = None,
                       input_at_rest: bool = False) -> Released | None:
        try:
            return await self.store.release(self.session_id, self.epoch, cutoff=cutoff, newer=newer,
                                            input_at_rest=input_at_rest)
        except FxLeaseLostError:
            self.emit("session.fenced", epoch=self.epoch)
        except Exception as exc:  # noqa: BLE001 - the work is stored; the lease expires on its own
            # The sweeper re-wakes the session once the lease expired.
            log.warning("releasing %s failed: %s", self.session_id, exc)
        return None

    # ------------------------------------------------------------------ stops

    def _detach(self) -> None:
        if self.current is not None:
            self.current.detach()

    def _let_go(self) -> bool:
        """Whether this runner let the session go already (its last turn's end record did)."""
        return self.released is not None or (self.current is not None and self.current.let_go)

    def _writer_fenced(self) -> None:
        self._lost(FxLeaseLostError(f"a write of epoch {self.epoch} was refused"))

    def _lost(self, exc: BaseException) -> None:
        """The lease keeper's renewal was refused: stop this turn here and now."""
        if self._let_go():
            return  # a renewal after this runner let the session go itself
        self.stopped |= Stopped.FENCED
        self._detach()

    def _close_down(self) -> None:
        """The worker's loop closes (`LoopThread.close`), and every task on it is cancelled
        next: the turn is let go as it stands. It is detached and nothing more is written
        under this epoch; the lease is left to expire, and the next claim resumes the turn
        (or starts the input) as after a kill. A turn ended here would be ended by a worker
        that is going away (`cancelled`), and the cancel cuts its calls short: lines whose
        record was never stored (a start line, then an end, with the input still waiting)
        would be written, and the input run and ended again."""
        if self._let_go() or Stopped.CLOSED in self.stopped:
            return
        log.info("worker loop closing: %s is left to the next claim at epoch %s", self.session_id, self.epoch)
        self.stopped |= Stopped.CLOSED
        if self.writer is not None:
            self.writer.closed = True  # queued and later lines are dropped
        self._detach()

    def _hard_stop(self) -> None:
        """At the deadline's hard stop: cut off whatever is still running."""
        current = self.current
        if current is None or current.turn is None or Stopped.FENCED in self.stopped or self._let_go():
            return
        self.stopped |= Stopped.CUT_OFF
        metrics.DEADLINE_CUTOFFS.inc()
        log.info("deadline: cutting off turn %s of %s", current.turn_id, self.session_id)
        current.detach()  # session.deadline goes out with the store's count at the release

    def _shut_down(self) -> None:
        log.info("warm shutdown: %s yields", self.session_id)
        if self.current is not None:
            self.current.yield_if_stopping()

    # ------------------------------------------------------------------ inbox

    def _on_input(self, entry: Input) -> None:
        """A new inbox entry while this runner holds the lease."""
        current = self.current
        if entry.kind == "cancel":
            # A cancel names its turn (cancel.lua): the running one, or one waiting here,
            # which then ends `cancelled` as it starts. Any other turn is not this one's.
            if current is not None and current.turn is not None and entry.message_id == current.turn_id:
                log.info("cancel of %s reached turn %s", self.session_id, current.turn_id)
                current.turn.cancel()
            elif current is not None and entry.message_id == current.turn_id:
                self.waiting.cancelled_open = True  # the turn is parked: it ends as it would resume
            else:
                self.waiting.cancel(entry.message_id)
            return
        if entry.kind == "steer" and current is not None and current.steer(entry):
            return
        self.waiting.add(entry)
