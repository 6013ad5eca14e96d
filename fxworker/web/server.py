"""How `fx web` serves the app: uvicorn, with bounds on what a client may hold open.

uvicorn closes an idle keep-alive connection, but not one that never finishes its request:
a client that sends half a header (or a body slower than a byte a minute) holds a
connection and its memory for ever, and a few hundred of them, no token needed, fill a
process. So `fx web` serves with:

- `FX_WEB_REQUEST_TIMEOUT_S` (30 s): a request must arrive whole, headers and body, within
  this long of its connection (or of the previous response on it); otherwise the connection
  is closed. A response may take as long as it likes (an NDJSON stream follows for hours).
- `FX_WEB_MAX_CONNECTIONS` (1000): past this many open connections and tasks, uvicorn
  answers 503 at once (its `limit_concurrency`).

In production put a reverse proxy in front as well (nginx, a platform's router): it buffers
slow clients and keeps these limits off the Python process.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is an optional extra of uvicorn
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

from fxworker.settings import Settings


class _RequestDeadline:
    """A protocol mixin: close a connection whose request has not arrived whole in time
    (`FX_WEB_REQUEST_TIMEOUT_S`, read once per process)."""

    request_timeout_s: float | None = None
    _fx_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._fx_arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._fx_arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._fx_deadline is not None:
            self._fx_deadline.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def _fx_arm(self) -> None:
        if self._fx_deadline is not None:
            self._fx_deadline.cancel()
        if _RequestDeadline.request_timeout_s is None:
            _RequestDeadline.request_timeout_s = Settings.from_env().web_request_timeout_s
        loop: asyncio.AbstractEventLoop = self.loop  # type: ignore[attr-defined]
        self._fx_deadline = loop.call_later(_RequestDeadline.request_timeout_s, self._fx_expire)

    def _fx_expire(self) -> None:
        cycle = self.cycle  # type: ignore[attr-defined]
        waiting = cycle is None or cycle.response_complete or cycle.more_body
        transport = self.transport  # type: ignore[attr-defined]
        if waiting and not transport.is_closing():
            transport.close()


class BoundedH11Protocol(_RequestDeadline, H11Protocol):
    """uvicorn's h11 protocol with the request deadline."""


if HttpToolsProtocol is not None:
    class BoundedHttpToolsProtocol(_RequestDeadline, HttpToolsProtocol):
        """uvicorn's httptools protocol with the request deadline."""

    # The protocol class `fx web` gives uvicorn: the fastest available, with the deadline.
    PROTOCOL: type = BoundedHttpToolsProtocol
else:
    PROTOCOL = BoundedH11Protocol
