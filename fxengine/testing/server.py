"""The scripted model server: a real Chat Completions endpoint on loopback, in a thread.

Responses are HTTP/1.1 with chunked bodies and keep-alive, so a pooled `httpx` client
behaves as it does against a real provider; `cut()` drops the connection inside the
chunked body, which a client sees as an incomplete body, not as a clean end.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .script import Reply, text

__all__ = ["RecordedRequest", "Responder", "ScriptedModel"]

Responder = Callable[["RecordedRequest"], Reply]

# How often a paused response checks its release, its client and the server's closing.
_POLL_S = 0.02
# How often the accept loop checks for `close()`.
_SERVE_POLL_S = 0.05


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received.

    Attributes:
        path: the request path, e.g. ``/v1/chat/completions``.
        headers: request headers, names lower-cased.
        body: the parsed JSON body (``{}`` when there was none or it did not parse).
        at_ms: when it arrived, epoch milliseconds.
    """

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at_ms: float


def _default_responder(request: RecordedRequest) -> Reply:
    return Reply(text("ok"))


class _Exchange:
    """What the server threads and the test share, under one lock: the queued replies, the
    recorded requests, the holds and the open connections."""

    def __init__(self) -> None:
        self.queue: deque[Reply] = deque()
        self.requests: list[RecordedRequest] = []
        self.cond = threading.Condition()
        self.released: dict[str, threading.Event] = {}
        self.held: set[str] = set()
        self.closing = threading.Event()
        self.connections: set[socket.socket] = set()

    def connected(self, conn: socket.socket) -> None:
        with self.cond:
            self.connections.add(conn)

    def disconnected(self, conn: socket.socket) -> None:
        with self.cond:
            self.connections.discard(conn)

    def release_event(self, name: str) -> threading.Event:
        """The event a `hold(name)` waits on (hold `cond`)."""
        event = self.released.get(name)
        if event is None:
            event = self.released[name] = threading.Event()
        return event

    def record(self, request: RecordedRequest) -> None:
        with self.cond:
            self.requests.append(request)
            self.cond.notify_all()

    def take(self, request: RecordedRequest, responder: Responder) -> Reply:
        """Records a chat request and answers it: the next queued reply, else `responder`."""
        with self.cond:
            self.requests.append(request)
            self.cond.notify_all()
            queued = self.queue.popleft() if self.queue else None
        return queued if queued is not None else responder(request)

    def reach_hold(self, name: str) -> threading.Event:
        with self.cond:
            self.held.add(name)
            self.cond.notify_all()
            return self.release_event(name)


