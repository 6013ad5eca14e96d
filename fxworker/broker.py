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

Two more faults would end the worker process the same way, and are caught at the one
place a message is received (`Channel._brpop_read`):

- **Bytes that are not a message** (not JSON, JSON that is not a kombu envelope, a body
  that is not base64): logged once with the queue and an excerpt, pushed onto the
  dead-letter list `<prefix>:celery:dead` (`keys.DEAD_LETTER_LIST`, the newest
  `DEAD_LETTER_MAX` entries, each `{queue, reason, at_ms, raw}` as JSON) and so taken off
  the queue; the worker goes on. A wake is a hint: a session it was meant for keeps its
  ready mark, and the sweeper wakes it.
- **An error reply from Redis** (`OOM` at `maxmemory`, `READONLY` during a failover,
  `LOADING` after a restart, `BUSY` behind a long script) on the receive or on the
  unacked bookkeeping after it: raised as a connection error, which Celery answers by
  reconnecting with its backoff, for ever, instead of exiting. A message popped whose
  bookkeeping failed is lost to the broker only: its session keeps its ready mark.

Every reply to the receive (a message, or the empty reply of a BRPOP that timed out)
ticks `POLLS`: since when this process has heard from its broker without a gap. A worker's
live mark says it has a free slot only while it does (fxworker/liveness.py): a worker
whose broker connection is down, or not back yet after a restart, takes nothing from its
queues, so its free slots prove no wake lost.

A replica in the primary's place (a failover without Sentinel, or a URL on a replica)
answers PING, so a reconnect "succeeds" at once and the next bookkeeping write fails
again: the worker would reconnect a few hundred times a second, each with its log lines,
until Celery's restart limit (5 a second). So a channel opens only on a primary
(`INFO replication`): on a replica its opening fails with `ReadOnlyError`, a connection
error Celery retries with its growing interval (2 s up to 30 s), and the worker says so
once, and once more when the primary is back.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from queue import Empty
from typing import Protocol
from urllib.parse import parse_qs, quote

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

from .errors import FxConfigError
from .keys import DEAD_LETTER_LIST
from .urls import parse_store_url

# Longest silence of the receive loop (BRPOP times out each second) that still counts as
# consuming; a longer one starts `PollClock.since_ms` again.
POLL_GAP_MS = 3000


class PollClock:
    """When this process's consumer last had a reply from the broker, and since when it has
    had them with no gap longer than `POLL_GAP_MS`."""

    def __init__(self) -> None:
        self.last_ms = 0
        self.since_ms = 0

    def __repr__(self) -> str:
        return f"<PollClock since_ms={self.since_ms} last_ms={self.last_ms}>"

    def polled(self) -> None:
        now = int(time.time() * 1000)
        if now - self.last_ms > POLL_GAP_MS:
            self.since_ms = now
        self.last_ms = now

    def consuming_since(self, now_ms: int) -> int | None:
        """Since when the consumer has heard from the broker without a gap; None when it
        has not in the last `POLL_GAP_MS` (or ever)."""
        return self.since_ms if self.last_ms and now_ms - self.last_ms <= POLL_GAP_MS else None


POLLS = PollClock()

NAME = "fxworker.broker:Transport"
SENTINEL_NAME = "fxworker.broker:SentinelTransport"
DEAD_LETTER_MAX = 1000  # the dead-letter list keeps this many of the newest entries
EXCERPT_CHARS = 200  # of an undecodable message, in the log line

log = logging.getLogger("fxworker.broker")


