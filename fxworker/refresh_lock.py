"""`redis_refresh_lock(client)`: the `refresh_lock` that lets servers take turns refreshing.

    agent = Agent("support", provider="codex", model="gpt-5-codex",
                  credentials=load, on_credentials=save,
                  refresh_lock=redis_refresh_lock(redis.asyncio.from_url(url)))

Two servers can notice the same expiring credentials at once; the provider accepts only
the first refresh. The lock is a Redis key per account (``SET NX PX``, released by a
compare-and-delete of this holder's token); the engine calls `credentials()` again
inside it and uses what another server already saved (`fxengine.providers.auth`).

The key is `prefix` + a hash of the provider and the account (the session when the
credentials name no account): no account id or credential is written to Redis.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar

from fxengine.codes import Code
from fxengine.errors import FxProviderError

DEFAULT_PREFIX = "fx:refresh:"
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

T = TypeVar("T")


class RefreshLock(Protocol):
    """`refresh_lock(ctx, fn)`: awaits `fn()` while holding the lock on `ctx`'s account."""

    def __call__(self, ctx: Mapping[str, object], fn: Callable[[], Awaitable[T]], /) -> Awaitable[T]: ...


class LockClient(Protocol):
    """The two calls the lock makes, on a `redis.asyncio.Redis` (awaitable answers) or a
    blocking `redis.Redis`."""

    def set(self, name: str, value: str, *, nx: bool, px: int) -> object: ...

    def eval(self, script: str, numkeys: int, *keys_and_args: str) -> object: ...


async def _call(result: object) -> object:
    """The value of a Redis call from an asyncio client (awaited) or a blocking one."""
    return await result if inspect.isawaitable(result) else result


def lock_key(ctx: Mapping[str, object], prefix: str = DEFAULT_PREFIX) -> str:
    """The Redis key of the lock on `ctx`'s account."""
    subject = ctx.get("account_id") or f"session:{ctx.get('session_id')}"
    digest = hashlib.sha256(f"{ctx.get('provider')}\0{subject}".encode()).hexdigest()[:32]
    return f"{prefix}{digest}"


def redis_refresh_lock(
    client: LockClient,
    *,
    prefix: str = DEFAULT_PREFIX,
    ttl_s: float = 30.0,
    wait_s: float = 30.0,
    poll_s: float = 0.05,
) -> RefreshLock:
    """A `refresh_lock(ctx, fn)` on Redis.

    Args:
        client: a `redis.asyncio.Redis` (or a blocking `redis.Redis`, whose short calls
            then run on the loop).
        prefix: the lock keys' prefix.
        ttl_s: how long a lock outlives a holder that died while refreshing.
        wait_s: how long to wait for another holder before giving up.
        poll_s: how often a waiter tries the lock again.

    Raises (from the returned function):
        FxProviderError: `FX_PROVIDER_REFRESH_LOCK` when the lock stays taken `wait_s`.
    """

    async def refresh_lock(ctx: Mapping[str, object], fn: Callable[[], Awaitable[T]]) -> T:
        key = lock_key(ctx, prefix)
        token = secrets.token_hex(16)
        deadline = time.monotonic() + wait_s
        while not await _call(client.set(key, token, nx=True, px=max(1, int(ttl_s * 1000)))):
            if time.monotonic() >= deadline:
                raise FxProviderError(f"the {ctx.get('provider')} refresh lock stayed taken for {wait_s:g} s",
                                      code=Code.PROVIDER_REFRESH_LOCK)
            await asyncio.sleep(poll_s)
        try:
            return await fn()
        finally:
            await _call(client.eval(_RELEASE, 1, key, token))

    return refresh_lock
