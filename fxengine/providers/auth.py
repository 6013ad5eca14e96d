"""Credentials from the application's callbacks, refreshed in the process running the turn.

A plan provider (ChatGPT, Grok) or a custom provider given `credentials=` asks the
application for each session's credentials and hands refreshed ones back:

    credentials(ctx) -> {"access_token", "refresh_token"?, "expires_at"?, "account_id"?, ...}
    on_credentials(creds, ctx)            # save what a refresh returned
    refresh_lock(ctx, fn) -> await fn()   # run fn while holding a lock on ctx's account

`ctx` is ``{"provider", "session_id"}`` (the lock's also names ``account_id``). The
callbacks may be plain functions (run in a thread, so a blocking store does not stall
the loop) or coroutine functions; `refresh_lock` must be a coroutine function.

Credentials are refreshed `REFRESH_MARGIN_S` before `expires_at`, and once after the
provider rejected a request (HTTP 401). Inside the lock `credentials(ctx)` is called
again: when another server already saved fresh credentials they are used as they are,
so one account is refreshed once however many servers noticed. Sessions of one process
share a refresh of the same credentials (one request to the token endpoint).

Credentials live only in this object's memory for the length of a turn: they are never
journaled, stored, streamed or passed to `on_event` (docs/design.md §8).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, cast

import httpx

from ..codes import Code
from ..errors import FxProviderError
from .credentials import Credentials

REFRESH_MARGIN_S = 120.0

Refresher = Callable[[httpx.AsyncClient, Credentials], Awaitable[Credentials]]
HeaderFn = Callable[[Credentials], dict[str, str]]


class CredentialsFn(Protocol):
    """`credentials(ctx)`: the session's credentials (a dict, or an awaitable of one)."""

    def __call__(self, ctx: dict[str, object], /) -> object: ...


class OnCredentialsFn(Protocol):
    """`on_credentials(creds, ctx)`: saves refreshed credentials (may be async)."""

    def __call__(self, creds: Credentials, ctx: dict[str, object], /) -> object: ...


class RefreshLockFn(Protocol):
    """`refresh_lock(ctx, fn)`: awaits `fn()` while holding a lock on `ctx`'s account."""

    def __call__(self, ctx: dict[str, object], fn: Callable[[], Awaitable[Credentials]], /) -> Awaitable[Credentials]: ...

# One refresh at a time per (loop, provider, refresh token): the sessions of a process
# that hold the same credentials wait for the same token request.
_inflight: dict[tuple[int, str, str], asyncio.Future[Credentials]] = {}


def bearer_headers(creds: Credentials) -> dict[str, str]:
    """`authorization: Bearer <access_token>`."""
    return {"authorization": f"Bearer {creds['access_token']}"}


def check_credentials(value: object, provider: str) -> Credentials:
    """A credentials mapping as the callbacks give it (`api_key` is an access token).

    Raises:
        FxProviderError: `FX_PROVIDER_NO_CREDENTIALS` for None or a mapping without a token.
    """
    if isinstance(value, str) and value:
        return {"access_token": value}
    if not isinstance(value, Mapping):
        raise FxProviderError(f"credentials() gave no credentials for provider {provider}",
                              code=Code.PROVIDER_NO_CREDENTIALS)
    creds = dict(value)
    if "access_token" not in creds and isinstance(creds.get("api_key"), str):
        creds["access_token"] = creds.pop("api_key")
    token = creds.get("access_token")
    if not isinstance(token, str) or not token:
        raise FxProviderError(f"credentials for provider {provider} have no access_token",
                              code=Code.PROVIDER_NO_CREDENTIALS)
    expires_at = creds.get("expires_at")
    if expires_at is not None and (isinstance(expires_at, bool) or not isinstance(expires_at, (int, float))):
        raise FxProviderError("credentials expires_at must be epoch milliseconds", code=Code.PROVIDER_NO_CREDENTIALS)
    return creds


