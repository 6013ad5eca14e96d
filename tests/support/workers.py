"""Real Celery worker processes for tests: start, wait until ready, signal, stop.

Each worker is `celery -A fxworker.celery_app worker -P threads -c N -Q fx.<names>` in a
child process whose environment points it at the test Redis and a test prefix. Readiness
is an event, not a sleep: the worker writes a marker into Redis from its `worker_ready`
signal (`fxworker.sweeper.mark_worker_ready`), and `wait_ready()` polls for it, bounded.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from fxworker.keys import queue_name

ROOT = Path(__file__).resolve().parents[2]
_seq = itertools.count(1)


def wait_until(cond: Callable[[], object], timeout_s: float, *, interval_s: float = 0.02, what: str = "") -> object:
    """Polls `cond` until it returns something truthy; raises TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what or cond}")
        time.sleep(interval_s)


def terminate(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """SIGTERM (a warm shutdown, a deploy's stop), then SIGKILL if `proc` does not exit
    within `timeout_s`; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


class CeleryWorker:
    """One Celery worker child process on the test Redis."""

    def __init__(
        self,
        *,
        redis_url: str,
        prefix: str,
        queues: Iterable[str] = ("default", "a", "b"),
        agents: Iterable[str] | None = None,
        concurrency: int = 8,
        env: dict[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.queues = list(queues)
        self.agents = None if agents is None else list(agents)
        self.concurrency = concurrency
        self.extra_env = dict(env or {})
        self.name = name or f"w{next(_seq)}-{os.getpid()}"
        self.hostname = f"{self.name}@fxtest"
        self.log_path = Path(tempfile.mkstemp(prefix=f"fx-{self.name}-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<CeleryWorker {self.hostname} pid={self.pid} queues={self.queues}>"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FX_")}
        env.update(
            REDIS_URL=self.redis_url,
            FX_PREFIX=self.prefix,
            FX_AGENTS="tests.durable.agents",
            FX_LEASE_S="3",
            FX_DELIVERY_TIMEOUT_S="120",
            FX_RESERVE_S="4",
            FX_SWEEP_S="1",
            FX_NO_AGENT_RETRY_S="0.5",
            FX_WORKER_CONCURRENCY=str(self.concurrency),
            FX_LOG_LEVEL="INFO",
            PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        if self.agents is not None:
            env["FX_TEST_AGENTS"] = ",".join(self.agents)
        env.update(self.extra_env)
        return env

    def start(self, *, wait: bool = True, timeout_s: float = 30.0) -> CeleryWorker:
        cmd = [
            sys.executable, "-m", "celery", "-A", "fxworker.celery_app", "worker",
            "-P", "threads", "-c", str(self.concurrency),
            "-Q", ",".join(queue_name(q) for q in self.queues),
            "-n", self.hostname, "-l", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, env=self.environment(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        if wait:
            self.wait_ready(timeout_s)
        return self

    def ready_key(self) -> str:
        return f"{self.prefix}:workers:{self.hostname}"

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        from fxworker.store import store_clients

        # The worker marks itself ready in the store: FX_STORE_URL when given, else REDIS_URL.
        client = store_clients(self.extra_env.get("FX_STORE_URL") or self.redis_url, max_connections=1)[1]()
        try:
            def ready() -> bool:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"worker {self.hostname} exited: {self.log_tail()}")
                return client.get(self.ready_key()) == str(self.pid).encode()

            wait_until(ready, timeout_s, interval_s=0.05, what=f"worker {self.hostname} ready")
        finally:
            client.close()

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """kill -9: the process dies at once, nothing is released."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, *, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (warm shutdown), then SIGKILL if it does not exit in time."""
        return terminate(self.proc, timeout_s) if self.proc is not None else None

    def close(self) -> None:
        self.kill()
        try:
            self.log_path.unlink()
        except OSError:
            pass


class Workers:
    """A set of workers stopped together (fixtures yield one)."""

    def __init__(self, *, redis_url: str, prefix: str, **defaults: object) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.defaults = defaults
        self.started: list[CeleryWorker] = []

    def start(self, **kwargs: object) -> CeleryWorker:
        options = {**self.defaults, **kwargs}
        worker = CeleryWorker(redis_url=self.redis_url, prefix=self.prefix, **options)  # type: ignore[arg-type]
        self.started.append(worker)
        return worker.start()

    def close(self) -> None:
        for worker in self.started:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        for worker in self.started:
            if worker.proc is not None:
                try:
                    worker.proc.wait(15)
                except subprocess.TimeoutExpired:
                    worker.proc.kill()
                    worker.proc.wait(10)
            worker.close()
