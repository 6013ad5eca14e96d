"""One turn of a delivery, one object: `TurnRun` owns the turn's id, its lines and its end.

The runner (fxworker/runner.py) holds the session for one delivery; for each input it
starts, the open turn it resumes, or the input it ends without a turn, it makes a `TurnRun`
from the claim's engine and the delivery's `LineWriter`. The turn's lines carry its id;
every way a turn ends (the engine ended it, a rule of the claim ends it, a failure hit it,
it was cancelled before it started, no worker runs its agent) goes through `TurnRun.end`,
which builds the `turn_end` line and the store marks once (§5).

`rule(claim)` is the one policy for what the claim's counts say of what heads the
session: a turn (or input) whose workers died `MAX_DEATHS` times with no progress between
is ended as poison, a step cut off `MAX_CUTOFFS` times in a row is not run again.
"""

from __future__ import annotations

import contextlib
import json
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry import trace

from fxengine.codes import Code
from fxengine.engine import Engine
from fxengine.errors import FxError, FxInputError
from fxengine.limits import prompt_text
from fxengine import approvals
from fxengine.approvals import check_decisions
from fxengine.lines import LineType, PendingCall
from fxengine.providers.credentials import mask_secret
from fxengine.turn import Turn
from fxengine.usage import add_usage

from . import delegation, metrics, protocol, tracing, typed
from .deadline import Deadline
from .errors import FxLeaseLostError, FxStoreUnavailableError
from .ids import now_ms
from .protocol import ErrorBody, Outcome, WorkerAgent
from .store import RedisStore
from .store.persistence import EndRide, LineWriter, StorePersistence
from .store.types import Claim, Input, Mark, Released
from .waiting import Waiting

log = logging.getLogger("fxworker.runner")

MAX_CUTOFFS = 3
MAX_DEATHS = 3


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
STOPS = (FxLeaseLostError, FxStoreUnavailableError, Closed)


# -- the claim's rule ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ruling:
    """What the claim's counts say of what heads the session: run it (`stop_reason` None,
    perhaps with `no_rerun`), or end it with `stop_reason` and `error` (without loading its
    journal when `load` is False)."""

    stop_reason: str | None = None
    error: ErrorBody | None = None
    load: bool = True
    no_rerun: bool = False  # the step in flight is not run again (a tool call is answered as possibly run)


RUN = Ruling()


def rule(claim: Claim, *, first_input: bool | None = None, in_flight: Mapping[str, Any] | None = None,
         loaded: bool = False) -> Ruling:
    """The poison and cut-off rules for what heads `claim`'s session: an input of the
    delivery (`first_input` says whether it is the first one), or the claim's open turn,
    before its journal is `loaded` and after it, with what the turn had `in_flight`."""
    deaths = claim.deaths
    if first_input is not None:
        if first_input and claim.open_turn is None and deaths >= MAX_DEATHS:
            # Its workers died (or failed past recording it) before its turn opened.
            return Ruling("error", _error(Code.POISON_TURN, f"the worker taking this prompt died {deaths} times "
                                          "before its turn started; the prompt was dropped so the session can go on"))
        return RUN
    if deaths > MAX_DEATHS:
        # The delivery that was to end it as poison died too, loading or resuming its
        # journal: end it in the store, without an engine.
        return Ruling("cancelled", _error(Code.POISON_TURN, f"the worker running this turn died {deaths} times with "
                                          "no progress between, the last one while loading it; the turn was "
                                          "cancelled so the session can go on"), load=False)
    if not loaded:
        return RUN
    if deaths >= MAX_DEATHS:
        return Ruling("cancelled", _error(Code.POISON_TURN, f"the worker running this turn died {deaths} times with "
                                          f"no progress between (the last one {_poison_cause(in_flight)}); the turn "
                                          "was cancelled so the session can go on"))
    if claim.cutoffs >= MAX_CUTOFFS:
        if in_flight is None or in_flight.get("kind") == "model":
            return Ruling("cancelled", _error(Code.DEADLINE_CUTOFFS, "the model request was cut off by the delivery "
                                              f"deadline {claim.cutoffs} times in a row"))
        return Ruling(no_rerun=True)
    return RUN


def _error(code: str, message: str) -> ErrorBody:
    return {"code": code, "message": message}