async def call_back(fn: Callable[..., object], *args: object) -> object:
    """Calls an application callback: a coroutine function is awaited, a plain one runs in
    a thread (its result awaited when it is awaitable)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        result = await result
    return result


class CredentialSource:
    """The credentials of one provider for one session (see the module docstring)."""

    def __init__(
        self,
        provider: str,
        *,
        credentials: CredentialsFn,
        on_credentials: OnCredentialsFn | None = None,
        refresh_lock: RefreshLockFn | None = None,
        refresh: Refresher | None = None,
        headers: HeaderFn = bearer_headers,
        session_id: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not callable(credentials):
            raise FxProviderError("credentials must be a function credentials(ctx)", code=Code.PROVIDER_NO_CREDENTIALS)
        for name, fn in (("on_credentials", on_credentials), ("refresh_lock", refresh_lock)):
            if fn is not None and not callable(fn):
                raise FxProviderError(f"{name} must be a function", code=Code.PROVIDER_INVALID)
        self.provider = provider
        self._credentials = credentials
        self._on_credentials = on_credentials
        self._refresh_lock = refresh_lock
        self._refresh = refresh
        self._headers = headers
        self.session_id = session_id
        self._clock = clock
        self._creds: Credentials | None = None
        self._seen: list[str] = []

    def __repr__(self) -> str:
        return f"<CredentialSource {self.provider} session={self.session_id} loaded={self._creds is not None}>"

    def bind(self, session_id: str | None) -> CredentialSource:
        """The same callbacks for session `session_id`, with nothing loaded yet."""
        return CredentialSource(
            self.provider, credentials=self._credentials, on_credentials=self._on_credentials,
            refresh_lock=self._refresh_lock, refresh=self._refresh, headers=self._headers,
            session_id=session_id, clock=self._clock,
        )

    @property
    def ctx(self) -> dict[str, object]:
        """What the callbacks are called with."""
        return {"provider": self.provider, "session_id": self.session_id}

    @property
    def refreshable(self) -> bool:
        return self._refresh is not None

    def secrets(self) -> list[str]:
        """Every token this source has held, for masking errors."""
        return list(self._seen)

    def _remember(self, creds: Credentials) -> Credentials:
        for key in ("access_token", "refresh_token", "id_token"):
            value = creds.get(key)
            if isinstance(value, str) and value and value not in self._seen:
                self._seen.append(value)
        return creds

    def expiring(self, creds: Credentials) -> bool:
        """Whether `creds` expire within `REFRESH_MARGIN_S` (never, without `expires_at`)."""
        expires_at = creds.get("expires_at")
        # `check_credentials` lets only a number through (a refresh sets one too).
        return isinstance(expires_at, (int, float)) and expires_at / 1000.0 - self._clock() <= REFRESH_MARGIN_S

    async def load(self) -> Credentials:
        """Calls `credentials(ctx)`.

        Raises:
            FxProviderError: `FX_PROVIDER_NO_CREDENTIALS` when it gives none or raises
                (the callback's message is not repeated: it may hold a secret).
        """
        try:
            value = await call_back(self._credentials, self.ctx)
        except FxProviderError:
            raise
        except Exception as exc:  # noqa: BLE001 - the application's callback failed
            raise FxProviderError(f"credentials() raised {type(exc).__name__}",
                                  code=Code.PROVIDER_NO_CREDENTIALS) from None
        return self._remember(check_credentials(value, self.provider))

    async def headers(self, client: httpx.AsyncClient) -> dict[str, str]:
        """The credential headers of the next request, refreshing first when they expire."""
        if self._creds is None:
            self._creds = await self.load()
        if self.refreshable and self.expiring(self._creds):
            self._creds = await self._shared_refresh(client, self._creds)
        return self._headers(self._creds)

    async def refresh_rejected(self, client: httpx.AsyncClient) -> None:
        """Refreshes after the provider rejected the current credentials.

        Raises:
            FxProviderError: `FX_PROVIDER_AUTH` when the refresh fails.
        """
        stale = self._creds if self._creds is not None else await self.load()
        self._creds = await self._shared_refresh(client, stale)

    async def _shared_refresh(self, client: httpx.AsyncClient, stale: Credentials) -> Credentials:
        loop = asyncio.get_running_loop()
        key = (id(loop), self.provider, str(stale.get("refresh_token") or stale["access_token"]))
        future = _inflight.get(key)
        if future is None:
            future = loop.create_task(self._refresh_once(client, stale))
            _inflight[key] = future

            def done(f: asyncio.Future[Credentials]) -> None:
                if _inflight.get(key) is f:
                    del _inflight[key]
                if not f.cancelled():
                    f.exception()  # retrieved here; each waiter sees it through the shield

            future.add_done_callback(done)
        fresh = await asyncio.shield(future)
        return self._remember(fresh)

    async def _refresh_once(self, client: httpx.AsyncClient, stale: Credentials) -> Credentials:
        async def refresh() -> Credentials:
            latest = await self.load()
            if latest["access_token"] != stale["access_token"] and not self.expiring(latest):
                return latest  # another server refreshed and saved them already
            if self._refresh is None:
                raise FxProviderError(f"provider {self.provider} credentials cannot be refreshed",
                                      code=Code.PROVIDER_AUTH)
            fresh = self._remember(await self._refresh(client, latest))
            if self._on_credentials is not None:
                await call_back(self._on_credentials, dict(fresh), self.ctx)
            return fresh

        if self._refresh_lock is None:
            return await refresh()
        ctx = {**self.ctx, "account_id": stale.get("account_id")}
        result = self._refresh_lock(ctx, refresh)
        if inspect.isawaitable(result):
            return await result
        return cast(Credentials, result)  # a lock that ran `fn` to its end and gave its result
