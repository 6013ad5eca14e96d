"""`AioClient`: an httpx client on an aiohttp session, whose model requests go to aiohttp
directly.

A worker's engines get one (`fxworker.runtime.LoopThread`). To everything that takes an
`httpx.AsyncClient` it is one: credentials, sign-in and any other request go through
httpx, on aiohttp's transport (`httpx-aiohttp`). The model request of a step
(`openai_chat.stream_attempt`) skips httpx and sends on the same aiohttp session. httpx
builds a request, a URL, headers, a response and a cookie jar around every request, and
that costs as much CPU as aiohttp's own send and receive: 831 against 622 µs a request,
100 at once, to the scripted model on loopback (the two measured in one process, 12
rounds interleaved, medians).

`AioResponse` gives an aiohttp response the part of `httpx.Response` the model request
reads (`ModelResponse`); `openai_chat.map_transport_errors` gives aiohttp's failures the
same `FX_PROVIDER_*` codes as httpx's.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Protocol

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport


class ModelResponse(Protocol):
    """What the model request reads of a response: `httpx.Response` and `AioResponse`."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aread(self) -> bytes: ...


class AioClient(httpx.AsyncClient):
    """An `httpx.AsyncClient` whose transport is an aiohttp session it owns (`session`),
    built on first use on the running loop. Closing the client closes the session."""

    def __init__(self, *, timeout: httpx.Timeout, limits: httpx.Limits, verify: ssl.SSLContext) -> None:
        self._limits = limits
        self._verify = verify
        self._session: aiohttp.ClientSession | None = None
        # The transport builds a TLS context of its own unless given one (20 ms each).
        self.transport = AiohttpTransport(verify=verify, client=lambda: self.session)
        super().__init__(timeout=timeout, transport=self.transport)
        # The headers a model request sends besides its own: httpx's defaults but the
        # encodings, which aiohttp names and decodes itself.
        self.model_headers = {k: v for k, v in self.headers.items() if k.lower() != "accept-encoding"}

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._limits.max_connections or 0, ssl=self._verify,
                                             keepalive_timeout=self._limits.keepalive_expiry or 15.0)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def post_json(self, url: str, body: Mapping[str, object], *, headers: Mapping[str, str],
                  timeout: httpx.Timeout) -> _Post:
        """`async with client.post_json(...) as response:` the model request on aiohttp;
        `response` is an `AioResponse`."""
        try:
            data = orjson.dumps(body)  # a twentieth of the standard library's time
        except orjson.JSONEncodeError:  # an integer past 64 bits, a key that is not a string
            data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        return _Post(self.session.post(
            url, data=data, headers={**self.model_headers, **headers, "Content-Type": "application/json"},
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=timeout.pool, sock_connect=timeout.connect,
                                          sock_read=timeout.read),
        ))

    async def aclose(self) -> None:
        await super().aclose()
        if self._session is not None:
            await self._session.close()


class _Post:
    """The request's context: enters as an `AioResponse`, releases the connection on exit."""

    __slots__ = ("_request",)

    def __init__(self, request: AbstractAsyncContextManager[aiohttp.ClientResponse]) -> None:
        self._request = request

    async def __aenter__(self) -> AioResponse:
        return AioResponse(await self._request.__aenter__())

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._request.__aexit__(kind, exc, tb)


class AioResponse:
    """An aiohttp response as a `ModelResponse`."""

    __slots__ = ("_response",)

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    @property
    def status_code(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self._response.content.iter_any()

    aiter_bytes = aiter_raw  # aiohttp has decoded the body already

    async def aread(self) -> bytes:
        return await self._response.read()