def _poison_cause(in_flight: Mapping[str, Any] | None) -> str:
    """Where a poison turn's workers died, for its error message."""
    if in_flight is None:
        return "between steps"
    if in_flight.get("kind") == "tool":
        names = sorted({str(c.get("name")) for c in in_flight.get("calls") or []})
        return f"while running {', '.join(names) or 'its tool calls'} (step {in_flight.get('step')})"
    return f"during model request {in_flight.get('step')}"


def error_of(exc: BaseException, api_key: str | None) -> ErrorBody:
    """`{code, message}` of a failure, with the agent's credentials masked."""
    if isinstance(exc, FxError):
        code, message = exc.code, str(exc)
    else:
        code, message = Code.TURN_FAILED, f"{type(exc).__name__}: {exc}"
    return {"code": code, "message": mask_secret(message, api_key)}


def fenced_stop(session_id: str, epoch: int) -> FxLeaseLostError:
    """The stop of a delivery whose epoch no longer heads the session: stop writing."""
    return FxLeaseLostError(f"epoch {epoch} of {session_id} no longer heads the session")


def check_readable(entry: Input) -> None:
    """Raises `FxInputError` (`FX_INVALID_INPUT`) for an input the store could not decode,
    and `FxJournalVersionError` for one whose delegation link or answer type a newer
    release wrote."""
    if entry.unreadable:
        raise FxInputError(f"input {entry.message_id} cannot run: {entry.unreadable}")
    delegation.check_version(entry.settings)
    typed.check_version(entry.settings)


def _text(entry: Input) -> str | None:
    """The text of an input for its `turn_start` line."""
    if isinstance(entry.input, str):
        return entry.input
    return prompt_text(entry.input) if isinstance(entry.input, list) else None


# -- one turn -----------------------------------------------------------------------------


class Delivery(Protocol):
    """What a turn reads of the delivery running it (`Runner`)."""

    session_id: str
    epoch: int
    holder: str
    agent: WorkerAgent
    store: RedisStore
    deadline: Deadline
    stopped: Stopped
    released: Released | None
    waiting: Waiting

    @property
    def claim(self) -> Claim: ...

    def emit(self, type_: str, **fields: Any) -> None: ...


