"""The Celery task `fxworker.wake`: thin, it decodes the wake and calls the delivery handler."""

from __future__ import annotations

import logging
from typing import Any

from . import metrics
from .celery_app import app
from .errors import FxNoAgentError, FxStoreUnavailableError, FxUnknownSessionError

log = logging.getLogger("fxworker.tasks")


@app.task(name="fxworker.wake", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def wake(self: Any, payload: dict[str, Any]) -> str:
    """Delivers one wake `{sessionId, agent, reason}` to this worker's agent of that name.

    Redelivery is harmless: the wake carries no input (the worker reads inputs only from
    the store), and the session's lease decides who runs — a duplicate finds the lease
    held and returns "noop"; a worker that lost its lease has every write refused by the
    epoch fence. `FX_NO_AGENT` (no agent of the session's name here) retries with a short
    backoff so another worker of the queue takes it: the one Celery delay in the design.
    """
    from .delivery import handle_wake_blocking

    try:
        outcome = handle_wake_blocking(payload)
    except FxNoAgentError as exc:
        metrics.WAKES.labels(outcome="no_agent").inc()
        settings = app.fx_settings
        countdown_s = min(settings.no_agent_retry_s, 0.25 * 2 ** min(self.request.retries, 8))
        log.warning("%s: retrying in %.2f s", exc, countdown_s)
        raise self.retry(exc=exc, countdown=countdown_s) from exc
    except FxUnknownSessionError as exc:
        log.warning("wake refused and dropped: %s", exc)
        metrics.WAKES.labels(outcome="refused").inc()
        return "refused"
    except FxStoreUnavailableError as exc:
        # The session stays in the store's ready set; the sweeper wakes it once Redis is back.
        log.warning("wake %s not run, the store is unavailable: %s", payload, exc)
        metrics.WAKES.labels(outcome="unavailable").inc()
        return "unavailable"
    except Exception:
        metrics.WAKES.labels(outcome="error").inc()
        raise
    metrics.WAKES.labels(outcome=outcome).inc()
    return outcome
