"""Web and worker processes of either tree (`previous.Tree`), on one Redis and one prefix.

Both trees' processes start the same way, as a deployment starts them: `python -m fxworker
web` and `celery -A fxworker.celery_app worker -P threads`, with the tree as working
directory and first on the path. Readiness is an event: the worker's ready mark
(`CeleryWorker.wait_ready`, the same key in both releases), the web's `/healthz`.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from fxworker.keys import queue_name
from tests.support.redis_server import free_port
from tests.support.workers import CeleryWorker, terminate, wait_until
from tests.upgrade.previous import Tree

# What a log line of trouble looks like in either release's logs (Celery's and ours).
TROUBLE = re.compile(r"Traceback|ERROR|CRITICAL|FX_[A-Z_]+")
_names = itertools.count(1)


class TreeWorker(CeleryWorker):
    """A Celery worker of `tree` (`-Q fx.default` unless `queues` names others, the agents of
    its environment's `FX_AGENTS`)."""

    def __init__(self, tree: Tree, *, redis_url: str, prefix: str, env: dict[str, str], concurrency: int = 8,
                 queues: tuple[str, ...] = ("default",)) -> None:
        super().__init__(redis_url=redis_url, prefix=prefix, queues=queues, env=env, concurrency=concurrency,
                         name=f"{tree.label}{next(_names)}")
        self.tree = tree

    def __repr__(self) -> str:
        return f"<TreeWorker {self.tree.label} {self.hostname} pid={self.pid}>"

    def environment(self) -> dict[str, str]:
        return self.tree.environment(super().environment())

    def start(self, *, wait: bool = True, timeout_s: float = 60.0) -> TreeWorker:
        cmd = [
            sys.executable, "-m", "celery", "-A", "fxworker.celery_app", "worker",
            "-P", "threads", "-c", str(self.concurrency), "-Q", ",".join(queue_name(q) for q in self.queues),
            "-n", self.hostname, "-l", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.environment(), cwd=self.tree.root, stdout=log,
                                         stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(timeout_s)
        return self


class TreeWeb:
    """`python -m fxworker web` of `tree` on a free loopback port."""

    def __init__(self, tree: Tree, *, env: dict[str, str]) -> None:
        self.tree = tree
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.label = f"{tree.label} web"
        self.log_path = Path(tempfile.mkstemp(prefix=f"fx-{tree.label}-web-", suffix=".log")[1])
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fxworker", "web", "--host", "127.0.0.1", "--port", str(self.port)],
                env=tree.environment(env), cwd=tree.root, stdout=log, stderr=subprocess.STDOUT)

    def __repr__(self) -> str:
        return f"<TreeWeb {self.tree.label} {self.url} pid={self.proc.pid}>"

    def wait_ready(self, timeout_s: float = 60.0) -> TreeWeb:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self!r} exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                return httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout_s, interval_s=0.05, what=f"{self!r} ready")
        return self

    def log_tail(self, n_chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n_chars:]

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (a deploy's stop), then SIGKILL if it does not exit in time."""
        return terminate(self.proc, timeout_s)

    def close(self) -> None:
        self.stop()
        self.log_path.unlink(missing_ok=True)


def trouble(log_path: Path, limit: int = 20) -> list[str]:
    """The log's lines that look like trouble (tracebacks, errors, error codes), at most `limit`."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:400] for line in lines if TROUBLE.search(line)][:limit]


def wait_for(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    """`check()`'s first truthy answer, asked every 50 ms; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def state(web: TreeWeb, session_id: str) -> dict[str, Any]:
    """A session's state, as `web` answers it."""
    answer = httpx.get(f"{web.url}/v1/sessions/{session_id}", timeout=10)
    answer.raise_for_status()
    found: dict[str, Any] = answer.json()
    return found


def lines(web: TreeWeb, session_id: str) -> list[dict[str, Any]]:
    """A session's stored lines from cursor 0, as `web` serves them."""
    answer = httpx.get(f"{web.url}/v1/sessions/{session_id}/stream", params={"cursor": 0, "follow": "0"}, timeout=10)
    answer.raise_for_status()
    return [json.loads(raw) for raw in answer.text.splitlines() if raw.strip()]
