"""`fx web` bounds what clients hold open (fxworker/web/server.py): 600 connections that never
finish their request — half a header without a token, half a header with one, a body that
stops short — are closed within `FX_WEB_REQUEST_TIMEOUT_S`, while a normal client is served
all along."""

from __future__ import annotations

import selectors
import socket
import time

import httpx
import pytest

from tests.web._server import WebProcess

pytestmark = [pytest.mark.redis, pytest.mark.slow]

TIMEOUT_S = 2.0
TOKEN = "slow-clients-token"


def _half_open(port: int, kind: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    if kind == 0:
        s.sendall(b"GET /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no token, headers never end
    elif kind == 1:
        s.sendall(b"GET /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n")
    else:
        s.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + TOKEN.encode()
                  + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"input\": ")
    s.setblocking(False)
    return s


def test_half_open_connections_are_closed_and_others_served(redis_url: str, key_prefix: str) -> None:
    web = WebProcess(env={"REDIS_URL": redis_url, "FX_PREFIX": key_prefix, "FX_AGENTS": "tests.durable.agents",
                          "FX_API_TOKEN": TOKEN, "FX_WEB_REQUEST_TIMEOUT_S": str(TIMEOUT_S)})
    sockets: list[socket.socket] = []
    try:
        base = web.wait_ready().url
        opened = time.monotonic()
        sockets = [_half_open(web.port, i % 3) for i in range(600)]
        with httpx.Client(base_url=base, timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            assert client.get("/healthz").status_code == 200
            assert client.get("/v1/sessions").status_code == 200
        sel = selectors.DefaultSelector()
        for s in sockets:
            sel.register(s, selectors.EVENT_READ)
        closed = 0
        deadline = opened + TIMEOUT_S + 10
        while closed < len(sockets) and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.5):
                try:
                    data = key.fileobj.recv(4096)  # type: ignore[union-attr]
                except ConnectionError:
                    data = b""
                if not data:
                    sel.unregister(key.fileobj)
                    closed += 1
        took = time.monotonic() - opened
        assert closed == len(sockets), f"{len(sockets) - closed} connections still open after {took:.1f} s"
        assert took >= TIMEOUT_S - 0.5  # closed by the deadline, not at once
        with httpx.Client(base_url=base, timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            assert client.get("/v1/sessions").status_code == 200
    finally:
        for s in sockets:
            s.close()
        web.close()
