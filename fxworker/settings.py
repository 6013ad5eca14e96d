"""Settings are values: `Settings.from_env()` is the only place that reads `os.environ`.

Every variable is documented here and in the table of docs/reference.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import FxConfigError


@dataclass(frozen=True, slots=True)
class Settings:
    # REDIS_URL: the session store and the Celery broker, unless FX_STORE_URL or
    # FX_BROKER_URL names another. Unset (and both of those): the embedded default
    # (fakeredis in this process), for development only.
    redis_url: str | None = None
    # FX_STORE_URL: the session store: a Redis (`redis://`, `rediss://`), a Redis Cluster
    # (detected from the server, or `redis+cluster://host:port,host:port/0`) or a
    # Sentinel-managed primary (`redis+sentinel://host:port,host:port/<master>/0`).
    # Default: REDIS_URL.
    store_url: str | None = None
    # FX_BROKER_URL: the Celery broker the wakes travel on: a Redis (standalone, or
    # `redis+sentinel://`) or RabbitMQ (`amqp://`, quorum queues). Default: REDIS_URL.
    broker_url: str | None = None
    # FX_PREFIX: the prefix of every store key.
    prefix: str = "fx"
    # FX_DATA_DIR: with no store URL, where the local store keeps sessions (a private server's
    # append-only file, `fxworker.store.local`); `:memory:` keeps them in this process only.
    # Unset: `.fx` in the working directory.
    data_dir: str | None = None
    # FX_DATA_IDLE_S: the local store's server stops once it has had no client this long.
    data_idle_s: float = 60.0
    # FX_AGENTS: the module that creates the agents; workers and web processes import it.
    agents_module: str | None = None
    # FX_DELIVERY_TIMEOUT_S: the deadline of one delivery (the task time limit).
    delivery_timeout_s: float = 300.0
    # FX_RESERVE_S: a turn stops before its next model request this long before the deadline.
    reserve_s: float = 30.0
    # FX_LEASE_S: a lease not renewed for this long is dead; renewed every lease_s / 3.
    lease_s: float = 15.0
    # FX_API_TOKEN: bearer token the built-in web app requires (required off loopback).
    api_token: str | None = None
    # FX_ALLOWED_ORIGINS: under an `authorize` hook, other sites whose pages may POST to the
    # API (comma-separated origins, `https://app.example`); the server's own always may.
    allowed_origins: tuple[str, ...] = ()
    # FX_WEB_REQUEST_TIMEOUT_S: `fx web` closes a connection whose request (headers and
    # body) has not arrived whole this long after the connection or the previous response.
    web_request_timeout_s: float = 30.0
    # FX_WEB_MAX_CONNECTIONS: past this many open connections `fx web` answers 503.
    web_max_connections: int = 1000
    # FX_WAKE_SECRET: HMAC-SHA256 key of POST /v1/wake.
    wake_secret: str | None = None
    # AI_GATEWAY_API_KEY: the default provider's key (read by fxengine's provider too).
    ai_gateway_api_key: str | None = None
    # FX_LOG_LEVEL: level of fxworker's loggers.
    log_level: str = "INFO"
    # FX_SESSION_TTL_S: finished sessions expire after this long; unset keeps them.
    session_ttl_s: float | None = None
    # FX_ACK: acknowledgement level of accepted input: primary, aof or replica.
    ack: str = "primary"
    # FX_SWEEP_S: how often the sweeper re-wakes ready sessions with a free or dead lease.
    sweep_s: float = 5.0
    # FX_WORKER_CONCURRENCY: turns one worker process carries at once.
    worker_concurrency: int = 100
    # FX_URL: the web API the `fx prompt`, `fx tail` and `fx sessions` commands talk to.
    url: str = "http://127.0.0.1:8000"
    # PORT: the port `fx web` binds unless --port says otherwise (set by Heroku, Render, Fly).
    port: int = 8000
    # FX_NO_AGENT_RETRY_S: the longest wait between two of the sweeper's looks at a session
    # whose agent no live worker runs (noWorker); they start at a quarter second and double
    # up to this, counted per session in the store.
    no_agent_retry_s: float = 30.0
    # FX_METRICS_PORT: a worker process serves its Prometheus metrics on this port
    # (`GET /metrics`, on FX_METRICS_HOST); unset: not served.
    metrics_port: int | None = None
    # FX_METRICS_HOST: the address a worker's metrics port binds.
    metrics_host: str = "127.0.0.1"
    # FX_REDIS_MAX_CONNECTIONS: the most connections one store client opens (one client per
    # event loop, one for blocking calls); a call finding all busy waits for one (up to
    # the store's socket timeout, then FX_STORE_UNAVAILABLE) instead of failing.
    redis_max_connections: int = 200
    # FX_ALLOW_EVICTION: 1 lets `fx web` / `fx worker` start against a Redis whose
    # maxmemory-policy can evict keys (anything but noeviction); evicted sessions are then
    # lost (404) or refused (FX_SESSION_INCOMPLETE).
    allow_eviction: bool = False
    # FX_MODEL_IDLE_TIMEOUT_S: a model stream that sends nothing for this long fails the
    # step FX_PROVIDER_TIMEOUT (retried once before any output, like any retryable failure).
    model_idle_timeout_s: float = 120.0
    # FX_NO_AGENT_GIVE_UP_S: a session whose agent no worker runs is woken with a growing
    # backoff for this long, then its waiting inputs end `error` FX_NO_AGENT.
    no_agent_give_up_s: float = 86400.0

    def __post_init__(self) -> None:
        # The store and the broker default to REDIS_URL, however the settings were made.
        if self.store_url is None and self.redis_url:
            object.__setattr__(self, "store_url", self.redis_url)
        if self.broker_url is None and self.redis_url:
            object.__setattr__(self, "broker_url", self.redis_url)
        # A turn must have time to run before it yields. (A sweep slower than the lease only
        # delays a takeover, to lease_s + sweep_s: allowed.)
        if self.reserve_s >= self.delivery_timeout_s:
            raise FxConfigError(f"FX_RESERVE_S ({self.reserve_s:g}) must be less than FX_DELIVERY_TIMEOUT_S "
                                f"({self.delivery_timeout_s:g}): a turn yields reserve_s before its deadline")
        if self.ack not in ("primary", "aof", "replica"):
            raise FxConfigError(f"FX_ACK must be primary, aof or replica, got {self.ack!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ

        def text(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        def number(name: str, default: float, *, minimum: float = 0.0) -> float:
            raw = text(name)
            if raw is None:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise FxConfigError(f"{name} must be a number, got {raw!r}") from None
            if value < minimum:
                raise FxConfigError(f"{name} must be at least {minimum}, got {raw!r}")
            return value

        def flag(name: str) -> bool:
            raw = (text(name) or "0").lower()
            if raw not in ("0", "1", "true", "false", "yes", "no"):
                raise FxConfigError(f"{name} must be 0 or 1, got {raw!r}")
            return raw in ("1", "true", "yes")

        ttl = text("FX_SESSION_TTL_S")
        default = cls()  # each default is written once, on its field
        return cls(
            redis_url=text("REDIS_URL"),
            store_url=text("FX_STORE_URL"),
            broker_url=text("FX_BROKER_URL"),
            prefix=text("FX_PREFIX") or default.prefix,
            data_dir=text("FX_DATA_DIR"),
            data_idle_s=number("FX_DATA_IDLE_S", default.data_idle_s, minimum=1.0),
            agents_module=text("FX_AGENTS"),
            delivery_timeout_s=number("FX_DELIVERY_TIMEOUT_S", default.delivery_timeout_s, minimum=1.0),
            reserve_s=number("FX_RESERVE_S", default.reserve_s),
            lease_s=number("FX_LEASE_S", default.lease_s, minimum=0.3),
            api_token=text("FX_API_TOKEN"),
            wake_secret=text("FX_WAKE_SECRET"),
            web_request_timeout_s=number("FX_WEB_REQUEST_TIMEOUT_S", default.web_request_timeout_s, minimum=0.1),
            web_max_connections=int(number("FX_WEB_MAX_CONNECTIONS", default.web_max_connections, minimum=1)),
            allowed_origins=tuple(o.strip() for o in (text("FX_ALLOWED_ORIGINS") or "").split(",") if o.strip()),
            ai_gateway_api_key=text("AI_GATEWAY_API_KEY"),
            log_level=(text("FX_LOG_LEVEL") or default.log_level).upper(),
            session_ttl_s=number("FX_SESSION_TTL_S", 0.0) if ttl else None,
            ack=text("FX_ACK") or default.ack,
            sweep_s=number("FX_SWEEP_S", default.sweep_s, minimum=0.1),
            worker_concurrency=int(number("FX_WORKER_CONCURRENCY", default.worker_concurrency, minimum=1)),
            url=(text("FX_URL") or default.url).rstrip("/"),
            port=int(number("PORT", default.port, minimum=1)),
            no_agent_retry_s=number("FX_NO_AGENT_RETRY_S", default.no_agent_retry_s, minimum=0.1),
            metrics_port=int(number("FX_METRICS_PORT", 0, minimum=1)) if text("FX_METRICS_PORT") else None,
            metrics_host=text("FX_METRICS_HOST") or default.metrics_host,
            redis_max_connections=int(number("FX_REDIS_MAX_CONNECTIONS", default.redis_max_connections, minimum=1)),
            allow_eviction=flag("FX_ALLOW_EVICTION"),
            model_idle_timeout_s=number("FX_MODEL_IDLE_TIMEOUT_S", default.model_idle_timeout_s, minimum=0.1),
            no_agent_give_up_s=number("FX_NO_AGENT_GIVE_UP_S", default.no_agent_give_up_s, minimum=1.0),
        )
