"""The Celery app: the wake-up channel of the durable layer (§7).

Celery is only the wake-up; the lease is the truth. The broker is `FX_BROKER_URL` (default
`REDIS_URL`): a Redis, standalone or Sentinel-managed, or RabbitMQ (`fxworker.broker.
broker_config`). On Redis every broker key carries `FX_PREFIX` (kombu's `global_keyprefix`,
so deployments and test runs sharing a Redis do not collide); on RabbitMQ a vhost keeps
them apart. Each agent name has its own queue `fx.<name>`.

Run a worker with the threads pool, so one process carries many turns on one asyncio
loop (`fxworker.runtime`):

    FX_AGENTS=myapp.agents celery -A fxworker.celery_app worker -P threads -c 100 -Q fx.default

Time limits come from the store's own deadline (`FX_DELIVERY_TIMEOUT_S`, counted from
the task's start), not from Celery's prefork-only limits; the broker's visibility
timeout is set well above it so a running wake is never handed to a second worker.

This module is the app only. The task `fxworker.wake` and the worker's signal handlers
(agents import, process loop, sweeper, metrics, warm shutdown) live in `fxworker.tasks`,
which the app includes: a worker imports it before `worker_init`.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from .broker import broker_config
from .keys import queue_name
from .settings import Settings


def make_celery_app(settings: Settings | None = None) -> Celery:
    """A Celery app configured from `settings` (from the environment when None)."""
    settings = settings or Settings.from_env()
    app = Celery("fxworker", include=["fxworker.tasks"])
    broker = broker_config(settings.broker_url)
    app.conf.update(
        broker_url=broker.url,
        # kombu's Redis transports, kept consuming across a Redis restart (fxworker.broker).
        broker_transport=broker.transport,
        broker_transport_options={
            **broker.options,
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
        task_default_queue=queue_name("default"),
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
        **broker.conf,
    )
    app.fx_settings = settings
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