class ScriptedModel:
    """A Chat Completions server that answers from a script, for tests and demos.

    Use as a context manager, or call `start()` and `close()`. Each request to
    ``POST /v1/chat/completions`` takes the next queued `Reply` (see `script`), or asks
    `responder` when the queue is empty.
    """

    def __init__(self, *, model_id: str = "scripted", responder: Responder | None = None, host: str = "127.0.0.1") -> None:
        self.model_id = model_id
        self.responder: Responder = responder or _default_responder
        self._host = host
        self._exchange = _Exchange()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle

    def start(self) -> ScriptedModel:
        """Binds `127.0.0.1:0` and serves in a daemon thread; returns self."""
        if self._server is not None:
            return self
        server = _Server((self._host, 0), _Handler)
        server.model = self
        server.exchange = self._exchange
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": _SERVE_POLL_S}, name="scripted-model", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stops serving and drops every open connection (held responses end cut)."""
        server, self._server = self._server, None
        if server is None:
            return
        self._exchange.closing.set()
        server.shutdown()
        server.server_close()
        with self._exchange.cond:
            connections = list(self._exchange.connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def __enter__(self) -> ScriptedModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # addresses

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the scripted model is not started")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        return f"http://{self._host}:{self.port}/v1"

    @property
    def provider(self) -> dict[str, object]:
        """A custom-provider dict for `create_engine(provider=...)`."""
        return {
            "name": "scripted",
            "base_url": self.base_url,
            "models": {
                self.model_id: {
                    "context_window": 128_000,
                    "max_output_tokens": 16_384,
                    "supports_tools": True,
                    "supports_images": True,
                }
            },
        }

    # scripting

    def script(self, *replies: Reply) -> None:
        """Queues replies; each chat request takes the next one in order."""
        with self._exchange.cond:
            self._exchange.queue.extend(replies)

    @property
    def queued(self) -> int:
        """How many scripted replies no request has taken yet."""
        with self._exchange.cond:
            return len(self._exchange.queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, in arrival order (a copy)."""
        with self._exchange.cond:
            return list(self._exchange.requests)

    def wait_for_requests(self, n: int, timeout_s: float = 5.0) -> list[RecordedRequest]:
        """Blocks until `n` requests arrived; raises `TimeoutError` after `timeout_s`."""
        x = self._exchange
        with x.cond:
            if not x.cond.wait_for(lambda: len(x.requests) >= n, timeout=timeout_s):
                raise TimeoutError(f"{len(x.requests)} of {n} requests arrived within {timeout_s} s")
            return list(x.requests)

    @property
    def open_connections(self) -> int:
        """How many client connections are open now (a client that closes a request
        mid-response drops its connection; an idle keep-alive one stays)."""
        with self._exchange.cond:
            return len(self._exchange.connections)

    def release(self, name: str) -> None:
        """Lets every response paused at `hold(name)` continue, now and later."""
        with self._exchange.cond:
            self._exchange.release_event(name).set()

    def wait_held(self, name: str, timeout_s: float = 5.0) -> None:
        """Blocks until some response reached `hold(name)`; raises `TimeoutError` otherwise."""
        x = self._exchange
        with x.cond:
            if not x.cond.wait_for(lambda: name in x.held, timeout=timeout_s):
                raise TimeoutError(f"no response reached hold({name!r}) within {timeout_s} s")

    def __repr__(self) -> str:
        where = self.base_url if self._server is not None else "closed"
        return f"<ScriptedModel {where} requests={len(self._exchange.requests)} queued={len(self._exchange.queue)}>"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Many clients connect at once in the concurrency tests; the default backlog of 5
    # would drop SYNs and add a one-second retransmit to some of them.
    request_queue_size = 512
    model: ScriptedModel
    exchange: _Exchange

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-reply (a killed worker) is not the server's error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Each streamed chunk goes out at once: without TCP_NODELAY a kept-alive connection
    # waits for the client's delayed ACK (~40 ms) before the next small write.
    disable_nagle_algorithm = True
    server: _Server
    # An idle keep-alive connection is closed after this; clients reconnect transparently.
    timeout = 30

    def setup(self) -> None:
        super().setup()
        self.server.exchange.connected(self.connection)

    def finish(self) -> None:
        self.server.exchange.disconnected(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _recorded(self) -> RecordedRequest:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        headers = {k.lower(): v for k, v in self.headers.items()}
        return RecordedRequest(self.path, headers, body if isinstance(body, dict) else {}, time.time() * 1000.0)

    def do_GET(self) -> None:
        model = self.server.model
        request = self._recorded()
        self.server.exchange.record(request)
        if self.path.rstrip("/") == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{"id": model.model_id, "object": "model", "owned_by": "scripted"}]})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        model = self.server.model
        request = self._recorded()
        if self.path.rstrip("/") != "/v1/chat/completions":
            self.server.exchange.record(request)
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        try:
            reply = self.server.exchange.take(request, model.responder)
        except Exception as exc:  # a responder bug shows up as a 500 the test can see
            self._send_json(500, {"error": {"message": f"responder failed: {exc!r}", "type": "api_error"}})
            return
        if reply.status != 200:
            headers = {}
            if reply.retry_after_s is not None:
                headers["Retry-After"] = str(max(0, round(reply.retry_after_s)))
                headers["retry-after-ms"] = str(int(reply.retry_after_s * 1000))
            self._send_json(reply.status, reply.error_body(), headers)
            return
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if request.body.get("stream") is False:
            self._send_whole(reply, completion_id)
            return
        self._stream(reply, completion_id)

    def _send_json(self, status: int, body: Mapping[str, object], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_whole(self, reply: Reply, completion_id: str) -> None:
        body: dict[str, object] = {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.model,
            "choices": [{"index": 0, "message": reply.message(), "finish_reason": reply.effective_finish_reason}],
        }
        wire_usage = reply.usage_wire()
        if wire_usage is not None:
            body["usage"] = wire_usage
        self._send_json(200, body)

    def _stream(self, reply: Reply, completion_id: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for step in reply.steps(completion_id, int(time.time())):
                if step[0] == "chunk":
                    self._write_event(json.dumps(step[1], separators=(",", ":")).encode())
                elif step[0] == "done":
                    self._write_event(b"[DONE]")
                    self.wfile.write(b"0\r\n\r\n")
                elif step[0] == "delay":
                    if self._pause(step[1] / 1000.0, None):
                        return
                elif step[0] == "hold":
                    if self._pause(None, self.server.exchange.reach_hold(step[1])):
                        return
                elif step[0] == "cut":
                    self.close_connection = True
                    return
        except OSError:  # the client went away
            self.close_connection = True

    def _write_event(self, data: bytes) -> None:
        event = b"data: " + data + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))

    def _pause(self, seconds: float | None, release: threading.Event | None) -> bool:
        """Waits out a delay or a hold; True when the response must stop (client gone, server closing)."""
        deadline = None if seconds is None else time.monotonic() + seconds
        closing = self.server.exchange.closing
        while True:
            if release is not None and release.is_set():
                return False
            left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if left <= 0:
                return False
            if closing.is_set() or self._client_gone(left):
                self.close_connection = True
                return True

    def _client_gone(self, wait_s: float) -> bool:
        """Waits up to `wait_s` for the socket to turn readable; a readable EOF means the client left."""
        try:
            readable, _, _ = select.select([self.connection], [], [], wait_s)
            if not readable:
                return False
            if self.connection.recv(1, socket.MSG_PEEK) == b"":
                return True
        except OSError:
            return True
        # The client sent bytes mid-response (it should not); do not spin on them.
        time.sleep(wait_s)
        return False
