"""What one claim runs (§5-§7): the open turn, then the waiting inputs in order.

`Work` runs inside the delivery (`Runner`, fxworker/runner.py), which holds the lease,
watches the inbox and keeps the deadline. For each thing that heads the session it makes a
`TurnRun` (fxworker/turns.py) on the claim's engine: the open turn resumed, an input
started, an input or turn ended without running (cancelled before it started, poison, no
worker for its agent, no progress). Any exception that is not one of the delivery's stops
ends what it hit (`_end_failed`), and the work goes on: nothing loops for ever.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Mapping
from typing import Any

import httpx

from fxengine.codes import Code
from fxengine.engine import Engine, create_engine
from fxengine.errors import FxInputError, FxJournalVersionError

from . import delegation, typed
from .protocol import ErrorBody, Outcome
from .store.persistence import LineWriter, StorePersistence
from .store.types import LAYOUT_LEVEL, Claim, Input
from .turns import (
    STOPS, Closed, Delivery, Stopped, TurnRun, Unsettled, check_readable, error_of, fenced_stop, rule,
)

log = logging.getLogger("fxworker.runner")

# Claims in a row with no input or step moving on, past which what heads the session ends
# FX_NO_PROGRESS: a backstop for any path that re-wakes and re-claims without progress
# (deaths, cut-offs and store outages have bounds of their own, well below it).
MAX_FUTILE_CLAIMS = 20


class Work:
    """The work of one claim, in order, on the claim's engine (kept while inputs share its
    context); `current` is the turn (or input) it is on."""

    def __init__(self, delivery: Delivery, writer: LineWriter, *, http_client: httpx.AsyncClient | None) -> None:
        self.delivery = delivery
        self.writer = writer
        self.http_client = http_client
        self.claim: Claim = delivery.claim
        self.session_id = delivery.session_id
        self.epoch = delivery.epoch
        self.agent = delivery.agent
        self.store = delivery.store
        self.current: TurnRun | None = None
        self.engine: Engine | None = None
        self.persistence: StorePersistence | None = None  # the engine's, over the claim
        self._engine_key: tuple[str, str] | None = None

    def __repr__(self) -> str:
        return f"<Work session={self.session_id} epoch={self.epoch} current={self.current!r}>"

    async def run(self) -> Outcome:
        """Runs the claim's open turn, then the waiting inputs in order, until none is left,
        the deadline's soft stop comes, or the delivery stops."""
        claim = self.claim
        if claim.give_up:
            return await self._give_up()
        if claim.futile > MAX_FUTILE_CLAIMS:
            await self._end_futile()
            claim = self.claim
        if claim.open_turn is not None:
            outcome = await self._step(self._continue_open_turn(), None)
            if outcome != Outcome.ENDED:
                return outcome  # yielded, stopped, or parked (the inputs behind it wait)
        first = True
        while True:
            if Stopped.FENCED in self.delivery.stopped:
                raise fenced_stop(self.session_id, self.epoch)
            if Stopped.CLOSED in self.delivery.stopped:
                raise Closed(self.session_id)
            if self.delivery.released is not None:
                # An input the watcher passed on after the release is not this runner's:
                # its own wake finds the session free.
                return Outcome.DONE
            entry = self.delivery.waiting.next()
            if entry is None:
                return Outcome.DONE
            if self.delivery.deadline.past_soft():
                self.delivery.waiting.put_back(entry)
                return Outcome.YIELDED
            ruling = rule(claim, first_input=first)
            if ruling.stop_reason is not None:
                outcome = await self._end_unstarted(entry, ruling.error)
            else:
                outcome = await self._step(self._start_turn(entry), entry)
            first = False
            if outcome != Outcome.ENDED:
                return outcome

    async def _step(self, step: Awaitable[Outcome], entry: Input | None) -> Outcome:
        """Awaits a turn's step; an exception that is not one of the runner's stops ends
        what it hit (`_end_failed`)."""
        try:
            outcome = await step
        except STOPS:
            raise
        except FxJournalVersionError as exc:
            outcome = await self._let_go_for_newer(exc, entry)
        except Exception as exc:  # noqa: BLE001 - every failure ends in a defined state
            outcome = await self._end_failed(exc, entry)
        await self._after_end()
        return outcome

    async def _after_end(self) -> None:
        """An engine that could not end its turn is suspect (`_requeue_rest`)."""
        if self.current is not None and self.current.engine_broken:
            await self._requeue_rest()

    async def _requeue_rest(self) -> None:
        """Closes an engine whose state is suspect: another engine of this claim would load
        a stale snapshot, so the rest of the session goes to a new delivery."""
        if self.engine is not None:
            await self.close_engine()
            self.delivery.stopped |= Stopped.REQUEUE

    async def _let_go_for_newer(self, exc: FxJournalVersionError, entry: Input | None) -> Outcome:
        """A stored layout written by a newer release (a downgrade, or a rolling deploy that
        went back): nothing is ended or dropped; the session is let go so that only a process
        that reads it claims it next (`_run`; claim.lua answers older ones `newer`)."""
        log.error("%s holds a stored layout this process cannot read (%s): %s; it is left for a newer process",
                  self.session_id, exc.code, exc)
        self.delivery.emit("session.newer", epoch=self.epoch, reads=LAYOUT_LEVEL, error=error_of(exc, self.agent.api_key))
        if self.current is not None:
            self.current.detach()
        self.current = None
        if entry is not None:
            self.delivery.waiting.put_back(entry)
        self.delivery.stopped |= Stopped.NEWER
        return Outcome.YIELDED

    async def _settled(self, ending: Awaitable[Outcome]) -> Outcome:
        """Awaits the write that ends a turn or input; `Unsettled` when it cannot be stored."""
        try:
            return await ending
        except STOPS:
            raise
        except Exception as exc:  # noqa: BLE001
            turn = self.current.turn_id if self.current is not None else None
            raise Unsettled(f"ending {turn} of {self.session_id} failed: {exc!r}") from exc

    def _turn(self, turn_id: str, *, entry: Input | None = None, opened: bool = True) -> TurnRun:
        """The `TurnRun` this delivery is on from now, on the claim's engine."""
        self.current = TurnRun(self.delivery, self.writer, turn_id, entry=entry, opened=opened, engine=self.engine,
                               persistence=self.persistence)
        return self.current

    async def _end_failed(self, exc: Exception, entry: Input | None) -> Outcome:
        """Ends the turn (or the input `entry` whose turn could not open) that `exc` hit:
        stop reason `error`, a `turn_end` and a `session_error` line. Raises `Unsettled`
        when even that cannot be stored."""
        error = error_of(exc, self.agent.api_key)
        turn = self.current
        if turn is None:
            turn_id = entry.message_id if entry is not None else None
            if turn_id is None and self.claim.open_turn is not None:
                turn_id = self.claim.open_turn.message_id
            turn = self._turn(turn_id or "", entry=entry)
        log.error("turn %s of %s failed: %s", turn.turn_id, self.session_id, error["code"], exc_info=exc)
        turn.detach()  # whatever it still does is not stored
        turn.turn = None
        self.delivery.waiting.take_back_steers()
        try:
            return await self._settled(turn.end("error", error))
        finally:
            await self._requeue_rest()

    async def _end_unstarted(self, entry: Input, error: ErrorBody | None) -> Outcome:
        """Ends an input without opening a turn for it (`drop`): its `turn_end` says why."""
        return await self._settled(self._turn(entry.message_id, entry=entry, opened=False).end("error", error))

    async def _start_turn(self, entry: Input) -> Outcome:
        self.current = None
        if Stopped.REQUEUE in self.delivery.stopped:
            self.delivery.waiting.put_back(entry)
            return Outcome.YIELDED
        if entry.cancelled:
            turn = self._turn(entry.message_id, entry=entry, opened=False)
            return await self._settled(turn.end_cancelled(entry))
        check_readable(entry)
        refused = delegation.refusal(delegation.link_of(entry.settings))
        if refused is not None:
            return await self._end_unstarted(entry, refused)  # a bound of delegation: its parent reads why
        try:
            typed.output_of(entry.settings, self.agent)
        except FxInputError as exc:  # its answer type does not import here: no engine could run it
            return await self._end_unstarted(entry, {"code": exc.code, "message": exc.message})
        engine = await self._open_engine(entry.context, entry.settings)
        if engine is None:
            self.delivery.waiting.put_back(entry)
            self.delivery.stopped |= Stopped.REQUEUE
            return Outcome.YIELDED
        return await self._turn(entry.message_id, entry=entry).start(entry)

    async def _continue_open_turn(self) -> Outcome:
        self.current = None
        open_turn = self.claim.open_turn
        assert open_turn is not None  # the claim found the turn open
        ruling = rule(self.claim)
        if not ruling.load:
            return await self._settled(self._turn(open_turn.message_id).end(ruling.stop_reason or "cancelled",
                                                                              ruling.error))
        turn_input = open_turn.input
        if turn_input is not None:
            check_readable(turn_input)
            try:
                typed.output_of(turn_input.settings, self.agent)
            except FxInputError as exc:
                return await self._settled(self._turn(open_turn.message_id).end(
                    "error", {"code": exc.code, "message": exc.message}))
        engine = await self._open_engine(
            getattr(turn_input, "context", None), getattr(turn_input, "settings", None)
        )
        assert engine is not None
        if engine.pending_calls:
            return await self._resume_parked(open_turn.message_id)
        return await self._turn(open_turn.message_id).resume()

    async def _resume_parked(self, turn_id: str) -> Outcome:
        """The open turn is parked (§6 "Paused turns"): a cancel ends it (its waiting calls
        denied); decisions resume it, again while more come during its run and calls still
        wait; with none it stays parked, and the prompts behind it wait with it. Each
        round takes decisions out of the store (bounded by the calls that wait)."""
        while True:
            turn = self._turn(turn_id)
            if self.claim.cancel_requested or self.delivery.waiting.cancelled_open:
                await turn.cancel_children()  # cancel travels down to the turns it delegated to
                return await self._settled(turn.end("cancelled"))
            decisions = self.delivery.waiting.take_decisions()
            open_turn = turn.engine.core.conversation.open if turn.engine is not None else None
            if not decisions and open_turn is not None and not open_turn.paused:
                # Its worker died after the calls that wait were held and before the pause was
                # stored (a sibling call ran meanwhile): the resume settles the rest of that
                # response and stores the pause (and prompts the children) then.
                return await turn.resume()
            if not decisions:
                # Its children were prompted before it parked; again here (a repeat is the
                # store's `repeated`) for a pause stored by a worker that died right after.
                await turn.start_children()
                await self.writer.flush()
                return Outcome.PAUSED
            waiting = turn.delegated_calls()
            outcome = await turn.resume(decisions)
            if outcome == Outcome.ENDED:
                # Ended with delegated calls still waiting (a cancel while it ran the others):
                # their children's turns stop too.
                answered = {d.input.get("callId") for d in decisions if isinstance(d.input, Mapping)}
                left = [call for call in waiting if call.id not in answered]
                if left:
                    await delegation.cancel_children(turn.parent(), left)
            if outcome != Outcome.PAUSED or self.delivery.stopped or self.delivery.deadline.past_soft():
                return outcome

    async def _give_up(self) -> Outcome:
        """Ends the open turn and every waiting input `error` FX_NO_AGENT: no process ran
        the session's agent for `FX_NO_AGENT_GIVE_UP_S` (claim.lua gave the lease for this)."""
        claim = self.claim
        waited_s = self.agent.settings.no_agent_give_up_s
        error: ErrorBody = {
            "code": Code.NO_AGENT,
            "message": f"no worker ran agent {claim.agent!r} for {waited_s:g} s; start a worker with that agent "
            "(FX_AGENTS) and prompt again",
        }
        log.error("giving up on %s: %s", self.session_id, error["message"])
        if claim.open_turn is not None:
            await self._settled(self._turn(claim.open_turn.message_id).end("error", error))
        while (entry := self.delivery.waiting.next()) is not None:
            await self._end_unstarted(entry, error)
        return Outcome.DONE

    async def _end_futile(self) -> None:
        """Ends what heads a session claimed `MAX_FUTILE_CLAIMS` times with nothing moving
        on (the open turn `cancelled`, else the first waiting input `error`), with
        FX_NO_PROGRESS; the inputs behind it run as usual."""
        claim = self.claim
        error: ErrorBody = {
            "code": Code.NO_PROGRESS,
            "message": f"this session was claimed {claim.futile} times in a row with no input or step moving on; "
            "what headed it was ended so the session can go on",
        }
        log.error("ending the head of %s: %s", self.session_id, error["message"])
        if claim.open_turn is not None:
            await self._settled(self._turn(claim.open_turn.message_id).end("cancelled", error))
            self.claim = dataclasses.replace(claim, open_turn=None)
        elif (entry := self.delivery.waiting.next()) is not None:
            await self._end_unstarted(entry, error)

    # ------------------------------------------------------------------ the engine

    async def _open_engine(self, context: Any, settings: dict[str, Any] | None) -> Engine | None:
        key = (repr(context), repr(settings))
        if self.engine is not None and self._engine_key == key:
            return self.engine
        if self.engine is not None:
            # Another context or model: this claim's engine would load a stale snapshot,
            # so hand the rest to the next delivery.
            return None
        settings = settings or {}
        self.engine = await create_engine(
            model=settings.get("model") or self.agent.model,
            api_key=self.agent.api_key,
            instructions=settings.get("instructions", self.agent.instructions),
            tools=self.agent.tools,
            provider=self.agent.provider,
            persistence=self._new_persistence(),
            on_event=self._engine_event,
            event_sink=self._sink,
            max_model_turns=self.agent.max_model_turns,
            model_idle_timeout_s=self.agent.settings.model_idle_timeout_s,
            http_client=self.http_client,
            session_id=self.session_id,
            context=context,
            epoch=self.epoch,
            **self._typed(settings),
        )
        self._engine_key = key
        return self.engine

    def _typed(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The engine's output options for a turn of these settings (checked by `output_of`
        before the engine opens)."""
        output = typed.output_of(settings, self.agent)
        if output is None:
            return {}
        return {"output_type": output.type, "output_mode": output.mode, "output_retries": output.retries}

    def _engine_event(self, event: dict[str, Any]) -> None:
        """`on_event` of the engine: add the session and epoch, pass to the agent."""
        if event.get("type") == "tool.rerun":
            log.info("tool.rerun session=%s epoch=%s %s", self.session_id, self.epoch, event)
        self.agent.emit({"sessionId": self.session_id, "epoch": self.epoch, **event})

    def _new_persistence(self) -> StorePersistence:
        self.persistence = StorePersistence(self.store, self.claim, writer=self.writer)
        return self.persistence

    def _sink(self, event: Mapping[str, Any]) -> None:
        """The engine's `event_sink`: the events of the turn this delivery is on."""
        if self.current is not None:
            self.current.sink(event)

    async def close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            try:
                await engine.close()
            except Exception:  # noqa: BLE001 - closing after a stop is best effort
                log.debug("closing the engine of %s failed", self.session_id, exc_info=True)
