"""An ASGI app served by uvicorn in a thread of the test process, on a free loopback port."""

from __future__ import annotations

import threading
from typing import Any

import uvicorn

from tests.support.redis_server import free_port
from tests.support.workers import wait_until


class ThreadServer:
    """`with ThreadServer(app) as url:` serves `app` until the block ends."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), 15.0, what="uvicorn started")
        assert self.server.started, "uvicorn did not start"
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
