"""The Celery app: the wake-up channel of the durable layer (§7).

Celery is only the wake-up; the lease is the truth. The broker is `REDIS_URL`, every
broker key carries `FX_PREFIX` (kombu's `global_keyprefix`, so deployments and test runs
sharing a Redis do not collide), and each agent name has its own queue `fx.<name>`.

Run a worker with the threads pool, so one process carries many turns on one asyncio
loop (`fxworker.runtime`):

    FX_AGENTS=myapp.agents celery -A fxworker.celery_app worker -P threads -c 100 -Q fx.default

Time limits come from the store's own deadline (`FX_DELIVERY_TIMEOUT_S`, counted from
the task's start), not from Celery's prefork-only limits; the broker's visibility
timeout is set well above it so a running wake is never handed to a second worker.

With `FX_METRICS_PORT` set, each worker process serves its Prometheus metrics there.

`worker_cancel_long_running_tasks_on_connection_loss` is turned on only for a pool that
can cancel a running task (prefork, not threads: there Celery's cancel raises
NotImplementedError for every running task at each broker connection loss). Under the
threads pool a turn whose broker connection dropped simply runs on; its message is
delivered again and that duplicate finds the lease held or the work done.
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
from typing import Any

from celery import Celery, signals

from .broker import NAME as BROKER_TRANSPORT
from .settings import Settings

log = logging.getLogger("fxworker.celery")


def make_celery_app(settings: Settings | None = None) -> Celery:
    """A Celery app configured from `settings` (from the environment when None)."""
    settings = settings or Settings.from_env()
    app = Celery("fxworker", include=["fxworker.tasks"])
    broker_url = settings.redis_url or "memory://"
    scheme = broker_url.partition("://")[0]
    app.conf.update(
        broker_url=broker_url,
        # kombu's Redis transport, kept consuming across a Redis restart (fxworker.broker).
        broker_transport=BROKER_TRANSPORT if scheme in ("redis", "rediss") else None,
        broker_transport_options={
            "global_keyprefix": f"{settings.prefix}:celery:",
            # A message not acked within this long is redelivered: keep it far above the
            # delivery deadline, so a long turn is never run by two workers at once
            # (the lease would refuse the second anyway).
            "visibility_timeout": int(settings.delivery_timeout_s * 3 + 60),
            # A dead broker connection is noticed within seconds, not at the next command.
            "socket_keepalive": True,
            "health_check_interval": 10,
            "retry_on_timeout": True,
        },
        # A lost broker connection is retried for ever: Redis restarts are transient.
        broker_connection_retry=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        task_default_queue="fx.default",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # Set per pool when the worker starts (`_cancel_on_connection_loss_where_supported`).
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_concurrency=settings.worker_concurrency,
        worker_pool="threads",
        worker_hijack_root_logger=False,
        task_serializer="json",
        accept_content=["json"],
    )
    app.fx_settings = settings  # type: ignore[attr-defined]
    return app


app = make_celery_app()


def pool_can_cancel(pool_cls: Any) -> bool:
    """Whether a Celery pool class can cancel a running task (`terminate_job`)."""
    from celery.concurrency import get_implementation
    from celery.concurrency.base import BasePool
    from celery.concurrency.prefork import TaskPool as PreforkPool

    resolved = get_implementation(pool_cls) if isinstance(pool_cls, str) else pool_cls
    if not isinstance(resolved, type):
        return False
    # prefork binds terminate_job to its process pool when it starts, not on the class.
    return issubclass(resolved, PreforkPool) or getattr(resolved, "terminate_job", None) is not BasePool.terminate_job


@signals.worker_init.connect
def _cancel_on_connection_loss_where_supported(sender: Any = None, **_: Any) -> None:
    """Cancels late-acked tasks on a broker connection loss only where the pool can (§7)."""
    pool_cls = getattr(sender, "pool_cls", None) or app.conf.worker_pool
    can_cancel = pool_can_cancel(pool_cls)
    app.conf.worker_cancel_long_running_tasks_on_connection_loss = can_cancel
    if not can_cancel:
        # Celery warns at each connection loss that the setting is off; with this pool
        # it cannot be on, and the lease makes the redelivered duplicate harmless.
        from celery.exceptions import CPendingDeprecationWarning

        warnings.filterwarnings(
            "ignore", message=".*worker_cancel_long_running_tasks_on_connection_loss", category=CPendingDeprecationWarning
        )


@signals.worker_init.connect
def _import_agents(sender: Any = None, **_: Any) -> None:
    """Imports `FX_AGENTS` once per worker process, before it takes any task."""
    from .registry import import_agents_module

    settings: Settings = app.fx_settings  # type: ignore[attr-defined]
    logging.getLogger("fxworker").setLevel(settings.log_level)
    names = import_agents_module(settings.agents_module)
    log.info("worker agents: %s (module %s)", ", ".join(names) or "none", settings.agents_module)


@signals.worker_ready.connect
def _on_ready(sender: Any = None, **_: Any) -> None:
    """Starts the process loop and the sweeper, then marks this worker ready in Redis."""
    from .runtime import process_loop
    from .sweeper import start_worker_sweeper

    settings: Settings = app.fx_settings  # type: ignore[attr-defined]
    process_loop()
    start_worker_sweeper(settings)
    if settings.metrics_port is not None:
        from . import metrics

        metrics.serve(settings.metrics_port, host=settings.metrics_host)
        log.info("metrics on http://%s:%s/metrics", settings.metrics_host, settings.metrics_port)
    hostname = getattr(sender, "hostname", None) or socket.gethostname()
    if settings.redis_url:
        from .sweeper import mark_worker_ready

        mark_worker_ready(settings, hostname=hostname, pid=os.getpid())
    log.info("worker %s ready (pid %s)", hostname, os.getpid())


@signals.worker_shutting_down.connect
def _on_shutting_down(**_: Any) -> None:
    """Warm shutdown (SIGTERM): running turns yield within their reserve and requeue."""
    from .runtime import begin_warm_shutdown

    begin_warm_shutdown()


@signals.worker_shutdown.connect
def _on_shutdown(**_: Any) -> None:
    from .sweeper import stop_worker_sweeper

    stop_worker_sweeper()
