"""How wakes reach a worker (§7): a wake is `{sessionId, agent, reason, sentMs}` and carries no input.

- `CeleryWaker` sends task `fxworker.wake` to queue `fx.<agent>` at once (no ETA or
  countdown: any delay lives in the store, never in a Celery ETA).
- `fxworker.embedded.InProcessWaker` hands the wake to an embedded worker loop of this
  process (the embedded dev mode, no Redis).

Duplicate wakes are harmless (the lease decides who runs); a lost wake only delays (the
sweeper re-wakes ready sessions).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .ids import now_ms
from .keys import queue_name
from .liveness import SENDER_TRUST_MS

if TYPE_CHECKING:
    from .store import RedisStore
    from .store.types import SessionState


def wake_payload(session_id: str, *, agent: str, reason: str) -> dict[str, Any]:
    """The message body of one wake. `sentMs` lets the workers' marks say how far their
    queue has been read (fxworker/liveness.py); a worker that does not know it ignores it."""
    return {"sessionId": session_id, "agent": agent, "reason": reason, "sentMs": now_ms()}


@runtime_checkable
class Waker(Protocol):
    """Delivers a wake for a session; must not block for long (it is called from sender paths)."""

    def wake(self, session_id: str, *, agent: str, reason: str) -> None: ...


# What a waker raises when its broker is away or full, unless it names its own
# (`failures`): a sender logs it and the sweeper wakes the session; anything else is a bug
# and raises.
BROKER_AWAY: tuple[type[BaseException], ...] = (OSError, TimeoutError)


async def cancel_with_wake(store: RedisStore, session_id: str, *, message_id: str | None,
                           wake: Callable[[str], Awaitable[None]]) -> tuple[str | None, SessionState | None]:
    """A cancel request as every sender makes it: the ready mark first (a parked turn's
    session is out of the ready set, and the sweeper must find its cancel if the wake is
    lost, §5), the request (`message_id`'s turn, or the open or next one), then
    `wake(owning agent)` only when the session waits and no wake of it is outstanding (§7:
    a cancel sent before any worker ran costs no second wake). The targeted message id and
    the session's state (None: no such session)."""
    await store.mark_ready(session_id)
    target = await store.request_cancel(session_id, message_id=message_id)
    state = await store.state(session_id)
    if (state is not None and state.status == "waiting"
            and (await store.mark_woken([session_id], trust_ms=SENDER_TRUST_MS))[0]):
        await wake(state.agent)
    return target, state


def wake_failures(waker: Any) -> tuple[type[BaseException], ...]:
    """The exceptions of `waker.wake` that mean its broker is away (see `BROKER_AWAY`)."""
    failures = getattr(waker, "failures", None)
    return tuple(failures) if failures is not None else BROKER_AWAY


class CeleryWaker:
    """Sends `fxworker.wake` to `fx.<agent>` on the Celery broker, immediately."""

    def __init__(self, app: Any = None) -> None:
        self._app = app

    def __repr__(self) -> str:
        return f"<CeleryWaker app={getattr(self._app, 'main', None)!r}>"

    @property
    def app(self) -> Any:
        if self._app is None:
            # Imported on first use: `import fxworker` reaches this module, and must not
            # build the Celery app (settings read from the environment at that moment)
            # nor import Celery, which the embedded mode never uses.
            from .celery_app import app

            self._app = app
        return self._app

    @property
    def failures(self) -> tuple[type[BaseException], ...]:
        """What `wake` raises when the broker is away or full: kombu's connection errors
        (the Redis transport's, refused writes included, and RabbitMQ's), a Redis error, a
        socket error or a timeout. Read only after a wake failed: it imports kombu."""
        from kombu.exceptions import OperationalError
        from redis.exceptions import RedisError

        return (OperationalError, RedisError, *BROKER_AWAY)

    def wake(self, session_id: str, *, agent: str, reason: str) -> None:
        args = [wake_payload(session_id, agent=agent, reason=reason)]
        # The message's repr of its arguments, for monitors: Celery's own (`saferepr`) is a
        # third of a send's CPU; for three short strings `repr` writes the same text.
        self.app.send_task("fxworker.wake", args=args, queue=queue_name(agent), argsrepr=repr(args), kwargsrepr="{}")
