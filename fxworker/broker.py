"""The Celery broker transport: kombu's Redis transport, surviving a Redis restart.

When the broker connection drops while a wake is being run (acks late, so its message is
unacknowledged), Celery collects the broken connection — which detaches kombu's
transport from its connection parameters — and then closes it, and the channel's close
restores the unacknowledged messages through a new Redis client built from those
parameters. With the parameters gone that raises `AttributeError`, which Celery treats
as unrecoverable: the worker process stops consuming and exits. The ack of the running
wake, when it finishes, takes the same road.

`Transport` keeps each channel's connection parameters, so the restore (or the late ack)
reconnects with them; while Redis is still away it fails with a connection error, which
kombu and Celery already tolerate (the message stays in the broker's unacked set and is
redelivered after the visibility timeout; the sweeper re-wakes the session sooner).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

NAME = "fxworker.broker:Transport"


class Channel(kombu_redis.Channel):
    """A kombu Redis channel that remembers the connection it was opened for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fx_conninfo = self.connection.client

    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None and self._fx_conninfo is not None:
            # Collected after a connection loss: reconnect with the parameters it had.
            self.connection.client = self._fx_conninfo
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above (`broker_transport` of the Celery app)."""

    Channel = Channel
