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

The next delivery writes `turn_resume {interrupted, retract}` and continues. A step cut
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
import contextlib
import dataclasses
import enum
import logging
from collections import deque
from collections.abc import Awaitable
from typing import Any

import httpx
from opentelemetry import trace

from fxengine.codes import Code
from fxengine.engine import Engine, create_engine
from fxengine.errors import FxError, FxInputError, FxJournalVersionError
from fxengine.limits import prompt_text
from fxengine.providers.credentials import mask_secret
from fxengine.turn import Turn, TurnResult

from . import metrics, protocol, registry, tracing
from .deadline import Deadline
from .errors import FxLeaseLostError, FxStoreUnavailableError
from .ids import new_holder_id, now_ms
from .leases import LeaseKeeper
from .protocol import Outcome, RunResult, WorkerAgent
from .runtime import StopSignal
from .store import RedisStore
from .store.persistence import LineWriter, StorePersistence, retry_unavailable
from .store.types import LAYOUT_LEVEL, Claim, Idle, Input, Newer, Released, Serving, Unserved
from .watch import InboxWatcher

log = logging.getLogger("fxworker.runner")

MAX_CUTOFFS = 3
MAX_DEATHS = 3
# Claims in a row with no input or step moving on, past which what heads the session ends
# FX_NO_PROGRESS: a backstop for any path that re-wakes and re-claims without progress
# (deaths, cut-offs and store outages have bounds of their own, well below it).
MAX_FUTILE_CLAIMS = 20
CLAIM_RETRY_MS = 2000  # how long a claim retries a store that does not answer


class Stopped(enum.Flag):
    """Why a delivery stops short of its work (several may hold at once)."""

    FENCED = enum.auto()  # another epoch heads the session: write nothing more
    CUT_OFF = enum.auto()  # the delivery's hard deadline cut the turn off
    STORE_LOST = enum.auto()  # the store stayed away past the lease: the next delivery resumes
    REQUEUE = enum.auto()  # the rest goes to a new delivery (not a deadline yield)
    NEWER = enum.auto()  # a stored layout this process cannot read: let go for a newer one
    CLOSED = enum.auto()  # the worker's loop closes: write nothing more, leave the lease to expire


class Unsettled(Exception):
    """Internal signal: a failure could not be recorded; leave the lease to expire."""


class Closed(Exception):
    """Internal signal: the worker's loop closes; write nothing more, leave the lease to expire."""


