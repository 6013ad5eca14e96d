"""Two OS processes refreshing one account with `redis_refresh_lock`: one refresh reaches
the provider, and the other process uses what the first saved."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

from fxworker import redis_refresh_lock
from tests.providers.fakes import FakePlan

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_two_processes_refresh_one_account_once(plan: FakePlan, redis_url: str, key_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    creds = plan.seed_credentials(expires_in_s=5)  # inside the refresh margin: both servers refresh
    client.set(f"{key_prefix}:creds", json.dumps(creds))
    plan.hold_refresh = threading.Event()  # the first refresh waits until both servers loaded

    children = [
        subprocess.Popen([sys.executable, "-m", "tests.providers._refresh_child", redis_url, key_prefix, plan.url, sid],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for sid in ("s-a", "s-b")
    ]
    try:
        # Both processes hold the expiring credentials and one is at the token endpoint:
        # without the lock the other would now refresh with the same refresh token.
        _wait_for(lambda: all(client.get(f"{key_prefix}:loads:{sid}") for sid in ("s-a", "s-b")), "both loads")
        _wait_for(lambda: plan.refreshes >= 1, "the first refresh")
        plan.hold_refresh.set()
        outputs = [child.communicate(timeout=60) for child in children]
    finally:
        plan.hold_refresh.set()
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=10)

    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {"stop": "end_turn", "error": None}, err
    assert plan.refreshes == 1
    saved = json.loads(client.get(f"{key_prefix}:creds"))
    assert saved["access_token"] == plan.issued[-1]["access_token"] != creds["access_token"]
    assert {c["token"] for c in plan.api_calls} == {saved["access_token"]}
    assert client.keys(f"{key_prefix}:lock:*") == []  # released


async def test_the_lock_gives_up_after_wait_s_and_names_no_account(redis_url: str, key_prefix: str) -> None:
    import pytest
    import redis.asyncio

    from fxengine.errors import FxProviderError
    from fxworker.refresh_lock import lock_key

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        lock = redis_refresh_lock(client, prefix=f"{key_prefix}:lock:", wait_s=0.2)
        ctx = {"provider": "grok", "session_id": "s-1", "account_id": "acct-secret-name"}
        key = lock_key(ctx, f"{key_prefix}:lock:")
        assert "acct-secret-name" not in key
        ran: list[str] = []

        async def refresh() -> str:
            ran.append("refresh")
            assert await client.get(key) is not None  # held while it runs
            return "fresh"

        assert await lock(ctx, refresh) == "fresh"
        assert await client.get(key) is None  # released

        await client.set(key, "another-holder", px=60_000)
        with pytest.raises(FxProviderError) as info:
            await lock(ctx, refresh)
        assert info.value.code == "FX_PROVIDER_REFRESH_LOCK"
        assert ran == ["refresh"]
        assert await client.get(key) == b"another-holder"  # not released by the one that waited
    finally:
        await client.aclose()
