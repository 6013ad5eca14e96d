"""An OTLP/HTTP trace receiver on loopback, for tests of what a process exports.

`POST /v1/traces` with a protobuf `ExportTraceServiceRequest` (gzip or not), as the SDK's
`OTLPSpanExporter` sends it: each span is kept as a plain dict with the time it arrived,
and `wait_for` blocks until a span matches, bounded. Point a process at it with
`OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url`.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

Span = dict[str, Any]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


class OtlpReceiver:
    """Collects the spans exported to it; a context manager that serves on 127.0.0.1:<port>."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver._add(ExportTraceServiceRequest.FromString(body), time.time_ns())
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the http.server signature
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    def __repr__(self) -> str:
        return f"<OtlpReceiver {self.url} requests={self.requests} spans={len(self.spans)}>"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _add(self, request: ExportTraceServiceRequest, received_ns: int) -> None:
        spans = [{
            "name": span.name, "trace": span.trace_id.hex(), "span": span.span_id.hex(),
            "parent": span.parent_span_id.hex() or None, "start_ns": span.start_time_unix_nano,
            "end_ns": span.end_time_unix_nano, "attributes": _attributes(span.attributes),
            "events": [event.name for event in span.events], "resource": _attributes(batch.resource.attributes),
            "received_ns": received_ns,
        } for batch in request.resource_spans for scope in batch.scope_spans for span in scope.spans]
        with self._changed:
            self.requests += 1
            self.spans.extend(spans)
            self._changed.notify_all()

    def wait_for(self, match: Callable[[Span], bool], timeout_s: float) -> list[Span]:
        """The spans that match, once there is one; [] after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not (found := [s for s in self.spans if match(s)]):
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    break
                self._changed.wait(left_s)
        return found
