"""Prometheus metrics of one fxworker process (a leaf module: it imports no other fxworker module).

The durable core counts into these objects; `GET /metrics` of the web app renders them.
They live in a registry of their own (`REGISTRY`), so importing this module twice in one
process (a test reload) or next to an application's own metrics never collides.

    from fxworker import metrics

    metrics.TURNS_RUNNING.inc(); ...; metrics.TURNS_RUNNING.dec()
    metrics.ACCEPTED.inc()
    metrics.observe_store("append", seconds)

Every metric is one process's view: a web process shows what it accepted, a worker process
what it ran. A worker process can expose its own with `serve(port)`. `STORE_LATENCY` (by
`op`), `WAKES` (by `outcome`), `DECISIONS` (by `type`) and the turns' ends, `TURNS_ENDED`
and `TURN_SECONDS` (by `agent` and `stop_reason`), have labels.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = [
    "ACCEPTED",
    "DECISIONS",
    "CONTENT_TYPE",
    "DEADLINE_CUTOFFS",
    "NO_AGENT_REFUSALS",
    "REGISTRY",
    "STORE_LATENCY",
    "TAKEOVERS",
    "TURNS_ENDED",
    "TURNS_RUNNING",
    "TURN_SECONDS",
    "WAKES",
    "YIELDS",
    "observe_store",
    "observe_turn_end",
    "render",
    "serve",
]

REGISTRY = CollectorRegistry(auto_describe=True)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Turns this process is running now (incremented when a delivery starts a turn, decremented
# when it ends, yields, is cut off or is fenced).
TURNS_RUNNING = Gauge(
    "fx_turns_running",
    "Turns running in this process now.",
    registry=REGISTRY,
)
# Turns whose end this process wrote, by agent and stop reason (end_turn, error, cancelled, ...).
TURNS_ENDED = Counter(
    "fx_turns_ended",
    "Turns whose end this process wrote, by agent and stop reason.",
    ["agent", "stop_reason"],
    registry=REGISTRY,
)
# From a turn's prompt being stored to its end being written (waits, yields and takeovers
# included), by agent and stop reason.
TURN_SECONDS = Histogram(
    "fx_turn_duration_seconds",
    "Time from a turn's prompt being stored to its end, by agent and stop reason.",
    ["agent", "stop_reason"],
    buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0),
    registry=REGISTRY,
)
# Inputs (prompts and steers) stored by this process, repeated message ids included.
ACCEPTED = Counter(
    "fx_inputs_accepted",
    "Inputs (prompts and steers) this process stored.",
    registry=REGISTRY,
)
# Decisions (approvals, denials, external tools' results) stored by this process.
DECISIONS = Counter(
    "fx_decisions_accepted",
    "Decisions on waiting tool calls this process stored, by type (approve, deny, result).",
    ["type"],
    registry=REGISTRY,
)
# Turns that stopped at the soft deadline (`turn_yield`) and were requeued.
YIELDS = Counter(
    "fx_turn_yields",
    "Turns that yielded before the delivery deadline and were requeued.",
    registry=REGISTRY,
)
# Claims that found the previous lease dead (not released): a worker died or stalled.
TAKEOVERS = Counter(
    "fx_session_takeovers",
    "Claims that took over a session whose previous lease had died.",
    registry=REGISTRY,
)
# Calls cut off at the hard deadline (`session.deadline`).
DEADLINE_CUTOFFS = Counter(
    "fx_deadline_cutoffs",
    "Model requests or tool calls cut off at the hard delivery deadline.",
    registry=REGISTRY,
)
# Deliveries refused because this process has no agent of the session's name (FX_NO_AGENT).
NO_AGENT_REFUSALS = Counter(
    "fx_no_agent_refusals",
    "Deliveries refused with FX_NO_AGENT.",
    registry=REGISTRY,
)
WAKES_FAILED = Counter(
    "fx_wake_send_failures",
    "Wakes the broker refused after their input was stored (the sweeper wakes those sessions).",
    registry=REGISTRY,
)
# Wake deliveries handled, by outcome: done, yielded, noop, refused, no_agent, unavailable, error.
WAKES = Counter(
    "fx_wakes",
    "Wake deliveries handled, by outcome.",
    ["outcome"],
    registry=REGISTRY,
)
# Time of one store call, by operation (accept, claim, append, renew, release, read, ...).
STORE_LATENCY = Histogram(
    "fx_store_latency_seconds",
    "Latency of one session-store call.",
    ["op"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=REGISTRY,
)


_latency_of: dict[str, Any] = {}  # op -> its STORE_LATENCY child (labels() takes a lock each time)


def observe_store(op: str, seconds: float) -> None:
    """One store call's duration in `STORE_LATENCY` under `op` (the store's hot path: no
    context manager)."""
    child = _latency_of.get(op)
    if child is None:
        child = _latency_of[op] = STORE_LATENCY.labels(op=op)
    child.observe(seconds)


def observe_turn_end(agent: str, stop_reason: str, seconds: float | None) -> None:
    """A turn's end, written by this process: counted, and its time from its prompt's
    storing when known."""
    TURNS_ENDED.labels(agent=agent, stop_reason=stop_reason).inc()
    if seconds is not None and seconds >= 0:
        TURN_SECONDS.labels(agent=agent, stop_reason=stop_reason).observe(seconds)


# What a web process counts (the rest are counted where turns run: a worker, or `fx dev`).
WEB_METRICS = frozenset(("fx_inputs_accepted", "fx_decisions_accepted", "fx_wake_send_failures",
                         "fx_store_latency_seconds"))


class _Only:
    """The families of `REGISTRY` named in `names` (a collector for `generate_latest`)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def collect(self) -> Any:
        return (family for family in REGISTRY.collect() if family.name in self.names)


def render(names: frozenset[str] | None = None) -> bytes:
    """This process's metrics in the Prometheus text format (`CONTENT_TYPE`): all of them,
    or the families in `names` (a web process: `WEB_METRICS`, so it lists no count it never
    moves)."""
    return generate_latest(REGISTRY if names is None else _Only(names))


_served: dict[tuple[str, int], Any] = {}


def serve(port: int, *, host: str = "127.0.0.1") -> None:
    """Serve `/metrics` of this process on `host:port` from a daemon thread (for worker processes).

    Serving the same address twice in one process is a no-op.
    """
    if (host, port) not in _served:
        _served[(host, port)] = start_http_server(port, addr=host, registry=REGISTRY)
