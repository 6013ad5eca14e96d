"""Redis closing every client connection (`CLIENT KILL TYPE normal`: a restart, a failover,
an idle `timeout`) costs no caller a 503: the pool notices a closed connection before it
hands it out, and a read that still meets one runs again on a fresh connection.

Each test runs its own redis-server, since it kills every connection on it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import httpx
import pytest
import redis

from fxworker.agent import Agent
from fxworker.settings import Settings
from fxworker.store import redis_store
from fxworker.web import create_app
from tests.support.redis_server import RedisServer
from tests.web._inprocess import ThreadServer
from tests.web.test_refusals import PROVIDER, NoWake

pytestmark = [pytest.mark.redis]

BURST = 120


def kill_clients(url: str) -> int:
    admin = redis.Redis.from_url(url)
    try:
        # The admin connection is of type normal too: it is killed last, after it answered.
        return int(admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
    finally:
        admin.close()


async def burst(url: str, paths: list[str]) -> Counter[int]:
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST)
    async with httpx.AsyncClient(base_url=url, timeout=20.0, limits=limits) as client:
        responses = await asyncio.gather(*(client.get(path) for path in paths))
    return Counter(response.status_code for response in responses)


def test_a_burst_after_redis_dropped_every_connection_gets_no_503(own_redis: RedisServer) -> None:
    prefix = f"fxd{uuid.uuid4().hex[:8]}"
    agent = Agent(f"drops-{uuid.uuid4().hex[:6]}", model="scripted", provider=PROVIDER,
                  store=redis_store(own_redis.url, prefix=prefix), waker=NoWake())
    try:
        app = create_app(agents={"default": agent}, settings=Settings(redis_url=own_redis.url, prefix=prefix))
        with ThreadServer(app) as url, httpx.Client(base_url=url, timeout=10.0) as client:
            sids = [client.post("/v1/sessions", json={"input": f"hi {i}"}).json()["sessionId"] for i in range(4)]
            paths = [p for sid in sids for p in (f"/v1/sessions/{sid}", f"/v1/sessions/{sid}/stream?follow=0")]
            paths = (paths * BURST)[:BURST - 8] + ["/healthz"] * 4 + ["/v1/sessions"] * 4
            # Fill the pools: many connections open at once, then idle in the pool.
            assert asyncio.run(burst(url, paths)) == Counter({200: BURST})
            killed = kill_clients(own_redis.url)
            assert killed >= 20, killed
            after = asyncio.run(burst(url, paths))
            assert after == Counter({200: BURST}), after
            assert client.get("/healthz").status_code == 200
            # Writes are not retried, but find live connections too.
            kill_clients(own_redis.url)
            prompts = [client.post(f"/v1/sessions/{sid}/prompts", json={"input": "again"}) for sid in sids]
            assert [p.status_code for p in prompts] == [202] * len(sids), [p.text for p in prompts]
    finally:
        agent.close()


def test_store_reads_survive_dropped_connections_and_writes_are_not_repeated(own_redis: RedisServer) -> None:
    async def main() -> None:
        store = redis_store(own_redis.url, prefix=f"fxd{uuid.uuid4().hex[:8]}")
        sid = "fxs_01JZZZZZZZZZZZZZZZZZZZZZZZ"
        await store.accept(sid, agent="default", message_id="m-1", input="hi")
        await asyncio.gather(*(store.state(sid) for _ in range(40)))
        # Killed with no await between: the pool has not seen the close when the reads start.
        kill_clients(own_redis.url)
        results = await asyncio.gather(*(store.state(sid) for _ in range(40)), *(store.read_lines(sid, 0) for _ in range(40)),
                                       return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == []
        # A write that met a dead connection is never run twice: one accept, one inbox entry.
        kill_clients(own_redis.url)
        await asyncio.sleep(0.05)  # the loop sees the closes, as it does between two requests
        accepted = await store.accept(sid, agent="default", message_id="m-2", input="again")
        assert accepted.repeated is False
        assert (await store.state(sid)).pending == 2
        await store.aclose()

    asyncio.run(main())
