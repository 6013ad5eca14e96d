"""The `FX_AGENTS` module of the benches' worker processes.

The agents of `tests.durable.agents` (`default` on the scripted model at
`FX_TEST_MODEL_URL`, tool `lookup`), plus what only a bench needs inside a worker:

- the Celery task ``fxbench.noop``: pushes the time it ran to the Redis list it is given,
  so the client times a Celery round trip of a task that does nothing (the floor of any
  Celery-driven design) against the same broker and worker as the turns;
- the Celery task ``fxbench.floor_turn``: the least a durable, Celery-woken turn does, on
  the worker's process loop as a wake is: one Lua call to take a lease, the model request
  (aiohttp, one pooled session, the streamed reply read to its end), one Lua call to store
  the reply and an end line, one to let the lease go, which also pushes to the list it is
  given. The worker CPU of a real turn is measured against it (bench/e2e.py);
- ``fxbench.floor_turn_sync``: the same four steps in the task's own thread, without the
  loop: blocking redis-py and urllib3 (a turn cannot stream this way at scale, a thread
  per running turn; it shows what the hop to the loop costs);
- with ``FX_BENCH_COUNT_FILE`` set, a count of this process's Redis round trips (socket
  writes: one per command, one per pipeline), asyncio clients (the store, the sweeper)
  apart from blocking ones (the Celery broker), written to that file every 50 ms as
  ``{"async": n, "sync": n}``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import aiohttp
import redis
import redis.asyncio
import urllib3

from bench._harness import count_round_trips
from fxworker.celery_app import app
from fxworker.tasks import process_loop
from tests.durable.agents import AGENTS  # noqa: F401 - the agents this module exports


def _write_counts(path: str) -> None:
    """Writes this process's round-trip counts to `path` every 50 ms, for the bench to read."""
    sends = count_round_trips()

    def write() -> None:
        while True:
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump(sends, f)
            os.replace(tmp, path)
            time.sleep(0.05)

    threading.Thread(target=write, name="fxbench-count", daemon=True).start()


if os.environ.get("FX_BENCH_COUNT_FILE"):
    _write_counts(os.environ["FX_BENCH_COUNT_FILE"])

_noop_client: redis.Redis | None = None


@app.task(name="fxbench.noop", ignore_result=True)
def noop(key: str) -> None:
    """Does nothing but say it ran: pushes its start time (epoch s) to `key`."""
    global _noop_client
    ran = time.time()
    if _noop_client is None:
        _noop_client = redis.Redis.from_url(os.environ["REDIS_URL"])
    _noop_client.rpush(key, repr(ran))


# ---------------------------------------------------------------------------- the floor turn

_FLOOR_CLAIM = "redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'epoch', 1); return redis.call('XRANGE', KEYS[2], '-', '+')"
_FLOOR_RECORD = ("redis.call('XADD', KEYS[1], '*', 'd', ARGV[1]); "
                 "return redis.call('XADD', KEYS[2], '*', 'l', ARGV[2])")
_FLOOR_RELEASE = "redis.call('HDEL', KEYS[1], 'holder'); return redis.call('RPUSH', KEYS[2], ARGV[1])"


class _FloorParts:
    """What both floor turns share: the three scripts on `client` (blocking or asyncio),
    the model's URL, a session's keys, the request body, a stream line's text and what
    the record stores."""

    def __init__(self, client: Any) -> None:
        self.claim = client.register_script(_FLOOR_CLAIM)
        self.record = client.register_script(_FLOOR_RECORD)
        self.release = client.register_script(_FLOOR_RELEASE)
        self.url = os.environ["FX_TEST_MODEL_URL"].rstrip("/") + "/chat/completions"

    @staticmethod
    def keys(session: str) -> list[str]:
        return [f"{session}:meta", f"{session}:log", f"{session}:lines"]

    @staticmethod
    def body(prompt: str) -> dict[str, Any]:
        return {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": prompt}]}

    @staticmethod
    def texts(line: bytes) -> list[str]:
        """The text deltas of one line of the model's stream."""
        if not line.startswith(b"data: {"):
            return []
        return [(choice.get("delta") or {}).get("content") or "" for choice in json.loads(line[6:]).get("choices") or ()]

    @staticmethod
    def stored(reply: str) -> list[str]:
        return [json.dumps({"role": "assistant", "content": reply}), json.dumps({"type": "turn_end", "text": reply})]


class _Floor(_FloorParts):
    """The floor turn's clients, built on the process loop at its first use."""

    def __init__(self) -> None:
        self.redis = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"], max_connections=100)
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
        super().__init__(self.redis)

    async def turn(self, session: str, prompt: str, done_key: str) -> None:
        keys = self.keys(session)
        await self.claim(keys=keys[:2], args=["holder"])
        text: list[str] = []
        async with self.http.post(self.url, json=self.body(prompt)) as response:
            async for line in response.content:
                text += self.texts(line)
        reply = "".join(text)
        await self.record(keys=keys[1:], args=self.stored(reply))
        await self.release(keys=[keys[0], done_key], args=[reply])


_floor: _Floor | None = None


async def _floor_turn(session: str, prompt: str, done_key: str) -> None:
    global _floor
    if _floor is None:
        _floor = _Floor()
    await _floor.turn(session, prompt, done_key)


@app.task(name="fxbench.floor_turn", ignore_result=True)
def floor_turn(session: str, prompt: str, done_key: str) -> None:
    """The floor turn (see the module docstring), run on the process loop like a wake."""
    process_loop().run(_floor_turn(session, prompt, done_key))


class _SyncFloor(_FloorParts):
    """The floor turn's blocking clients, shared by the task threads."""

    def __init__(self) -> None:
        self.redis = redis.Redis.from_url(os.environ["REDIS_URL"], max_connections=200)
        self.http = urllib3.PoolManager(maxsize=200)
        super().__init__(self.redis)

    def turn(self, session: str, prompt: str, done_key: str) -> None:
        keys = self.keys(session)
        self.claim(keys=keys[:2], args=["holder"])
        text: list[str] = []
        response = self.http.request("POST", self.url, body=json.dumps(self.body(prompt)),
                                     headers={"Content-Type": "application/json"}, preload_content=False)
        try:
            for line in response:
                text += self.texts(line)
        finally:
            response.release_conn()
        reply = "".join(text)
        self.record(keys=keys[1:], args=self.stored(reply))
        self.release(keys=[keys[0], done_key], args=[reply])


_sync_floor: _SyncFloor | None = None
_sync_floor_lock = threading.Lock()


@app.task(name="fxbench.floor_turn_sync", ignore_result=True)
def floor_turn_sync(session: str, prompt: str, done_key: str) -> None:
    """The floor turn in the task's thread (see the module docstring)."""
    global _sync_floor
    with _sync_floor_lock:
        if _sync_floor is None:
            _sync_floor = _SyncFloor()
    _sync_floor.turn(session, prompt, done_key)
