"""The `FX_AGENTS` module of the benches' worker processes.

The agents of `tests.durable.agents` (`default` on the scripted model at
`FX_TEST_MODEL_URL`, tool `lookup`), plus two things only a bench needs inside a worker:

- the Celery task ``fxbench.noop``: pushes the time it ran to the Redis list it is given,
  so the client times a Celery round trip of a task that does nothing (the floor of any
  Celery-driven design) against the same broker and worker as the turns;
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

import redis

from bench._harness import count_round_trips
from fxworker.celery_app import app
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
