"""The Celery task `fxworker.wake` and the worker's signal handlers (§7).

The task is thin: it decodes the wake and calls the delivery handler. The app
(`fxworker.celery_app`) includes this module, so a worker imports it, and connects the
handlers, before `worker_init`:

- `worker_init`: imports `FX_AGENTS` once per process, before any task; turns on
  `worker_cancel_long_running_tasks_on_connection_loss` only for a pool that can cancel a
  running task (prefork, not threads: there Celery's cancel raises NotImplementedError for
  every running task at each broker connection loss). Under the threads pool a turn whose
  broker connection dropped simply runs on; its message is delivered again and that
  duplicate finds the lease held or the work done.
- `worker_ready`: stops consuming the queue of any agent the process does not run (a
  `--queues` or deploy mistake: its wakes are left for a worker that runs it, never
  refused over and over), starts the process loop (and builds its HTTP clients) and the
  sweeper with this process's live mark (fxworker/liveness.py), serves the Prometheus
  metrics on `FX_METRICS_PORT` when set, and marks the worker ready in Redis.
- `worker_shutting_down` (SIGTERM): warm shutdown, running turns yield and requeue.
- `worker_shutdown`: stops the sweeper and deletes the live mark.

The worker process's own state lives here and is passed down: its loop
(`process_loop()`, where every delivery of the process runs) and its sweeper.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import warnings
from concurrent.futures import Future
from typing import Any

from celery import signals
from celery.exceptions import CPendingDeprecationWarning

from . import embedded, metrics, registry, tracing
from . import broker
from .celery_app import app, pool_can_cancel
from .delivery import handle_wake_blocking, settle_unserved
from .errors import FxNoAgentError, FxStoreUnavailableError, FxUnknownSessionError
from .liveness import PROCESS_COUNTER
from .registry import import_agents_module
from .runtime import LoopThread, SharedLoop
from .settings import Settings
from .store.preflight import check_server
from .sweeper import Sweeper, mark_worker_ready, start_worker_sweeper
from .wakers import CeleryWaker

log = logging.getLogger("fxworker.tasks")
celery_log = logging.getLogger("fxworker.celery")

# ---------------------------------------------------------------------------- the worker process

_process_loop = SharedLoop("fx-loop")  # task threads may ask for it at once
_sweeper: tuple[Sweeper, Future[None]] | None = None  # set on worker_ready, stopped on worker_shutdown
_served: tuple[str, ...] = ()  # the agents whose queue this worker consumes (set on worker_ready)


def process_loop() -> LoopThread:
    """The one loop of this process (started on first use)."""
    return _process_loop.get()


def begin_warm_shutdown() -> None:
    """Asks every running turn of this process — the process loop's and the embedded
    workers', if any — to yield within its reserve and requeue."""
    loop = _process_loop.running
    if loop is not None:
        loop.stopping.set()
    embedded.begin_warm_shutdown()


# ---------------------------------------------------------------------------- the task


@app.task(name="fxworker.wake", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def wake(self: Any, payload: dict[str, Any]) -> str:
    """Delivers one wake `{sessionId, agent, reason}` to this worker's agent of that name.

    Redelivery is harmless: the wake carries no input (the worker reads inputs only from
    the store), and the session's lease decides who runs — a duplicate finds the lease
    held and returns "noop"; a worker that lost its lease has every write refused by the
    epoch fence. A wake for an agent this process does not run was passed on to a live
    worker of it, or finds none (`FX_NO_AGENT`): it is dropped, not retried; the sweeper
    keeps that session's `noWorker` state until a worker of its agent starts (§7).
    """
    try:
        outcome = handle_wake_blocking(payload, loop_thread=process_loop(), settings=app.fx_settings)
    except FxNoAgentError as exc:
        metrics.WAKES.labels(outcome="no_agent").inc()
        log.warning("%s: no live worker runs it; the session waits (noWorker) and the sweeper keeps it", exc)
        return "no_agent"
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


# ---------------------------------------------------------------------------- signal handlers


@signals.worker_init.connect
def _cancel_on_connection_loss_where_supported(sender: Any = None, **_: Any) -> None:
    """Cancels late-acked tasks on a broker connection loss only where the pool can (§7)."""
    pool_cls = getattr(sender, "pool_cls", None) or app.conf.worker_pool
    can_cancel = pool_can_cancel(pool_cls)
    app.conf.worker_cancel_long_running_tasks_on_connection_loss = can_cancel
    if not can_cancel:
        # Celery warns at each connection loss that the setting is off; with this pool
        # it cannot be on, and the lease makes the redelivered duplicate harmless.
        warnings.filterwarnings(
            "ignore", message=".*worker_cancel_long_running_tasks_on_connection_loss", category=CPendingDeprecationWarning
        )


@signals.worker_init.connect
def _import_agents(sender: Any = None, **_: Any) -> None:
    """Imports `FX_AGENTS` once per worker process, before it takes any task."""
    settings: Settings = app.fx_settings
    logging.getLogger("fxworker").setLevel(settings.log_level)
    for name in ("httpx", "httpcore"):
        # At the worker's INFO they would log a line per model request; a level set by
        # the application stands.
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)
    problems = check_server(settings)
    if problems:
        # A signal handler's exception is only logged by Celery: leave as `fx worker` would.
        celery_log.critical("the worker cannot start: %s", "; ".join(problems))
        logging.shutdown()
        os._exit(2)
    tracing.configure_from_env("fx-worker")
    names = import_agents_module(settings.agents_module)
    celery_log.info("worker agents: %s (module %s)", ", ".join(names) or "none", settings.agents_module)