# Not failures of the turn: the runner's own stops (fenced, store away, loop closing) pass through.
_STOPS = (FxLeaseLostError, FxStoreUnavailableError, Closed)


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
        self.claim: Claim = None  # type: ignore[assignment]  # set by the claim, before any use
        self.epoch = 0
        self.engine: Engine | None = None
        self.turn: Turn | None = None
        self.turn_id: str | None = None
        self.pending: deque[Input] = deque()
        # Steers handed to the running turn that it has not placed yet (no `user_message`),
        # by message id: a turn that ends without placing one hands it back (`_take_back_steers`).
        self.handed: dict[str, Input] = {}
        self.stopped = Stopped(0)  # why this delivery stops short of its work, if it does
        self.writer: LineWriter | None = None
        self._engine_key: tuple[Any, Any] | None = None
        self.persistence: StorePersistence | None = None
        self.released: Released | None = None  # the store's answer to this delivery's release
        self.driving = False  # awaiting the running turn's end in `_drive`
        self.owner: str | None = None  # the owning agent, when run() answers MISROUTED
        self.unserved: Unserved | None = None  # and the store's backoff, when nothing was claimed

    def __repr__(self) -> str:
        return (
            f"<Runner session={self.session_id} epoch={self.epoch} turn={self.turn_id} "
            f"deadline_in_ms={self.deadline.deadline_ms - now_ms()} stopped={self.stopped!r}>"
        )

    # ------------------------------------------------------------------ diagnostics

    def emit(self, type_: str, **fields: Any) -> None:
        event = {"type": type_, "sessionId": self.session_id, **fields}
        log.info("%s session=%s epoch=%s %s", type_, self.session_id, self.epoch, fields)
        self.agent.emit(event)

    def _engine_event(self, event: dict[str, Any]) -> None:
        """`on_event` of the engine: add the session and epoch, pass to the agent."""
        if event.get("type") == "tool.rerun":
            log.info("tool.rerun session=%s epoch=%s %s", self.session_id, self.epoch, event)
        self.agent.emit({"sessionId": self.session_id, "epoch": self.epoch, **event})

    # ------------------------------------------------------------------ the delivery

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
        self.claim = claim
        self.epoch = claim.epoch
        if claim.taken_over:
            metrics.TAKEOVERS.inc()
            turn = claim.open_turn.message_id if claim.open_turn else None
            self.emit("session.takeover", epoch=self.epoch, turn=turn, deaths=claim.deaths)
        self.pending = deque(claim.pending)
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
        released = self.released = await self._release(cutoff=cut_off)
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
            await self._release(cutoff=False)
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
        try:
            outcome = await self._work()
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
            if self.turn is not None:
                self.turn.detach()
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
                if self.turn is not None:
                    self.turn.detach()
            await self._close_engine()
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

    async def _release(self, *, cutoff: bool, newer: int | None = None) -> Any:
        try:
            return await self.store.release(self.session_id, self.epoch, cutoff=cutoff, newer=newer)
        except FxLeaseLostError:
            self.emit("session.fenced", epoch=self.epoch)
        except Exception as exc:  # noqa: BLE001 - the work is stored; the lease expires on its own
            # The sweeper re-wakes the session once the lease expired.
            log.warning("releasing %s failed: %s", self.session_id, exc)
        return None

    def _writer_fenced(self) -> None:
        self._lost(FxLeaseLostError(f"a write of epoch {self.epoch} was refused"))

    def _fenced_stop(self) -> FxLeaseLostError:
        """The stop of a runner whose epoch no longer heads the session: stop writing."""
        return FxLeaseLostError(f"epoch {self.epoch} of {self.session_id} no longer heads the session")

    def _lost(self, exc: BaseException) -> None:
        """The lease keeper's renewal was refused: stop this turn here and now."""
        if self._let_go():
            return  # a renewal after this runner let the session go itself
        self.stopped |= Stopped.FENCED
        if self.turn is not None:
            self.turn.detach()

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
        if self.turn is not None:
            self.turn.detach()

    # ------------------------------------------------------------------ deadlines

    def _hard_stop(self) -> None:
        """At the deadline's hard stop: cut off whatever is still running."""
        if self.turn is None or Stopped.FENCED in self.stopped or self._let_go():
            return
        self.stopped |= Stopped.CUT_OFF
        metrics.DEADLINE_CUTOFFS.inc()
        log.info("deadline: cutting off turn %s of %s", self.turn_id, self.session_id)
        self.turn.detach()  # session.deadline goes out with the store's count at the release

    def _shut_down(self) -> None:
        log.info("warm shutdown: %s yields", self.session_id)
        self._yield_if_stopping()

    def _yield_if_stopping(self) -> None:
        """During a warm shutdown, the running turn sends no further model request (a
        request or tool call already running finishes first)."""
        if self.turn is not None and self.deadline.shutting_down:
            self.turn.yield_now()

    # ------------------------------------------------------------------ inbox

    def _on_input(self, entry: Input) -> None:
        """A new inbox entry while this runner holds the lease."""
        if entry.kind == "cancel":
            # A cancel names its turn (cancel.lua): the running one, or one waiting here,
            # which then ends `cancelled` as it starts. Any other turn is not this one's.
            if self.turn is not None and entry.message_id == self.turn_id:
                log.info("cancel of %s reached turn %s", self.session_id, self.turn_id)
                self.turn.cancel()
            else:
                # A steer the ended turn did not place heads the store's waiting inputs
                # before the runner takes it back: the cancel names it there.
                handed = self.handed.get(entry.message_id)
                if handed is not None:
                    self.handed[entry.message_id] = dataclasses.replace(handed, cancelled=True)
                self.pending = deque(dataclasses.replace(waiting, cancelled=True)
                                     if waiting.kind in ("prompt", "steer") and waiting.message_id == entry.message_id
                                     else waiting for waiting in self.pending)
            return
        if entry.kind == "steer" and self.turn is not None:
            try:
                self.turn.steer(entry.input, id=entry.message_id)
            except FxInputError:
                pass  # the turn is ending: the steer becomes the next turn
            else:
                self.handed[entry.message_id] = entry
                return
        self.pending.append(entry)

    def _take_back_steers(self) -> None:
        """Puts the steers the last turn was handed but never placed (it was cancelled, or
        ended before its next request) back among the waiting inputs, in acceptance order:
        the store still holds them waiting, so they run next, before any later prompt (§6)."""
        if not self.handed:
            return
        back, self.handed = self.handed, {}
        self.pending = deque(sorted([*back.values(), *self.pending], key=lambda waiting: waiting.seq))

    # ------------------------------------------------------------------ turns

    async def _work(self) -> Outcome:
        claim = self.claim
        if claim.give_up:
            return await self._give_up()
        if claim.futile > MAX_FUTILE_CLAIMS:
            await self._end_futile()
            claim = self.claim
        if claim.open_turn is not None:
            outcome = await self._guarded(self._continue_open_turn(), None)
            if outcome != Outcome.ENDED:
                return outcome
        first = True
        while True:
            if Stopped.FENCED in self.stopped:
                raise self._fenced_stop()
            if Stopped.CLOSED in self.stopped:
                raise Closed(self.session_id)
            if self.released is not None:
                # An input the watcher passed on after the release is not this runner's:
                # its own wake finds the session free.
                return Outcome.DONE
            entry = self._next_input()
            if entry is None:
                return Outcome.DONE
            if self.deadline.past_soft():
                self.pending.appendleft(entry)
                return Outcome.YIELDED
            if first and claim.open_turn is None and claim.deaths >= MAX_DEATHS:
                # Its workers died (or failed past recording it) before its turn opened.
                outcome = await self._settled(self._end_unstarted(entry, {
                    "code": Code.POISON_TURN,
                    "message": f"the worker taking this prompt died {claim.deaths} times before its turn "
                    "started; the prompt was dropped so the session can go on",
                }))
            else:
                outcome = await self._guarded(self._start_turn(entry), entry)
            first = False
            if outcome != Outcome.ENDED:
                return outcome

    async def _guarded(self, step: Awaitable[Outcome], entry: Input | None) -> Outcome:
        """Awaits a turn's step; an exception that is not one of the runner's stops ends
        what it hit (`_end_failed`)."""
        try:
            return await step
        except _STOPS:
            raise
        except FxJournalVersionError as exc:
            return await self._let_go_for_newer(exc, entry)
        except Exception as exc:  # noqa: BLE001 - every failure ends in a defined state
            return await self._end_failed(exc, entry)

    async def _let_go_for_newer(self, exc: FxJournalVersionError, entry: Input | None) -> Outcome:
        """A stored layout written by a newer release (a downgrade, or a rolling deploy that
        went back): nothing is ended or dropped; the session is let go so that only a process
        that reads it claims it next (`_run`; claim.lua answers older ones `newer`)."""
        log.error("%s holds a stored layout this process cannot read (%s): %s; it is left for a newer process",
                  self.session_id, exc.code, exc)
        self.emit("session.newer", epoch=self.epoch, reads=LAYOUT_LEVEL, error=self._error_of(exc))
        if self.turn is not None:
            self.turn.detach()
            self.turn = None
        if entry is not None:
            self.pending.appendleft(entry)
        self.stopped |= Stopped.NEWER
        return Outcome.YIELDED

    async def _settled(self, ending: Awaitable[Outcome]) -> Outcome:
        """Awaits the write that ends a turn or input; `Unsettled` when it cannot be stored."""
        try:
            return await ending
        except _STOPS:
            raise
        except Exception as exc:  # noqa: BLE001
            raise Unsettled(f"ending {self.turn_id} of {self.session_id} failed: {exc!r}") from exc

    def _error_of(self, exc: BaseException) -> dict[str, Any]:
        """`{code, message}` of a failure, with the agent's credentials masked."""
        if isinstance(exc, FxError):
            code, message = exc.code, str(exc)
        else:
            code, message = Code.TURN_FAILED, f"{type(exc).__name__}: {exc}"
        return {"code": code, "message": mask_secret(message, self.agent.api_key)}

    def _session_error(self, error: dict[str, Any]) -> None:
        """`session.error` and a `session_error` line for the turn (or input) `turn_id`."""
        self.emit("session.error", epoch=self.epoch, turn=self.turn_id, error=error)
        self._push(protocol.session_error(self.turn_id, error, self.turn_id))

    async def _end_failed(self, exc: Exception, entry: Input | None) -> Outcome:
        """Ends the turn (or the input `entry` whose turn could not open) that `exc` hit:
        stop reason `error`, a `turn_end` and a `session_error` line. Raises `Unsettled`
        when even that cannot be stored."""
        error = self._error_of(exc)
        turn_id = self.turn_id or (entry.message_id if entry is not None else None)
        if turn_id is None and self.claim.open_turn is not None:
            turn_id = self.claim.open_turn.message_id
        log.error("turn %s of %s failed: %s", turn_id, self.session_id, error["code"], exc_info=exc)
        if self.turn is not None:
            self.turn.detach()  # whatever it still does is not stored
            self.turn = None
        self._take_back_steers()
        self.turn_id = turn_id
        try:
            return await self._settled(self._settle_failed(entry, error))
        finally:
            if self.engine is not None:
                # Its state is suspect, and another engine of this claim would load a
                # stale snapshot: the rest of the session goes to a new delivery.
                await self._close_engine()
                self.stopped |= Stopped.REQUEUE

    async def _settle_failed(self, entry: Input | None, error: dict[str, Any]) -> Outcome:
        # Queued first, so it is stored before the turn_end a follower of the turn stops at.
        self._session_error(error)
        engine = self.engine
        if engine is not None and engine.open_turn is not None:
            try:
                result = await engine.end_open_turn("error", error=error)
            except _STOPS:
                raise
            except Exception:  # noqa: BLE001 - a broken or detached engine: end it in the store
                log.warning("the engine of %s could not end turn %s", self.session_id, self.turn_id, exc_info=True)
            else:
                drop = [protocol.drop(entry.message_id)] if entry is not None else None
                return await self._write_end("error", getattr(result, "usage", None) or {}, error, marks=drop)
        # No engine holds it: close the store's open turn (if any) and consume the input.
        marks: list[dict[str, Any]] = [{"end": True}]
        if entry is not None:
            marks.append(protocol.drop(entry.message_id))
        return await self._end_without_engine(error, marks)

    async def _end_cancelled(self, entry: Input) -> Outcome:
        """Ends an input cancelled before its turn started (a cancel sent before any worker
        ran, or while the turn before it ran): its `turn_start` and a `turn_end`
        `cancelled`, and the input consumed (`drop`) in one call. The model never sees it,
        and the steers waiting behind it run as the next turn (§6)."""
        self.turn_id = entry.message_id
        text_input = entry.input if isinstance(entry.input, str) else None
        if text_input is None and isinstance(entry.input, list):
            text_input = prompt_text(entry.input)
        self._push(protocol.turn_start(self.turn_id, self.session_id, text_input))
        return await self._end_without_engine(None, [protocol.drop(entry.message_id)], stop_reason="cancelled")

    async def _end_unstarted(self, entry: Input, error: dict[str, Any]) -> Outcome:
        """Ends an input without opening a turn for it (`drop`): its `turn_end` says why."""
        self.turn_id = entry.message_id
        self._session_error(error)
        return await self._end_without_engine(error, [protocol.drop(entry.message_id)])

    async def _end_without_engine(
        self, error: dict[str, Any] | None, marks: list[dict[str, Any]], *, stop_reason: str = "error"
    ) -> Outcome:
        """Writes the turn's `turn_end` with store `marks` (`end`, `drop`) in one fenced call."""
        assert self.writer is not None
        self._push(protocol.turn_end(self.turn_id, protocol.end_body(stop_reason, {}, error)))
        await self.writer.flush(marks=marks)
        self.turn = None
        self.turn_id = None
        return Outcome.ENDED

    async def _give_up(self) -> Outcome:
        """Ends the open turn and every waiting input `error` FX_NO_AGENT: no process ran
        the session's agent for `FX_NO_AGENT_GIVE_UP_S` (claim.lua gave the lease for this)."""
        claim = self.claim
        waited_s = self.agent.settings.no_agent_give_up_s
        error = {
            "code": Code.NO_AGENT,
            "message": f"no worker ran agent {claim.agent!r} for {waited_s:g} s; start a worker with that agent "
            "(FX_AGENTS) and prompt again",
        }
        log.error("giving up on %s: %s", self.session_id, error["message"])
        if claim.open_turn is not None:
            self.turn_id = claim.open_turn.message_id
            self._session_error(error)
            await self._settled(self._end_without_engine(error, [{"end": True}]))
        while (entry := self._next_input()) is not None:
            await self._settled(self._end_unstarted(entry, error))
        return Outcome.DONE

    async def _end_futile(self) -> None:
        """Ends what heads a session claimed `MAX_FUTILE_CLAIMS` times with nothing moving
        on (the open turn `cancelled`, else the first waiting input `error`), with
        FX_NO_PROGRESS; the inputs behind it run as usual."""
        claim = self.claim
        error = {
            "code": Code.NO_PROGRESS,
            "message": f"this session was claimed {claim.futile} times in a row with no input or step moving on; "
            "what headed it was ended so the session can go on",
        }
        log.error("ending the head of %s: %s", self.session_id, error["message"])
        if claim.open_turn is not None:
            self.turn_id = claim.open_turn.message_id
            self._session_error(error)
            await self._settled(self._end_without_engine(error, [{"end": True}], stop_reason="cancelled"))
            self.claim = dataclasses.replace(claim, open_turn=None)
        elif (entry := self._next_input()) is not None:
            await self._settled(self._end_unstarted(entry, error))

    def _next_input(self) -> Any:
        while self.pending:
            entry = self.pending.popleft()
            if entry.kind in ("prompt", "steer"):
                return entry
            # A cancel request applies to the turn open when it landed; none is open now.
        return None

    async def _open_engine(self, context: Any, settings: dict[str, Any] | None) -> Engine | None:
        key = (repr(context), repr(settings))
        if self.engine is not None and self._engine_key == key:
            return self.engine
        if self.engine is not None:
            # Another context or model: this claim's engine would load a stale snapshot,
            # so hand the rest to the next delivery.
            return None
        settings = settings or {}
        assert self.writer is not None
        persistence = self.persistence = StorePersistence(self.store, self.claim, writer=self.writer)
        persistence.release_with_end = self._release_with_end
        self.engine = await create_engine(
            model=settings.get("model") or self.agent.model,
            api_key=self.agent.api_key,
            instructions=settings.get("instructions", self.agent.instructions),
            tools=self.agent.tools,
            provider=self.agent.provider,
            persistence=persistence,
            on_event=self._engine_event,
            event_sink=self._sink,
            max_model_turns=self.agent.max_model_turns,
            model_idle_timeout_s=self.agent.settings.model_idle_timeout_s,
            http_client=self.http_client,
            session_id=self.session_id,
            context=context,
            epoch=self.epoch,
        )
        persistence.checkpoint_now = self.engine.settled_checkpoint
        self._engine_key = key
        return self.engine

    def _release_with_end(self) -> bool:
        """Asked as the running turn's end record is sent: may that call let the session
        go (one round trip less, and an input accepted after it finds the session free)?
        Only for a turn ending in `_drive` with no stop and no input waiting here, as then
        nothing follows it; the store lets go only if no input waits there either
        (`StorePersistence.released`)."""
        waiting = bool(self.handed) or any(entry.kind in ("prompt", "steer") for entry in self.pending)
        return self.driving and not self.stopped and self.released is None and not waiting

    def _let_go(self) -> bool:
        """Whether this runner let the session go already (its last turn's end record did)."""
        return self.released is not None or (self.persistence is not None and self.persistence.released)

    async def _close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            try:
                await engine.close()
            except Exception:  # noqa: BLE001 - closing after a stop is best effort
                log.debug("closing the engine of %s failed", self.session_id, exc_info=True)

    def _sink(self, event: dict[str, Any]) -> None:
        """The engine's `event_sink`: every event becomes a UI line of this turn; the
        turn's end (or yield) rides in the call of the record that ends (or yields) it."""
        assert self.writer is not None and self.persistence is not None
        kind = event.get("type")
        if kind == "user_message":
            self.handed.pop(str(event.get("id")), None)  # placed: its `accepted` record went before it
        if self.stopped & (Stopped.CUT_OFF | Stopped.FENCED | Stopped.CLOSED):
            return
        if kind == "turn_end" or kind == "turn_yield":
            if event.get("turnId") != self.turn_id:
                return  # an older turn the engine closed before starting this one: not ours
            line: protocol.ControlLine = (
                protocol.turn_end(self.turn_id, protocol.end_body(event["stopReason"], event.get("usage"), event.get("error")))
                if kind == "turn_end" else protocol.turn_yield(self.turn_id))
            self.persistence.ride_with_end(dict(line))
            return
        self.writer.push({**event, "messageId": self.turn_id})

    def _push(self, line: protocol.ControlLine) -> None:
        assert self.writer is not None
        self.writer.push(dict(line))

    async def _flush(self) -> None:
        assert self.writer is not None
        await self.writer.flush()

    def _end_written(self, type_: str) -> bool:
        """Whether this turn's `type_` line was stored with the engine's record."""
        stored = self.persistence.end_stored if self.persistence is not None else None
        return stored is not None and stored.get("type") == type_ and stored.get("messageId") == self.turn_id

    async def _start_turn(self, entry: Input) -> Outcome:
        if Stopped.REQUEUE in self.stopped:
            self.pending.appendleft(entry)
            return Outcome.YIELDED
        if entry.cancelled:
            return await self._settled(self._end_cancelled(entry))
        _check_readable(entry)
        engine = await self._open_engine(entry.context, entry.settings)
        if engine is None:
            self.pending.appendleft(entry)
            self.stopped |= Stopped.REQUEUE
            return Outcome.YIELDED
        self.turn_id = entry.message_id
        text_input = entry.input if isinstance(entry.input, str) else None
        if text_input is None and isinstance(entry.input, list):
            text_input = prompt_text(entry.input)
        # The line rides with the engine's first record (the turn's start barrier).
        self._push(protocol.turn_start(self.turn_id, self.session_id, text_input))
        span = self._trace_delivery(entry.traceparent, resumed=False)
        with _current(span):  # the engine's turn task starts under it: its spans are the turn's
            self.turn = engine.prompt(entry.input, yield_at=self.deadline.yield_at(), turn_id=entry.message_id)
        self._yield_if_stopping()
        # Steers accepted after this prompt and waiting join it (§6).
        self._join_waiting_steers()
        return await self._traced(span, self._drive())

    async def _continue_open_turn(self) -> Outcome:
        claim = self.claim
        open_turn = claim.open_turn
        assert open_turn is not None  # the claim found the turn open
        turn_input = open_turn.input
        if claim.deaths > MAX_DEATHS:
            # The delivery that was to end it as poison died too, loading or resuming its
            # journal: end it in the store, without an engine.
            self.turn_id = open_turn.message_id
            error = {
                "code": Code.POISON_TURN,
                "message": f"the worker running this turn died {claim.deaths} times with no progress "
                "between, the last one while loading it; the turn was cancelled so the session can go on",
            }
            self._session_error(error)
            return await self._settled(self._end_without_engine(error, [{"end": True}], stop_reason="cancelled"))
        if turn_input is not None:
            _check_readable(turn_input)
        engine = await self._open_engine(
            getattr(turn_input, "context", None), getattr(turn_input, "settings", None)
        )
        assert engine is not None
        self.turn_id = open_turn.message_id
        interrupted = not open_turn.yielded
        in_flight = engine.in_flight
        steps_seen = await self._steps_seen(self.turn_id)
        recorded = engine.recorded_steps(self.turn_id)
        retract = sorted(s for s in steps_seen if s not in recorded)
        next_step = max([*steps_seen, *recorded, 0]) + 1
        self._push(protocol.turn_resume(self.turn_id, self.session_id, interrupted=interrupted, retract=retract))
        await self._flush()
        if claim.deaths >= MAX_DEATHS:
            return await self._end_open(
                "cancelled",
                {
                    "code": Code.POISON_TURN,
                    "message": f"the worker running this turn died {claim.deaths} times with no progress "
                    f"between (the last one {_poison_cause(in_flight)}); the turn was cancelled so the "
                    "session can go on",
                },
            )
        no_rerun = False
        if claim.cutoffs >= MAX_CUTOFFS:
            if in_flight is None or in_flight.get("kind") == "model":
                return await self._end_open(
                    "cancelled",
                    {
                        "code": Code.DEADLINE_CUTOFFS,
                        "message": f"the model request was cut off by the delivery deadline "
                        f"{claim.cutoffs} times in a row",
                    },
                )
            no_rerun = True
        span = self._trace_delivery(turn_input.traceparent if turn_input is not None else None, resumed=True)
        with _current(span):
            self.turn = engine.resume(yield_at=self.deadline.yield_at(), no_rerun=no_rerun, next_step=next_step)
        if self.turn is None:
            return await self._traced(span, self._end_open("unknown", None))
        self._yield_if_stopping()
        self._join_waiting_steers()
        if claim.cancel_requested:
            self.turn.cancel()
        return await self._traced(span, self._drive())

    def _trace_delivery(self, traceparent: str | None, *, resumed: bool) -> trace.Span | None:
        """This delivery's part of the turn, in the trace of the request that sent its
        input (`fxworker.tracing`); None when tracing is off."""
        if not tracing.enabled():
            return None
        claim = self.claim
        attributes = {"fx.session.id": self.session_id, "fx.turn.id": self.turn_id or "", "fx.epoch": self.epoch,
                      "fx.worker": self.holder, "fx.agent": self.agent.name, "fx.turn.resumed": resumed}
        takeover = ({"fx.deaths": claim.deaths, "fx.epoch": self.epoch}
                    if resumed and claim.taken_over else None)
        return tracing.start_delivery(traceparent, attributes, takeover=takeover)

    async def _traced(self, span: trace.Span | None, step: Awaitable[Outcome]) -> Outcome:
        """Awaits the rest of a turn's part here; ends its span with how it went."""
        if span is None:
            return await step
        try:
            outcome = await step
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(trace.StatusCode.ERROR, type(exc).__name__)
            raise
        else:
            span.set_attribute("fx.outcome", str(outcome))
            return outcome
        finally:
            span.end()

    def _join_waiting_steers(self) -> None:
        """Steers accepted while this turn waited to start (or to resume) join it (§6)."""
        assert self.turn is not None
        for later in [e for e in self.pending if e.kind == "steer"]:
            try:
                self.turn.steer(later.input, id=later.message_id)
            except FxInputError:
                return
            self.pending.remove(later)
            self.handed[later.message_id] = later

    async def _end_open(self, stop_reason: str, error: dict[str, Any] | None) -> Outcome:
        assert self.engine is not None
        if error:
            self._session_error(error)  # stored with the end record, before its turn_end line
        result = await self.engine.end_open_turn(stop_reason, error=error)
        return await self._write_end(stop_reason, getattr(result, "usage", None) or {}, error)

    async def _write_end(
        self, stop_reason: str, usage: Any, error: dict[str, Any] | None, *, marks: list[dict[str, Any]] | None = None
    ) -> Outcome:
        """Writes the `turn_end` line (unless it rode with the end record) and lets the turn
        go; store `marks` go in the same call."""
        if not self._end_written("turn_end"):
            self._push(protocol.turn_end(self.turn_id, protocol.end_body(stop_reason, usage, error)))
        assert self.writer is not None
        await self.writer.flush(marks=marks or ())
        self.turn = None
        self.turn_id = None
        return Outcome.ENDED

    async def _drive(self) -> Outcome:
        """Waits for the running turn; writes its end, or its yield."""
        assert self.turn is not None
        metrics.TURNS_RUNNING.inc()
        self.driving = True
        try:
            result = await self.turn.result()
        finally:
            self.driving = False
            metrics.TURNS_RUNNING.dec()
        if Stopped.CLOSED in self.stopped:
            raise Closed(self.session_id)  # detached: the next claim resumes it
        self._take_back_steers()
        if self.released is None and self._let_go():
            self.released = Released(released=True, cutoffs=0, pending=0)
        if Stopped.FENCED in self.stopped:
            raise self._fenced_stop()
        error = result.error
        if error and error.get("code") == Code.JOURNAL_APPEND_FAILED:
            if self._fenced_cause(result):
                raise self._fenced_stop()
            cause = error.get("cause")
            if isinstance(cause, dict) and cause.get("code") in (Code.STORE_UNAVAILABLE, Code.STORE_FULL):
                # Redis went away (or is full) mid-turn: the turn stays open in the journal and the
                # next delivery resumes it; nothing to write here.
                log.warning("store lost mid-turn in %s; the turn resumes on the next delivery", self.session_id)
                self.turn = None
                self.stopped |= Stopped.STORE_LOST
                return Outcome.YIELDED
        if not self._end_written("turn_end") and (Stopped.CUT_OFF in self.stopped or result.stop_reason == "yielded"):
            # The turn stays open in the journal; the next delivery continues it.
            if not self._end_written("turn_yield"):
                self._push(protocol.turn_yield(self.turn_id))
            await self._flush()
            self.turn = None
            return Outcome.YIELDED
        return await self._write_end(result.stop_reason, result.usage or {}, error)

    def _fenced_cause(self, result: TurnResult) -> bool:
        cause = result.error.get("cause") if isinstance(result.error, dict) else None
        return bool(Stopped.FENCED in self.stopped or (isinstance(cause, dict) and cause.get("code") == Code.FENCED))

    async def _steps_seen(self, turn_id: str) -> set[int]:
        """The model steps of `turn_id` that have lines in the UI stream."""
        steps: set[int] = set()
        cursor = self.claim.turn_cursor  # the turn's start line: no scan of earlier turns
        while True:
            lines = await self.store.read_lines(self.session_id, cursor, count=1000)
            if not lines:
                return steps
            for line in lines:
                cursor = int(line["cursor"])
                if line.get("messageId") == turn_id and isinstance(line.get("step"), int):
                    steps.add(line["step"])


def _current(span: trace.Span | None) -> contextlib.AbstractContextManager[Any]:
    """`span` as the current span for the block (nothing when tracing is off)."""
    return trace.use_span(span, end_on_exit=False) if span is not None else contextlib.nullcontext()


def _check_readable(entry: Input) -> None:
    """Raises `FxInputError` (`FX_INVALID_INPUT`) for an input the store could not decode."""
    if entry.unreadable:
        raise FxInputError(f"input {entry.message_id} cannot run: {entry.unreadable}")


def _poison_cause(in_flight: dict[str, Any] | None) -> str:
    """Where a poison turn's workers died, for its error message."""
    if in_flight is None:
        return "between steps"
    if in_flight.get("kind") == "tool":
        names = sorted({str(c.get("name")) for c in in_flight.get("calls") or []})
        return f"while running {', '.join(names) or 'its tool calls'} (step {in_flight.get('step')})"
    return f"during model request {in_flight.get('step')}"
