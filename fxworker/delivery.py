"""The delivery handler shared by the Celery task and `POST /v1/wake` (§7).

A wake `{sessionId, agent, reason}` is a hint: it carries no input, and the session's
lease decides who runs. The handler claims the session with the agent the wake names (or
this process's first), with no read before; the claim returns the owning agent from the
store (a forged `agent` field cannot reroute a session): when it is another agent of
this process on the same store the turn runs as that one, else the lease is let go at
once and the owner's agent is tried. After a yield it requeues a wake at once.

Outcomes (`protocol.Outcome`): `DONE` (the session was run until nothing was left),
`YIELDED` (the deadline came first; a new wake is queued), `NOOP` (a live lease stands
elsewhere — a duplicate or early wake —, nothing was left to run, or this worker was
fenced).

A wake for a session whose owning agent this process does not run is passed on to that
agent's queue when a live worker runs it (`liveness`: the workers' own marks), once (a
passed-on wake, reason `forward`, that misses again is not passed on again), and
is otherwise dropped: the sweeper keeps such a session's `noWorker` state and, past
`FX_NO_AGENT_GIVE_UP_S`, ends its inputs (§7). Nothing retries it through the broker.

Raises `FxNoAgentError` when this process has no agent of the session's name and no live
worker runs it (Celery drops the wake, HTTP answers 503), `FxUnknownSessionError` for a session the
store does not know (refused and dropped), and `FxStoreUnavailableError` when the claim
met a store outage for 2 s (the session stays in the ready set: the sweeper wakes
it again once the store is back). A store outage during the run itself is the runner's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NoReturn

from . import metrics, registry
from .errors import FxNoAgentError, FxUnknownSessionError
from .ids import now_ms
from .liveness import PROCESS_COUNTER, SENDER_TRUST_MS, served_by
from .protocol import Outcome, WorkerAgent
from .runner import Runner
from .runtime import LoopThread
from .settings import Settings
from .store import default_store
from .store.persistence import retry_unavailable

log = logging.getLogger("fxworker.delivery")

STATE_RETRY_MS = 2000  # how long routing a wake retries a store that does not answer


def _agent_for(hint: object) -> WorkerAgent | None:
    """The agent a wake is claimed with: the one it names, else this process's first."""
    agent = registry.get_agent(hint) if isinstance(hint, str) else None
    if agent is None:
        agent = next(iter(registry.agents().values()), None)
    return agent


async def handle_wake(
    payload: dict[str, Any],
    *,
    deadline_ms: int | None = None,
    loop_thread: LoopThread | None = None,
    settings: Settings | None = None,
    counted: bool = True,
) -> Outcome:
    """Runs the session a wake names; see the module docstring for outcomes and errors.

    Args:
        payload: `{sessionId, agent?, reason?}`.
        deadline_ms: when this delivery must be over (default `FX_DELIVERY_TIMEOUT_S` from now).
        loop_thread: the `fxworker.runtime.LoopThread` this runs on (shared HTTP client,
            warm-shutdown flag), when there is one.
        settings: the process's settings, for the store read of a process with no agent
            (from the environment when None).
        counted: a delivery of a queued wake, counted in this process's live mark (the
            sweeper's own settling of an unserved session is not).
    """
    if not counted:
        return await _handle_wake(payload, deadline_ms=deadline_ms, loop_thread=loop_thread, settings=settings)
    PROCESS_COUNTER.started(payload.get("sentMs") if isinstance(payload, dict) else None)
    try:
        return await _handle_wake(payload, deadline_ms=deadline_ms, loop_thread=loop_thread, settings=settings)
    finally:
        PROCESS_COUNTER.finished()


