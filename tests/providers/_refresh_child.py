"""One server of the two-process refresh test: runs a Grok turn whose credentials live in
Redis and are about to expire, taking turns to refresh with `fxworker.redis_refresh_lock`.

    python -m tests.providers._refresh_child REDIS_URL PREFIX PLAN_URL SESSION_ID

Prints ``{"stop": ..., "error": ...}`` as its last line.
"""

from __future__ import annotations

import asyncio
import json
import sys

import redis
import redis.asyncio

from fxengine import create_engine
from fxengine.providers import grok
from fxworker import redis_refresh_lock


async def main(redis_url: str, prefix: str, plan_url: str, session_id: str) -> None:
    store = redis.Redis.from_url(redis_url)

    def load(ctx: dict) -> dict:
        store.incr(f"{prefix}:loads:{ctx['session_id']}")
        return json.loads(store.get(f"{prefix}:creds"))

    def save(creds: dict, ctx: dict) -> None:
        store.set(f"{prefix}:creds", json.dumps(creds))

    lock_client = redis.asyncio.Redis.from_url(redis_url)
    provider = grok.provider(
        credentials=load, on_credentials=save,
        refresh_lock=redis_refresh_lock(lock_client, prefix=f"{prefix}:lock:", wait_s=30),
        oauth_config=grok.config(client_id="test-client", issuer=plan_url), base_url=f"{plan_url}/v1",
    )
    engine = await create_engine("grok-4", provider=provider, session_id=session_id)
    try:
        result = await engine.prompt("hi").result()
    finally:
        await engine.close()
        await lock_client.aclose()
    print(json.dumps({"stop": result.stop_reason, "error": result.error}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
