"""OpenTelemetry tracing, on the `opentelemetry-api` package: off (and free) until the
application installs an SDK tracer provider, then a span per model request and per tool
call (docs/python-api.md, "Tracing").

The engine never configures OpenTelemetry: the SDK, its processors and exporters are the
application's (`fx web` and `fx worker` set them up from the standard `OTEL_*` variables
when the `otel` extra is installed: `fxworker.tracing`). Spans follow the GenAI semantic
conventions where they apply: a model request is `chat {model}` with
`gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`,
`gen_ai.response.finish_reasons` and `gen_ai.usage.*`; a tool call is
`execute_tool {name}` with `gen_ai.tool.name`, `gen_ai.tool.call.id` and fxengine's own
`fx.tool.execution_id`, `fx.tool.idempotent`, `fx.tool.rerun`.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.util.types import AttributeValue

TRACER = trace.get_tracer("fxengine")


def enabled() -> bool:
    """Whether an SDK tracer provider is installed (the API's default records nothing).

    Checked at each span, so an application may install its provider after importing
    fxengine; when off, no span object is built at all.
    """
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def context_of(traceparent: str | None) -> otel_context.Context | None:
    """The context a stored W3C `traceparent` names (None when there is none)."""
    if not traceparent:
        return None
    return propagate.extract({"traceparent": traceparent})


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span (None when there is no recording one)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


def start_model_span(provider: str, model: str, step: int) -> trace.Span | None:
    """The span of one model request (a step, its retries included); None when tracing is off."""
    if not enabled():
        return None
    return TRACER.start_span(f"chat {model}", kind=trace.SpanKind.CLIENT, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider, "gen_ai.request.model": model,
        "fx.step": step,
    })


def end_model_span(span: trace.Span | None, *, model: str | None, finish_reason: str | None,
                   usage: Mapping[str, int], cut: bool, error: BaseException | None = None) -> None:
    if span is None:
        return
    attributes: dict[str, AttributeValue] = {"fx.cut": cut}
    if model:
        attributes["gen_ai.response.model"] = model
    if finish_reason:
        attributes["gen_ai.response.finish_reasons"] = [finish_reason]
    for ours, theirs in (("inputTokens", "gen_ai.usage.input_tokens"), ("outputTokens", "gen_ai.usage.output_tokens"),
                         ("cacheReadTokens", "gen_ai.usage.cache_read.input_tokens"),
                         ("reasoningTokens", "gen_ai.usage.reasoning.output_tokens")):
        if ours in usage:
            attributes[theirs] = usage[ours]
    span.set_attributes(attributes)
    if error is not None:
        span.record_exception(error)
        span.set_status(trace.StatusCode.ERROR, type(error).__name__)
    span.end()


def start_tool_span(name: str, call_id: str, execution_id: str, *, idempotent: bool | None,
                    rerun: bool) -> trace.Span | None:
    """The span of one tool call; None when tracing is off."""
    if not enabled():
        return None
    attributes: dict[str, AttributeValue] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                                  "gen_ai.tool.call.id": call_id, "fx.tool.execution_id": execution_id,
                                  "fx.tool.rerun": rerun}
    if idempotent is not None:
        attributes["fx.tool.idempotent"] = idempotent
    return TRACER.start_span(f"execute_tool {name}", kind=trace.SpanKind.INTERNAL, attributes=attributes)


def end_tool_span(span: trace.Span | None, *, is_error: bool) -> None:
    if span is None:
        return
    if is_error:
        span.set_status(trace.StatusCode.ERROR, "the tool's result is an error")
    span.end()


def add_event(name: str, attributes: Mapping[str, AttributeValue]) -> None:
    """An event on the current span (the turn's), when tracing is on."""
    if enabled():
        trace.get_current_span().add_event(name, dict(attributes))
