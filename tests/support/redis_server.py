"""Throwaway `redis-server` processes on free loopback ports.

The suite never assumes it owns a Redis it did not start: it starts its own (no disk
persistence unless asked) and stops it at the end. Fault tests start one of their own so
they can kill or restart it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


class RedisServer:
    """One `redis-server` child process; `restart()` keeps its port (and its data if `appendonly`)."""

    def __init__(self, *, port: int | None = None, args: tuple[str, ...] = (), appendonly: bool = False) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError(
                "redis-server not found: install it (Debian/Ubuntu: apt-get install redis-server; "
                "macOS: brew install redis) or set FX_TEST_REDIS_URL"
            )
        self.binary = binary
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="fx-redis-"))
        self.args = args
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def __repr__(self) -> str:
        return f"<RedisServer port={self.port} pid={self.proc.pid if self.proc else None}>"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        cmd = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--save", "", "--appendonly", "yes" if self.appendonly else "no",
            "--daemonize", "no", "--logfile", str(self.dir / "redis.log"), *self.args,
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.exceptions.RedisError:
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"redis-server exited: {(self.dir / 'redis.log').read_text()[-2000:]}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server on port {self.port} did not answer in {timeout_s}s")
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop(kill=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def delete_prefix(url: str, prefix: str) -> None:
    """Deletes every key of the server at `url` that contains `prefix` (a test's own keys)."""
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"*{prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()


def external_redis_url() -> str | None:
    return os.environ.get("FX_TEST_REDIS_URL") or None


@pytest.fixture(scope="module", name="redis_server")
def module_redis_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A `redis-server` of the test module's own, started with the module's `PRIVATE_REDIS`
    (`RedisServer` keyword arguments): for a module that restarts or squeezes its Redis.
    Import it with `module_redis_url` to override the suite's Redis for that module."""
    server = RedisServer(**getattr(request.module, "PRIVATE_REDIS", {}))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module", name="redis_url")
def module_redis_url(redis_server: RedisServer) -> str:
    """The module's own Redis (`module_redis_server`) in place of the suite's."""
    return redis_server.url
