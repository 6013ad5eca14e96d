"""The shared HTTP clients of a worker's loop (`fxworker.runtime.LoopThread`)."""

from __future__ import annotations

import ssl

from fxengine.models.aio import AioClient
from fxworker.runtime import HTTP_CLIENTS, LoopThread


def test_a_loops_clients_are_built_at_once_on_one_tls_context() -> None:
    loop = LoopThread("fx-test-clients")
    try:
        loop.build_http_clients().result(10)
        clients = {id(c): c for c in (loop.http_client_for(f"session-{i}") for i in range(20 * HTTP_CLIENTS))}
        assert len(clients) == HTTP_CLIENTS  # every session on one of them, always the same
        assert all(isinstance(c, AioClient) for c in clients.values())
        # Each would otherwise load the CA bundle again: 20 ms of the loop per client.
        contexts = {id(c.transport.ssl_context) for c in clients.values()}
        assert len(contexts) == 1
        assert isinstance(next(iter(clients.values())).transport.ssl_context, ssl.SSLContext)
    finally:
        loop.close()