class TurnRun:
    """One turn (or one input ended without a turn) of a delivery: its id, its engine turn,
    its lines and its one end.

    `opened`: the store may hold the turn open (it is the claim's open turn, or its start
    was under way), so an end without an engine closes it (`end` mark). `entry`: the input
    it was made from in this delivery; an end other than the engine's own consumes it
    (`drop` mark), as its start record may never have been stored.
    """

    def __init__(
        self,
        delivery: Delivery,
        writer: LineWriter,
        turn_id: str,
        *,
        entry: Input | None = None,
        opened: bool = True,
        engine: Engine | None = None,
        persistence: StorePersistence | None = None,
    ) -> None:
        self.delivery = delivery
        self.writer = writer
        self.turn_id = turn_id
        self.entry = entry
        self.opened = opened
        self.engine = engine
        self.persistence = persistence  # the engine's, over the claim
        self.turn: Turn | None = None  # the engine's running turn
        self.ride: EndRide | None = None  # its end line, handed over to ride with its end record
        self.driving = False  # awaiting the running turn's end in `drive`
        self.engine_broken = False  # the engine could not end the turn: its state is suspect
        self.replied = False  # a delegated turn's answer went to its parent
        self.child_wakes: list[tuple[str, str]] = []  # children prompted before its pause, woken after it
        self.delegated_usage: dict[str, int] = {}  # its `delegate_end` lines' usage, summed (its `turn_end` says it)
        self.announced: set[str] = set()  # calls whose `delegate_start` is stored (read on resume) or queued

    def __repr__(self) -> str:
        return f"<TurnRun {self.turn_id} opened={self.opened} running={self.turn is not None}>"

    @property
    def let_go(self) -> bool:
        """Whether the turn's end record let the session go (nothing more under this epoch)."""
        return self.ride is not None and self.ride.released

    def detach(self) -> None:
        """Whatever the engine's turn still does is not stored."""
        if self.turn is not None:
            self.turn.detach()

    @property
    def input(self) -> Input | None:
        """The input this turn runs (its prompt), when this delivery knows it."""
        if self.entry is not None:
            return self.entry
        open_turn = self.delivery.claim.open_turn
        return open_turn.input if open_turn is not None and open_turn.message_id == self.turn_id else None

    @property
    def link(self) -> delegation.Link | None:
        """The parent call this turn answers (a delegated turn), if any."""
        turn_input = self.input
        return delegation.link_of(turn_input.settings) if turn_input is not None else None

    @property
    def output_type(self) -> str:
        """How the turn's answer type is named (`typed.StoredOutput.type`): its input's own,
        else the agent's (`"@agent"`)."""
        turn_input = self.input
        raw = turn_input.settings.get(typed.OUTPUT_KEY) if turn_input is not None and isinstance(
            turn_input.settings, Mapping) else None
        name = raw.get("type") if isinstance(raw, Mapping) else None
        return name if isinstance(name, str) else typed.AGENT_TYPE

    def parent(self) -> delegation.Parent:
        """This turn as the parent of the turns its delegating calls start."""
        delivery = self.delivery
        turn_input = self.input
        agent = delivery.agent
        return delegation.Parent(
            delivery.session_id, self.turn_id, agent, delivery.store, self.link,
            context=turn_input.context if turn_input is not None else None,
            max_depth=agent.max_delegation_depth, max_children=agent.max_children)

    def delegated_calls(self) -> list[delegation.Call]:
        """The parked turn's waiting calls of delegating tools."""
        if self.engine is None:
            return []
        return delegation.waiting_calls(self.engine, self.delivery.agent.tools)

    async def start_children(self) -> None:
        """Prompts the child turn of each waiting delegated call (idempotent): run before
        the record that parks the turn, and by a claim that finds it parked."""
        calls = self.delegated_calls()
        if calls:
            await delegation.start_children(self.parent(), calls, self.writer)

    async def cancel_children(self) -> None:
        calls = self.delegated_calls()
        if calls:
            await delegation.cancel_children(self.parent(), calls)

    async def reply(self, stop_reason: str, error: Mapping[str, Any] | None, usage: Mapping[str, int] | None,
                    text: str) -> None:
        """A delegated turn's answer to its parent's call, sent before its end is stored
        (`delegation.reply`); once per turn run."""
        link = self.link
        if link is None or self.replied:
            return
        delivery = self.delivery
        await delegation.reply(delivery.agent, delivery.store, link, child_session=delivery.session_id,
                               child_turn=self.turn_id, stop_reason=stop_reason, text=text, error=error, usage=usage)
        self.replied = True

    # ------------------------------------------------------------------ start and resume

    async def start(self, entry: Input) -> Outcome:
        """Starts the turn of `entry` on the engine and drives it to its end or yield."""
        assert self.engine is not None
        # The line rides with the engine's first record (the turn's start barrier).
        self.writer.push(dict(protocol.turn_start(self.turn_id, self.delivery.session_id, _text(entry))))
        span = self._trace(entry.traceparent, resumed=False)
        with _current(span):  # the engine's turn task starts under it: its spans are the turn's
            self.turn = self.engine.prompt(entry.input, yield_at=self.delivery.deadline.yield_at(),
                                           turn_id=self.turn_id)
        return await self._traced(span, self._run())

    async def resume(self, decisions: Sequence[Input] = ()) -> Outcome:
        """Resumes the claim's open turn: `turn_resume {interrupted, retract}`, then the
        claim's rule with what it had in flight, then its end, yield or pause. A parked
        turn resumes with `decisions` (inputs of kind `decision`, each for one of its calls)."""
        engine, claim = self.engine, self.delivery.claim
        assert engine is not None and claim.open_turn is not None
        open_turn = engine.core.conversation.open
        parked = open_turn is not None and open_turn.paused  # its pause was stored: not an interruption
        in_flight = engine.in_flight
        steps_seen = await self._steps_seen()
        recorded = engine.recorded_steps(self.turn_id)
        retract = sorted(s for s in steps_seen if s not in recorded)
        next_step = max([*steps_seen, *recorded, 0]) + 1
        self.writer.push(dict(protocol.turn_resume(self.turn_id, self.delivery.session_id,
                                                   interrupted=not (claim.open_turn.yielded or parked),
                                                   retract=retract)))
        await self.writer.flush()
        ruling = rule(claim, in_flight=in_flight, loaded=True)
        if ruling.stop_reason is not None:
            return await self.end(ruling.stop_reason, ruling.error)
        turn_input = claim.open_turn.input
        span = self._trace(turn_input.traceparent if turn_input is not None else None, resumed=True)
        if span is not None and decisions:
            span.set_attribute("fx.turn.decisions", len(decisions))
        decided, taken, stale = self._decisions(decisions)
        denied = [call for call in self.delegated_calls()
                  if isinstance(d := decided.get(call.id), Mapping) and d.get("type") == "deny"]
        if denied:
            # A delegated call answered otherwise (its wait timed out): its child turn stops,
            # and its answer, should one still come, finds the call decided.
            parent = self.parent()
            for call in denied:
                reason = decided[call.id]
                self.writer.push(dict(protocol.delegate_end(
                    self.turn_id, call_id=call.id,
                    session_id=delegation.child_session_id(parent.session_id, call.tool, call.execution_id),
                    agent=call.tool.agent, stop_reason="cancelled", usage={},
                    error={"code": Code.DECISION_EXPIRED, "message": str(reason.get("reason") or "denied")}
                    if isinstance(reason, Mapping) else None)))
            await delegation.cancel_children(parent, denied)
        if stale:
            await self.writer.flush(marks=[protocol.drop(message_id) for message_id in stale])
        with _current(span):
            self.turn = engine.resume(yield_at=self.delivery.deadline.yield_at(), no_rerun=ruling.no_rerun,
                                      next_step=next_step, decisions=decided or None, decision_inputs=taken or None)
        if self.turn is None:
            return await self._traced(span, self.end("unknown"))
        return await self._traced(span, self._run(cancel=claim.cancel_requested))

    def _decisions(self, inputs: Sequence[Input]) -> tuple[dict[str, object], dict[str, str], list[str]]:
        """The engine's `{call id: decision}` and `{call id: input id}` for `inputs`, and
        the inputs whose call the journal has decided already (a crash came between; they
        are dropped). The
        door checked each against the calls waiting (accept.lua); one the engine still
        refuses (its result too large, say) is a denial that says why, so no call waits
        for ever on an answer that cannot apply."""
        engine = self.engine
        assert engine is not None
        waiting = {call["id"] for call in engine.pending_calls}
        decided: dict[str, object] = {}
        taken: dict[str, str] = {}
        stale: list[str] = []
        for entry in inputs:
            body = entry.input if isinstance(entry.input, Mapping) else {}
            call_id, decision, by = body.get("callId"), body.get("decision"), body.get("by")
            if isinstance(decision, Mapping):
                # Who decided and when: the turn's `approval_decision` line names them.
                decision = {**decision, "at": entry.accepted_ms, **({"by": by} if isinstance(by, str) else {})}
            if not isinstance(call_id, str) or call_id not in waiting or call_id in decided:
                stale.append(entry.message_id)
                continue
            try:
                check_decisions(engine.core.conversation.open, {call_id: decision})
            except FxInputError as exc:
                log.warning("decision %s of %s cannot apply: %s", entry.message_id, self.delivery.session_id, exc)
                decision = approvals.deny(f"the decision could not apply ({exc.code}: {exc})")
            decided[call_id], taken[call_id] = decision, entry.message_id
            if (line := delegation.delegate_end(self.turn_id, body)) is not None:
                self.writer.push(line)
                self._count_delegated(line)
        return decided, taken, stale

    async def _run(self, *, cancel: bool = False) -> Outcome:
        self.yield_if_stopping()
        self.join_waiting_steers()
        if cancel:
            assert self.turn is not None
            self.turn.cancel()
        return await self.drive()

    def yield_if_stopping(self) -> None:
        """During a warm shutdown, the running turn sends no further model request (a
        request or tool call already running finishes first)."""
        if self.turn is not None and self.delivery.deadline.shutting_down:
            self.turn.yield_now()

    def join_waiting_steers(self) -> None:
        """Steers accepted while this turn waited to start (or to resume) join it (§6)."""
        waiting = self.delivery.waiting
        for later in waiting.steers():
            if not self.steer(later):
                return
            waiting.remove(later)

    def steer(self, entry: Input) -> bool:
        """Hands a steer from the inbox to the running turn; False when it is ending (the
        steer becomes the next turn)."""
        if self.turn is None:
            return False
        try:
            self.turn.steer(entry.input, id=entry.message_id)
        except FxInputError:
            return False
        self.delivery.waiting.hand(entry)
        return True

    # ------------------------------------------------------------------ lines

    def sink(self, event: Mapping[str, Any]) -> None:
        """The engine's `event_sink` for this turn: every event becomes a UI line of it; the
        turn's end (or yield) rides in the call of the record that ends (or yields) it."""
        delivery = self.delivery
        kind: LineType | None = event.get("type")  # per event: the plain read; the engine writes declared types
        if kind == "user_message":
            delivery.waiting.placed(str(event.get("id")))  # its `accepted` record went before it
        if delivery.stopped & (Stopped.CUT_OFF | Stopped.FENCED | Stopped.CLOSED):
            return
        if kind == "turn_end" or kind == "turn_yield" or kind == "turn_pause":
            if event.get("turnId") != self.turn_id:
                return  # an older turn the engine closed before starting this one: not ours
            persistence = self.persistence
            assert persistence is not None and self.engine is not None
            if kind == "turn_yield":
                self.ride = persistence.ride_with_end(dict(protocol.turn_yield(self.turn_id)))
                return
            if kind == "turn_pause":
                self.ride = persistence.ride_with_end(dict(protocol.turn_pause(
                    self.turn_id, self.engine.pending_calls, at_ms=now_ms())), before=self._children_before())
                return
            stop_reason, usage, error = event["stopReason"], event.get("usage"), event.get("error")
            line = self._end_line(stop_reason, usage, error)
            if "output" in event:
                line["output"] = event["output"]  # a typed turn's answer, as JSON
                line["outputType"] = self.output_type  # what a reader rebuilds it as
            self.ride = persistence.ride_with_end(line, release=self._may_release,
                                                  checkpoint=self.engine.settled_checkpoint,
                                                  before=self._answer(stop_reason, error, usage, line))
            return
        if kind == "approval_request" and (agent := self._delegates().get(str(event.get("name")))):
            event = {**event, "delegate": agent}  # another agent's turn answers it, not a person
        self.writer.push({**event, "messageId": self.turn_id})

    def _children_before(self) -> Callable[[], Awaitable[None]] | None:
        """For a turn that parks on delegated calls, their children's prompts, stored before
        the record that parks it (`EndRide.before`); woken once it is stored (`park`)."""
        # A call whose `delegate_start` is stored had its child prompted before that pause:
        # a turn parked again after some answers prompts only its new calls' children.
        calls = [call for call in self.delegated_calls() if call.id not in self.announced]
        if not calls:
            return None

        async def start() -> None:
            # The `delegate_start` lines ride with the pause, one per call whose line is not
            # stored (a worker that died before storing the pause, or a start retried after
            # its reply was lost, finds the children `repeated`: announced all the same).
            self.child_wakes = await delegation.start_children(self.parent(), calls, self.writer, wake=False,
                                                               announced=self.announced)
        return start

    def _answer(self, stop_reason: str, error: Mapping[str, Any] | None, usage: Mapping[str, int] | None,
                line: Mapping[str, Any]) -> Callable[[], Awaitable[None]] | None:
        """For a delegated turn, its answer to the parent, sent before its end record is
        stored (`EndRide.before`); None for any other turn. A typed turn answers with its
        object as JSON text."""
        if self.link is None:
            return None
        if "output" in line:
            text = json.dumps(line["output"], ensure_ascii=False, separators=(",", ":"))
        else:
            text = delegation.final_text(self.engine)  # the last response, as the end record leaves it

        async def answer() -> None:
            await self.reply(stop_reason, error, usage, text)
        return answer

    def _delegates(self) -> dict[str, str]:
        """The agent's delegating tools: {tool name: the agent it hands calls to}."""
        return {t.name: t.agent for t in self.delivery.agent.tools if isinstance(t, delegation.DelegateTool)}

    def _may_release(self) -> bool:
        """Asked as the end record is sent: may that call let the session go? Only for a
        turn ending in `drive` with no stop and no input waiting here, as then nothing
        follows it; the store lets go only if no input waits there either."""
        delivery = self.delivery
        return (self.driving and not delivery.stopped and delivery.released is None
                and not delivery.waiting.any())

    def _rode(self, type_: LineType) -> bool:
        """Whether this turn's `type_` line was stored with the engine's record."""
        return self.ride is not None and self.ride.stored and self.ride.line.get("type") == type_

    def report(self, error: Mapping[str, Any]) -> None:
        """`session.error` and a `session_error` line for this turn (or input)."""
        delivery = self.delivery
        delivery.emit("session.error", epoch=delivery.epoch, turn=self.turn_id, error=error)
        self.writer.push(dict(protocol.session_error(self.turn_id, error, self.turn_id)))

    # ------------------------------------------------------------------ the end

    async def drive(self) -> Outcome:
        """Waits for the running turn; writes its end, or its yield."""
        assert self.turn is not None
        delivery = self.delivery
        metrics.TURNS_RUNNING.inc()
        self.driving = True
        try:
            result = await self.turn.result()
        finally:
            self.driving = False
            metrics.TURNS_RUNNING.dec()
        if Stopped.CLOSED in delivery.stopped:
            raise Closed(delivery.session_id)  # detached: the next claim resumes it
        delivery.waiting.take_back_steers()
        if delivery.released is None and self.let_go:
            delivery.released = Released(released=True, cutoffs=0, pending=0)
        if Stopped.FENCED in delivery.stopped:
            raise fenced_stop(self.delivery.session_id, self.delivery.epoch)
        error = result.error
        if error and error.get("code") == Code.JOURNAL_APPEND_FAILED:
            cause = error.get("cause")
            if isinstance(cause, dict) and cause.get("code") == Code.FENCED:
                raise fenced_stop(self.delivery.session_id, self.delivery.epoch)
            if isinstance(cause, dict) and cause.get("code") in (Code.STORE_UNAVAILABLE, Code.STORE_FULL):
                # Redis went away (or is full) mid-turn: the turn stays open in the journal and the
                # next delivery resumes it; nothing to write here.
                log.warning("store lost mid-turn in %s; the turn resumes on the next delivery", delivery.session_id)
                self.turn = None
                delivery.stopped |= Stopped.STORE_LOST
                return Outcome.YIELDED
        if result.stop_reason == "paused" and Stopped.CUT_OFF not in delivery.stopped:
            return await self.park(result.pending_calls)
        if not self._rode("turn_end") and (Stopped.CUT_OFF in delivery.stopped or result.stop_reason == "yielded"):
            # The turn stays open in the journal; the next delivery continues it.
            if not self._rode("turn_yield"):
                self.writer.push(dict(protocol.turn_yield(self.turn_id)))
            await self.writer.flush()
            self.turn = None
            return Outcome.YIELDED
        return await self.end(result.stop_reason, error, usage=result.usage, by_engine=True)

    async def park(self, pending_calls: list[PendingCall]) -> Outcome:
        """The turn waits, parked, for decisions on `pending_calls` (§6 "Paused turns"): its
        `turn_pause` line (stored with the record that parked it, or now: a resume whose
        decisions leave calls waiting records no second pause), then nothing more here.
        The release lets the session rest (release.lua): no worker holds it until a
        decision or a cancel comes."""
        if not self._rode("turn_pause"):
            self.writer.push(dict(protocol.turn_pause(self.turn_id, pending_calls, at_ms=now_ms())))
        await self.writer.flush()
        self.turn = None
        wakes, self.child_wakes = self.child_wakes, []
        await delegation.wake_children(self.delivery.agent, wakes)  # the calls wait now: the children may answer
        timeout_s = self.delivery.agent.decision_timeout_s
        if timeout_s is not None:
            # Past it the sweeper denies what still waits (`Sweeper.end_waits`); a crash
            # before this note leaves the wait untimed until the turn parks again.
            delivery = self.delivery
            await delivery.store.note_wait(delivery.session_id, due_ms=now_ms() + int(timeout_s * 1000),
                                           timeout_s=timeout_s)
        return Outcome.PAUSED

    async def end(
        self,
        stop_reason: str,
        error: Mapping[str, Any] | None = None,
        *,
        usage: Mapping[str, int] | None = None,
        by_engine: bool = False,
    ) -> Outcome:
        """Ends the turn (or input) with `stop_reason`: the one place its `turn_end` line
        and store marks are built.

        `by_engine`: the engine ended it itself (its end record stored it; the line rode
        with that record unless a stop kept it off). Otherwise `error` goes out first as a
        `session_error` line; an engine holding the turn open ends it (its end record), else
        the store's open turn is closed (`end` mark); an input of this delivery is consumed
        (`drop`). The line and the marks are stored in one fenced call."""
        marks: list[Mark] = []
        if not by_engine:
            if error:
                self.report(error)
            ended = await self._end_in_engine(stop_reason, error)
            if ended is not None:
                usage = ended
            elif self.opened:
                marks.append({"end": True})
            if self.entry is not None:
                marks.append(protocol.drop(self.entry.message_id))
        if not self._rode("turn_end"):
            self.writer.push(self._end_line(stop_reason, usage, error))
        await self.reply(stop_reason, error, usage, "")  # a delegated turn's answer, unless it went with its end record
        await self.writer.flush(marks=marks)
        self.turn = None
        return Outcome.ENDED

    def _end_line(self, stop_reason: str, usage: Mapping[str, int] | None,
                  error: Mapping[str, Any] | None) -> dict[str, Any]:
        """The turn's `turn_end` line: built here only, for the end record's call and for `end`."""
        line = protocol.turn_end(self.turn_id, protocol.end_body(stop_reason, usage, error))
        if self.delegated_usage:
            line["delegatedUsage"] = dict(self.delegated_usage)
        turn_input = self.input
        accepted_ms = turn_input.accepted_ms if turn_input is not None else 0
        metrics.observe_turn_end(self.delivery.agent.name, stop_reason,
                                 (now_ms() - accepted_ms) / 1000 if accepted_ms else None)
        return dict(line)

    def _count_delegated(self, line: Mapping[str, Any]) -> None:
        """Adds a `delegate_end` line's usage to the turn's (this resume read the earlier ones)."""
        usage = line.get("usage")
        self.delegated_usage = add_usage(self.delegated_usage, usage if isinstance(usage, Mapping) else None)

    async def _end_in_engine(self, stop_reason: str, error: Mapping[str, Any] | None) -> dict[str, int] | None:
        """Ends the turn the engine holds open (its end record); its usage, or None when no
        engine holds it or the engine could not end it (the store ends it then)."""
        engine = self.engine
        if engine is None or engine.open_turn is None:
            return None
        try:
            result = await engine.end_open_turn(stop_reason, error=dict(error) if error else None)
        except STOPS:
            raise
        except Exception:  # noqa: BLE001 - a broken or detached engine: end it in the store
            log.warning("the engine of %s could not end turn %s", self.delivery.session_id, self.turn_id, exc_info=True)
            self.engine_broken = True
            return None
        return dict(result.usage or {}) if result is not None else {}

    async def end_cancelled(self, entry: Input) -> Outcome:
        """Ends an input cancelled before its turn started (a cancel sent before any worker
        ran, or while the turn before it ran): its `turn_start` and a `turn_end`
        `cancelled`, and the input consumed, in one call. The model never sees it, and the
        steers waiting behind it run as the next turn (§6)."""
        self.writer.push(dict(protocol.turn_start(self.turn_id, self.delivery.session_id, _text(entry))))
        return await self.end("cancelled")

    # ------------------------------------------------------------------ reading and tracing

    async def _steps_seen(self) -> set[int]:
        """The model steps of this turn that have lines in the UI stream."""
        delivery = self.delivery
        steps: set[int] = set()
        cursor = delivery.claim.turn_cursor  # the turn's start line: no scan of earlier turns
        while True:
            lines = await delivery.store.read_lines(delivery.session_id, cursor, count=1000)
            if not lines:
                return steps
            for line in lines:
                cursor = int(line["cursor"])
                if line.get("messageId") != self.turn_id:
                    continue
                if isinstance(line.get("step"), int):
                    steps.add(line["step"])
                elif line.get("type") == "delegate_end":
                    self._count_delegated(line)
                elif line.get("type") == "delegate_start":
                    self.announced.add(str(line.get("callId")))

    def _trace(self, traceparent: str | None, *, resumed: bool) -> trace.Span | None:
        """This delivery's part of the turn, in the trace of the request that sent its
        input (`fxworker.tracing`); None when tracing is off."""
        if not tracing.enabled():
            return None
        delivery = self.delivery
        claim = delivery.claim
        attributes = {"fx.session.id": delivery.session_id, "fx.turn.id": self.turn_id, "fx.epoch": delivery.epoch,
                      "fx.worker": delivery.holder, "fx.agent": delivery.agent.name, "fx.turn.resumed": resumed}
        takeover = ({"fx.deaths": claim.deaths, "fx.epoch": delivery.epoch}
                    if resumed and claim.taken_over else None)
        return tracing.start_delivery(traceparent, attributes, takeover=takeover)

    @staticmethod
    async def _traced(span: trace.Span | None, step: Awaitable[Outcome]) -> Outcome:
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


def _current(span: trace.Span | None) -> contextlib.AbstractContextManager[Any]:
    """`span` as the current span for the block (nothing when tracing is off)."""
    return trace.use_span(span, end_on_exit=False) if span is not None else contextlib.nullcontext()