def undecodable(raw: bytes) -> tuple[dict[str, object] | None, str | None]:
    """(the kombu envelope, None), or (None, why it is not one)."""
    try:
        payload = json.loads(bytes_to_str(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"not JSON ({exc})"
    properties = payload.get("properties") if isinstance(payload, dict) else None
    if not isinstance(properties, dict):
        return None, "JSON that is not a kombu envelope (no properties object)"
    if "delivery_tag" not in properties:
        return None, "a kombu envelope without a delivery tag"
    body = payload.get("body")
    if properties.get("body_encoding") == "base64":
        try:
            base64.b64decode(body if isinstance(body, (str, bytes)) else "", validate=True)
        except (binascii.Error, ValueError) as exc:
            return None, f"a body that is not base64 ({exc})"
    return payload, None


class QoS(kombu_redis.QoS):
    """kombu's unacked bookkeeping, when Redis refuses it with an error reply (OOM under a
    transaction, READONLY): the message stays in the unacked set, and is delivered again
    after the visibility timeout (a duplicate wake, which the lease makes harmless), instead
    of ending the consumer."""

    def ack(self, delivery_tag: object) -> None:
        try:
            self._remove_from_indices(delivery_tag).execute()
        except ResponseError as exc:
            log.warning("acknowledging a message failed (%s): it will be delivered again", exc)
        virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: object, requeue: bool = False) -> None:
        try:
            if requeue:
                self.restore_by_tag(delivery_tag, leftmost=True)
            else:
                self._remove_from_indices(delivery_tag).execute()
        except ResponseError as exc:
            log.warning("rejecting a message failed (%s): it will be delivered again", exc)
        virtual.QoS.ack(self, delivery_tag)

    def restore_unacked(self, client: object = None) -> None:
        try:
            super().restore_unacked(client)
        except ResponseError as exc:
            log.warning("restoring unacknowledged messages failed (%s): they return after the visibility timeout", exc)
            self._delivered.clear()

    def restore_visible(self, *args: object, **kwargs: object) -> None:
        try:
            super().restore_visible(*args, **kwargs)
        except ResponseError as exc:
            log.warning("restoring timed-out messages failed (%s): tried again later", exc)


class Channel(kombu_redis.Channel):
    """A kombu Redis channel that remembers the connection it was opened for."""

    QoS = QoS

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._fx_conninfo = self.connection.client
        try:
            _refuse_a_replica(self.client)
        except Exception:
            # As kombu does when its PING fails, and out of the poller it joined after it.
            self.connection.cycle.discard(self)
            self._disconnect_pools()
            raise

    def _brpop_read(self, **options: object) -> bool:
        """kombu's receive, surviving error replies and bytes that are not a message."""
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            except ResponseError as exc:
                self.client.connection.disconnect()
                raise _reconnect(exc, "receiving") from exc
            POLLS.polled()
            if not dest__item:
                raise Empty()
            dest, item = dest__item
            dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            payload, why = undecodable(item)
            if payload is None:
                self._dead_letter(dest, item, why or "undecodable")
                return True
            try:
                self.connection._deliver(payload, dest)
            except ResponseError as exc:
                raise _reconnect(exc, "recording a received message") from exc
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # as kombu's own _brpop_read does
            flush = getattr(self, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()

    def _dead_letter(self, queue: str, raw: bytes, why: str) -> None:
        excerpt = repr(raw[:EXCERPT_CHARS])
        log.warning("an undecodable message in queue %s goes to the dead-letter list: %s; %s", queue, why, excerpt)
        entry = json.dumps({
            "queue": queue, "reason": why, "at_ms": int(time.time() * 1000),
            "raw": raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw),
        })
        try:
            self.client.lpush(DEAD_LETTER_LIST, entry)  # kombu's client adds the key prefix
            self.client.execute_command("LTRIM", self.global_keyprefix + DEAD_LETTER_LIST, 0, DEAD_LETTER_MAX - 1)
        except ResponseError as exc:  # Redis full: the message is dropped, and said so above
            log.warning("the dead-letter list refused it (%s)", exc)

    def _connparams(self, asynchronous: bool = False) -> dict[str, object]:
        if self.connection is None:
            # Closed by another thread's reconnect while this one held it (a producer shared
            # under a burst of connection errors): a connection error, so kombu's retry
            # policy goes on with a fresh channel instead of failing the publish.
            raise RedisConnectionError("the broker channel was closed by a reconnect")
        if self.connection.client is None and self._fx_conninfo is not None:
            # Collected after a connection loss: reconnect with the parameters it had.
            self.connection.client = self._fx_conninfo
        params: dict[str, object] = super()._connparams(asynchronous=asynchronous)
        return params


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above (`broker_transport` of the Celery app).

    A full Redis (`OOM`) and a replica in a primary's place (`READONLY`) are connection
    errors here, wherever kombu meets them (a queue's declare on reconnect, a publish):
    Celery reconnects with its backoff, and a producer retries under its retry policy,
    instead of the worker exiting on an "unrecoverable" error.
    """

    Channel = Channel
    connection_errors = (*kombu_redis.Transport.connection_errors, OutOfMemoryError, ReadOnlyError)


_on_replica = False  # whether the last channel this process opened found a replica (logged once)


class _Replication(Protocol):
    """What `_refuse_a_replica` asks of a channel's redis-py client."""

    def info(self, section: str, /) -> Mapping[str, object]: ...


def _refuse_a_replica(client: _Replication) -> None:
    """Raises `ReadOnlyError` (a connection error here) when `client`'s Redis is a replica."""
    global _on_replica
    try:
        info = client.info("replication")
    except ResponseError:
        return  # INFO refused (a restricted command): the first write will tell
    if str(info.get("role", "master")) not in ("slave", "replica"):
        if _on_replica:
            _on_replica = False
            log.warning("the broker is a primary again: consuming")
        return
    if not _on_replica:
        _on_replica = True
        log.warning("the broker is a read-only replica (of %s:%s): waiting for a primary, retrying with backoff; "
                    "point the broker URL at the primary, or use Sentinel, which follows a failover",
                    info.get("master_host", "?"), info.get("master_port", "?"))
    raise ReadOnlyError("the broker is a read-only replica, not a primary")


def _reconnect(exc: ResponseError, what: str) -> RedisConnectionError:
    """An error reply met while `what`, as the connection error Celery reconnects on."""
    log.warning("Redis answered an error while %s (%s): reconnecting", what, exc)
    return RedisConnectionError(f"Redis answered an error while {what}: {exc}")


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """`Channel` on the primary a set of sentinels names (kombu's Sentinel channel)."""


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with the same resilience as `Transport`."""

    Channel = SentinelChannel
    connection_errors = Transport.connection_errors


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """How Celery reaches the broker a URL names: kombu's URL, the transport class, the
    transport options to add, and the Celery settings that broker needs."""

    kind: str  # "redis", "sentinel", "amqp" or "memory"
    url: str
    transport: str | None = None
    options: dict[str, object] = field(default_factory=dict)
    conf: dict[str, object] = field(default_factory=dict)


def broker_config(url: str | None) -> BrokerConfig:
    """The Celery configuration of the broker at `url` (`FX_BROKER_URL`, default `REDIS_URL`).

    - `redis://`, `rediss://`: this module's `Transport`, keys under the prefix;
    - `redis+sentinel://[:password@]host:port,host:port/<master>[/db]` (the store's form; or
      kombu's `sentinel://host:port;sentinel://...` with the master in
      `?master_name=`): `SentinelTransport` on the primary the sentinels name;
    - `amqp://`, `amqps://`, `pyamqp://` (RabbitMQ): durable quorum queues, publisher
      confirms (a wake is sent once the broker has it); isolate deployments by vhost;
    - none: `memory://` (this process only, tests).
    """
    if not url:
        return BrokerConfig("memory", "memory://")
    scheme = url.partition("://")[0].lower()
    if scheme in ("redis", "rediss"):
        return BrokerConfig("redis", url, NAME)
    if scheme in ("redis+sentinel", "rediss+sentinel"):
        address = parse_store_url(url)
        auth = f":{quote(address.password, safe='')}@" if address.password else ""
        kombu_url = ";".join(f"sentinel://{auth}{host}:{port}/{address.db}" for host, port in address.nodes)
        options: dict[str, object] = {"master_name": address.master}
        if address.sentinel_password:
            options["sentinel_kwargs"] = {"password": address.sentinel_password}
        return BrokerConfig("sentinel", kombu_url, SENTINEL_NAME, options)
    if scheme == "sentinel":
        base, _, query = url.partition("?")
        master = parse_qs(query).get("master_name", [None])[-1]
        if not master:
            raise FxConfigError("a sentinel:// broker URL needs its master: add ?master_name=<name>, "
                                "or write it redis+sentinel://host:port,host:port/<master>")
        return BrokerConfig("sentinel", base, SENTINEL_NAME, {"master_name": master})
    if scheme in ("amqp", "amqps", "pyamqp"):
        return BrokerConfig("amqp", url, None, {"confirm_publish": True}, {
            # Quorum queues: replicated, durable, and what RabbitMQ recommends for work queues.
            "task_create_missing_queue_type": "quorum",
            "task_default_queue_type": "quorum",
            "worker_detect_quorum_queues": True,
        })
    if scheme == "memory":
        return BrokerConfig("memory", url)
    raise FxConfigError(f"the broker URL scheme {scheme!r} is not one fxworker runs on: use redis://, rediss://, "
                        "redis+sentinel:// or amqp:// (RabbitMQ)")
