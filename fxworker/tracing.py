"""Tracing of sessions across processes (OpenTelemetry; `fxengine.tracing` for the engine's
model and tool spans). Off, and free, until an SDK tracer provider is installed.

A prompt's trace starts where it is accepted: the sender's current span (a web framework's
request span, when the application instruments it), or else a `fx.accept` span made here.
Its W3C `traceparent` is stored with the input (nothing else: no credentials, no baggage),
and each worker that runs part of the turn continues that trace with a `fx.delivery` span
(its epoch; a `session.takeover` event when it took the session over from a dead worker),
ended at once so that it is exported even if that worker dies, and a `fx.turn` span around
what it ran, under which the engine's model and tool spans sit. A turn resumed on another
host after a kill -9 is so one trace: the dead worker's `fx.delivery` stands, the spans it
had not ended are lost with it (as any process's are), and the resuming worker's show the
takeover and what it ran again.

`configure_from_env()` sets the SDK up from the standard `OTEL_*` variables when the `otel`
extra is installed and `OTEL_TRACES_EXPORTER` (`otlp` or `console`) or an
`OTEL_EXPORTER_OTLP_*ENDPOINT` is set;
`fx web` and `fx worker` call it at start. Spans go out in the SDK's batches (every 5 s,
`OTEL_BSP_SCHEDULE_DELAY`), except `fx.delivery`: a worker killed in those 5 s would lose
it with the batch, so each is sent alone as it ends, on an exporter thread of its own
(`deliveries_at_once`), while the turn goes on. An application that configures
OpenTelemetry itself needs nothing from here (it can add `deliveries_at_once` too).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from fxengine.tracing import context_of, current_traceparent, enabled

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("fxworker.tracing")
TRACER = trace.get_tracer("fxworker")
DELIVERY_SPAN = "fx.delivery"
# A delivery span that ends while the one before it is being sent can miss the exporter
# thread's wake-up (the SDK clears it after sending): it then waits at most this long. An
# idle exporter thread wakes this often and finds nothing to send.
DELIVERY_BACKSTOP_MS = 100

__all__ = ["DELIVERY_SPAN", "TRACER", "configure_from_env", "context_of", "current_traceparent",
           "deliveries_at_once", "enabled", "start_accept", "start_delivery"]


def start_accept(session_id: str, kind: str, message_id: str) -> trace.Span | None:
    """The span of storing an input (a child of the sender's current span, if any); None when off."""
    if not enabled():
        return None
    return TRACER.start_span("fx.accept", kind=trace.SpanKind.PRODUCER, attributes={
        "fx.session.id": session_id, "fx.input.kind": kind, "fx.message.id": message_id})


def start_delivery(traceparent: str | None, attributes: Mapping[str, Any], *,
                   takeover: Mapping[str, Any] | None) -> trace.Span | None:
    """A worker's part of a turn: records `fx.delivery` (ended at once, so it is exported
    even if this process dies) and returns the `fx.turn` span to run the turn under (the
    caller ends it); None when off."""
    if not enabled():
        return None
    parent = context_of(traceparent)
    delivery = TRACER.start_span(DELIVERY_SPAN, context=parent, kind=trace.SpanKind.CONSUMER,
                                 attributes=dict(attributes))
    if takeover is not None:
        delivery.add_event("session.takeover", dict(takeover))
    delivery.end()
    return TRACER.start_span("fx.turn", context=trace.set_span_in_context(delivery), attributes=dict(attributes))


def configure_from_env(service_name: str) -> bool:
    """Installs an SDK tracer provider exporting over OTLP when the environment asks for one
    (and none is installed); whether it did."""
    wanted = os.environ.get("OTEL_TRACES_EXPORTER", "").strip() not in ("", "none") or any(
        os.environ.get(name) for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    if not wanted or enabled() or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning("OTEL_* asks for traces but the otel extra is not installed: pip install 'fxworker[otel]'")
        return False
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp"
    exporter: type[SpanExporter]
    if kind == "console":
        exporter = ConsoleSpanExporter
    elif kind == "otlp":
        exporter = OTLPSpanExporter
    else:
        log.warning("OTEL_TRACES_EXPORTER=%s is not one fxworker sets up (otlp, console): no traces", kind)
        return False
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    # Two exporters, one per thread: the batch's and the deliveries' never share a connection.
    provider.add_span_processor(deliveries_at_once(BatchSpanProcessor(exporter()), exporter()))
    trace.set_tracer_provider(provider)
    log.info("tracing: exporting spans (%s) as %s", kind, resource.attributes.get("service.name"))
    return True


def deliveries_at_once(batched: SpanProcessor, exporter: SpanExporter) -> SpanProcessor:
    """A span processor that sends each `fx.delivery` alone, through `exporter`, as soon as
    it ends, and every other span to `batched`.

    A delivery span ends as its delivery starts, so it is on the wire a few milliseconds
    later (on a thread of its own: the turn does not wait for the collector, and a collector
    that is down delays only these). In a batch it would wait up to the batch's delay, and
    a worker killed meanwhile would take it along: the one span meant to outlive a crash.
    """
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan, Span
    from opentelemetry.sdk.trace import SpanProcessor as Base
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # A batch of one: each span ending wakes the exporter thread at once.
    prompt: Base = BatchSpanProcessor(exporter, max_export_batch_size=1, schedule_delay_millis=DELIVERY_BACKSTOP_MS)

    class DeliveriesAtOnce(Base):
        def on_start(self, span: Span, parent_context: Context | None = None) -> None:
            batched.on_start(span, parent_context)

        def on_end(self, span: ReadableSpan) -> None:
            (prompt if span.name == DELIVERY_SPAN else batched).on_end(span)

        def shutdown(self) -> None:
            prompt.shutdown()
            batched.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return prompt.force_flush(timeout_millis) and batched.force_flush(timeout_millis)

    return DeliveriesAtOnce()