async def _handle_wake(
    payload: dict[str, Any], *, deadline_ms: int | None, loop_thread: LoopThread | None, settings: Settings | None,
) -> Outcome:
    session_id = payload.get("sessionId") if isinstance(payload, dict) else None
    reason = str(payload.get("reason") or "wake") if isinstance(payload, dict) else "wake"
    hint = payload.get("agent") if isinstance(payload, dict) else None
    agent = _agent_for(hint)
    if not isinstance(session_id, str):
        _refused(agent, None, "malformed wake")
        raise FxUnknownSessionError("a wake names no session")
    if agent is None:
        await _route_without_agents(session_id, settings or Settings.from_env())
    if deadline_ms is None:
        deadline_ms = now_ms() + int(agent.settings.delivery_timeout_s * 1000)

    def runner_for(chosen: WorkerAgent) -> Runner:
        return Runner(
            chosen,
            session_id,
            deadline_ms=deadline_ms,
            reason=reason,
            http_client=loop_thread.http_client_for(session_id) if loop_thread is not None else None,
            stopping=loop_thread.stopping if loop_thread is not None else None,
            closing=loop_thread.closing if loop_thread is not None else None,
        )

    # Claimed first, with no read before: the claim names the session's owning agent.
    runner = runner_for(agent)
    try:
        result = await runner.run()
        if result.outcome is Outcome.MISROUTED:
            # Owned by another agent on another store of this process, or by one this
            # process does not run: the lease was let go at once.
            owner = registry.get_agent(result.owner) if result.owner else None
            if owner is None:
                metrics.NO_AGENT_REFUSALS.inc()
                # One hop: a passed-on wake that misses again is dropped, not passed on again.
                if result.owner and reason != "forward" and await _forwarded(runner, session_id, result.owner):
                    return Outcome.NOOP
                unserved = result.unserved
                raise FxNoAgentError(
                    f"this process has no agent named {result.owner!r} (session {session_id})",
                    retry_at_ms=unserved.next_ms if unserved is not None else None,
                    spare=unserved is not None and unserved.spare,
                )
            runner = runner_for(owner)
            result = await runner.run()
            if result.outcome is Outcome.MISROUTED:
                raise FxNoAgentError(f"session {session_id} is not {owner.name!r}'s in that agent's store")
    except FxUnknownSessionError:
        _refused(agent, session_id, "unknown session")
        raise
    if result.outcome is Outcome.YIELDED:
        try:
            if (await runner.store.mark_woken([session_id], trust_ms=SENDER_TRUST_MS))[0]:
                await asyncio.to_thread(result.agent.wake, session_id, reason="yield")
        except Exception as exc:  # noqa: BLE001 - the broker is away too: the sweeper re-wakes it
            log.warning("requeueing %s failed (%s); the sweeper will wake it", session_id, exc)
        return Outcome.YIELDED
    if result.outcome is Outcome.DONE or result.outcome is Outcome.PAUSED:
        # An input accepted after the last look and before the release found the lease
        # held and its wake was a no-op: wake once more rather than wait for the sweeper.
        # The release counted what was waiting at that moment; only when it failed, look.
        try:
            if result.released is not None:
                more = result.released.pending > 0
            else:
                after = await runner.store.state(session_id)
                more = after is not None and after.status == "waiting"
            # A sender's wake still queued runs it too (one outstanding wake per session).
            if more and (await runner.store.mark_woken([session_id], trust_ms=SENDER_TRUST_MS))[0]:
                await asyncio.to_thread(result.agent.wake, session_id, reason="pending")
        except Exception as exc:  # noqa: BLE001 - the store or broker is away: the sweeper wakes it
            log.warning("looking for more work in %s failed (%s); the sweeper will wake it", session_id, exc)
        return Outcome.DONE
    return Outcome.NOOP


async def _forwarded(runner: Runner, session_id: str, owner: str) -> bool:
    """Passes the wake on to `owner`'s queue when a live worker runs that agent (a wake
    that reached the wrong queue); False when none does (the sweeper keeps the session)."""
    try:
        served = served_by(await runner.store.live_workers())
    except Exception as exc:  # noqa: BLE001 - the sweeper wakes it once the store answers
        log.warning("reading the live workers for %s failed: %s", session_id, exc)
        return False
    if owner not in served:
        log.info("session %s waits for agent %r, which no live worker runs", session_id, owner)
        return False
    if (await runner.store.mark_woken([session_id], trust_ms=SENDER_TRUST_MS))[0]:
        await asyncio.to_thread(runner.agent.wake, session_id, agent=owner, reason="forward")
    log.info("wake of %s passed on to agent %r", session_id, owner)
    return True


async def settle_unserved(session_id: str, agent: str, *, loop_thread: LoopThread | None = None,
                          settings: Settings | None = None) -> None:
    """The sweeper's claim of a session whose agent no live worker runs: it records the
    `noWorker` state (the claim takes nothing), or, past `FX_NO_AGENT_GIVE_UP_S`, ends
    the session's inputs `FX_NO_AGENT` (`Runner._give_up`). A process that has the agent
    but does not consume its queue leaves the session alone: its claim would run the turn
    here, on the sweeper's loop."""
    if registry.get_agent(agent) is not None:
        log.info("session %s waits for agent %r, which this process has but no live worker serves", session_id, agent)
        return
    try:
        await handle_wake({"sessionId": session_id, "agent": agent, "reason": "unserved"},
                          loop_thread=loop_thread, settings=settings, counted=False)
    except FxNoAgentError:
        pass  # nothing taken: it waits, and its state says for which agent


async def _route_without_agents(session_id: str, settings: Settings) -> NoReturn:
    """A process with no agent at all: refuse an unknown session, else say no agent runs it."""
    store = default_store(settings)
    started_ms = now_ms()
    try:
        # A read, safe to repeat: the first call on a connection a Redis restart closed fails.
        state = await retry_unavailable(
            lambda: store.state(session_id), due_ms=lambda: started_ms + STATE_RETRY_MS, what=f"reading {session_id}"
        )
    except (FxUnknownSessionError, ValueError) as exc:
        log.debug("state of %s: %s", session_id, exc)
        state = None
    if not state:
        _refused(None, session_id, "unknown session")
        raise FxUnknownSessionError(f"no session {session_id}")
    metrics.NO_AGENT_REFUSALS.inc()
    raise FxNoAgentError(f"this process has no agent named {state.agent!r} (session {session_id})")


def _refused(agent: WorkerAgent | None, session_id: str | None, reason: str) -> None:
    log.warning("session.refused session=%s reason=%s", session_id, reason)
    if agent is not None:
        agent.emit({"type": "session.refused", "sessionId": session_id, "reason": reason})


def handle_wake_blocking(
    payload: dict[str, Any], *, loop_thread: LoopThread, settings: Settings, deadline_ms: int | None = None
) -> Outcome:
    """`handle_wake` on `loop_thread`, from a worker thread (the Celery task, on its process's
    loop); `deadline_ms` defaults to `settings.delivery_timeout_s` from now."""
    if deadline_ms is None:
        deadline_ms = now_ms() + int(settings.delivery_timeout_s * 1000)
    return loop_thread.run(handle_wake(payload, deadline_ms=deadline_ms, loop_thread=loop_thread, settings=settings))