@signals.worker_ready.connect
def _on_ready(sender: Any = None, **_: Any) -> None:
    """Starts the process loop and the sweeper, then marks this worker ready in Redis."""
    global _sweeper, _served
    settings: Settings = app.fx_settings
    _served = _consume_only_served_queues(sender)
    # The pool's size: a worker with a free slot takes what its queues hold (its live mark).
    PROCESS_COUNTER.capacity = int(getattr(getattr(sender, "controller", None), "concurrency", None)
                                   or settings.worker_concurrency)
    # A free slot proves a queued wake lost only while the consumer hears from the broker
    # (known on the Redis transports, whose receive ticks POLLS).
    if app.conf.broker_transport in (broker.NAME, broker.SENTINEL_NAME):
        PROCESS_COUNTER.consuming = broker.POLLS.consuming_since
    loop = process_loop()
    loop.build_http_clients()  # off the first turns' path (each takes a few ms)
    if _sweeper is None:
        _sweeper = start_worker_sweeper(
            settings, loop=loop, waker=CeleryWaker(app), agents=lambda: _served,
            unserved=lambda sid, agent: settle_unserved(sid, agent, loop_thread=loop, settings=settings),
        )
    if settings.metrics_port is not None:
        metrics.serve(settings.metrics_port, host=settings.metrics_host)
        celery_log.info("metrics on http://%s:%s/metrics", settings.metrics_host, settings.metrics_port)
    hostname = getattr(sender, "hostname", None) or socket.gethostname()
    if settings.store_url:
        mark_worker_ready(settings, hostname=hostname, pid=os.getpid())
    tune_gc()
    celery_log.info("worker %s ready (pid %s)", hostname, os.getpid())


def _consume_only_served_queues(consumer: Any) -> tuple[str, ...]:
    """Stops consuming `fx.<name>` for every agent name this process does not run, saying
    so; returns the agents whose queue it consumes (what its live mark says it runs).

    A wake taken from such a queue could only be refused, and a refused wake retried on
    the same queue kept landing on the refusing worker beside one that runs the agent."""
    runs = set(registry.agents())
    queues = getattr(getattr(consumer, "task_consumer", None), "queues", None) or []
    names = [getattr(queue, "name", "") for queue in queues]
    served = []
    for name in names:
        agent = name[len("fx."):] if name.startswith("fx.") else None
        if agent is None:
            continue
        if agent in runs:
            served.append(agent)
            continue
        celery_log.warning(
            "FX_NO_AGENT: this worker does not run agent %r (FX_AGENTS=%s), so it does not consume its queue %s; "
            "start a worker with that agent", agent, app.fx_settings.agents_module, name)
        consumer.cancel_task_queue(name)
    if names and not served:
        celery_log.error("this worker consumes none of its queues (%s): none is an agent it runs (%s)",
                         ", ".join(names), ", ".join(sorted(runs)) or "none")
    return tuple(sorted(served))


# The young generation's threshold in a worker (Python's default: 700 allocations).
GC_YOUNG_THRESHOLD = 20_000


def tune_gc() -> None:
    """Tunes the collector for a long-lived server: what start-up built (modules, agents,
    clients) is never garbage, so it leaves the generations the collector walks
    (`gc.freeze`); and a streaming turn allocates a few containers per chunk, so the young
    generation is collected every `GC_YOUNG_THRESHOLD` allocations instead of 700 (each
    collection stalls every turn of the process at once)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


@signals.worker_shutting_down.connect
def _on_shutting_down(**_: Any) -> None:
    """Warm shutdown (SIGTERM): running turns yield within their reserve and requeue."""
    begin_warm_shutdown()


@signals.worker_shutdown.connect
def _on_shutdown(**_: Any) -> None:
    """Stops the sweeper."""
    global _sweeper
    if _sweeper is not None:
        sweeper = _sweeper[0]
        sweeper.stop()
        _sweeper = None
        loop = _process_loop.running
        if sweeper.liveness is not None and loop is not None:
            try:
                loop.run(sweeper.liveness.forget(), timeout_s=2.0)
            except Exception:  # noqa: BLE001 - the mark expires on its own
                log.debug("deleting the live mark failed", exc_info=True)
