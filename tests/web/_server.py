"""A web process for tests: `fx web` (or `fx dev`) as a child process on a free loopback port.

Readiness is polled on `/healthz` with a bound; the log is kept for failure messages.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from tests.support.redis_server import free_port
from tests.support.workers import terminate, wait_until

ROOT = Path(__file__).resolve().parents[2]
FX = str(Path(sys.executable).parent / "fx")


class WebProcess:
    """One `fx <command>` child serving HTTP on 127.0.0.1:<port>."""

    def __init__(self, command: str = "web", *, env: dict[str, str], args: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("FX_") and k not in ("REDIS_URL", "AI_GATEWAY_API_KEY")}
        # With no store URL, the in-memory store unless the test names a data directory (a
        # local store in the checkout would outlive the test).
        self.env = {**base, "PYTHONPATH": str(ROOT), "FX_LOG_LEVEL": "WARNING", "FX_DATA_DIR": ":memory:", **env}
        self.log_path = Path(tempfile.mkstemp(prefix=f"fx-{command}-", suffix=".log")[1])
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [FX, command, "--port", str(self.port), *args], env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

    def __repr__(self) -> str:
        return f"<WebProcess {self.url} pid={self.proc.pid}>"

    def wait_ready(self, timeout_s: float = 30.0) -> WebProcess:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"web process exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                return httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout_s, interval_s=0.05, what=f"{self} ready")
        return self

    def log_tail(self, n_chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n_chars:]

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def close(self) -> None:
        terminate(self.proc, 10)
        self.log_path.unlink(missing_ok=True)
