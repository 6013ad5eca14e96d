"""bench/backlog.py's client: accepts one prompt in each of N new sessions, no worker running.

Run as a child process whose `fxworker` is the tree on its ``PYTHONPATH`` (this tree, or
the worktree of the commit bench/backlog.py compares with), so each side stores its
inputs and sends its wakes with its own code: `Agent("default").blocking_session()
.prompt()` with a `CeleryWaker` on the same Redis and prefix, one after another. Prints
one JSON line: ``{"sessions": [ids], "accept_s": seconds}``.

    python bench/_backlog_accept.py REDIS_URL PREFIX SESSIONS PROMPT
"""

from __future__ import annotations

import json
import sys
import time

from fxworker import Agent, Settings
from fxworker.celery_app import make_celery_app
from fxworker.store import redis_store
from fxworker.wakers import CeleryWaker
from tests.durable.tooling import provider, tools


def accept(redis_url: str, prefix: str, sessions: int, prompt: str) -> dict[str, object]:
    settings = Settings(redis_url=redis_url, prefix=prefix)
    agent = Agent(
        "default", model="scripted", provider=provider(), tools=tools(), api_key="test-key",
        store=redis_store(settings.store_url, prefix=prefix), waker=CeleryWaker(make_celery_app(settings)),
        settings=settings,
    )
    ids = []
    started = time.monotonic()
    try:
        for _ in range(sessions):
            session = agent.blocking_session()
            session.prompt(prompt)
            ids.append(session.id)
    finally:
        agent.close()
    return {"sessions": ids, "accept_s": time.monotonic() - started}


if __name__ == "__main__":
    url, prefix, n, text = sys.argv[1:5]
    print(json.dumps(accept(url, prefix, int(n), text)), flush=True)
